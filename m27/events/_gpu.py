"""GPU health alerts: the agent appends them from its samples, the notifier sends them."""

from __future__ import annotations

from dataclasses import dataclass

from m27.events._base import Event, event

# --- notify: GPU health alerts (the agent appends them from its samples; the notifier
# --- turns them into Telegram messages) -------------------------------------------------


@event
@dataclass(frozen=True)
class GpuOverheated(Event):
    """A GPU's temperature reached the alert threshold (once per crossing, not per sample)."""

    gpu: int
    temperature_c: float
    threshold_c: float
    uuid: str = ""


@event
@dataclass(frozen=True)
class GpuThrottled(Event):
    """A GPU started clocking down for a reason other than idling (thermal, power, ...)."""

    gpu: int
    reasons: tuple[str, ...]
    uuid: str = ""
