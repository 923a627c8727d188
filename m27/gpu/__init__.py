"""GPU backends: one small interface, NVML on a real node and a simulator everywhere else.

The agent, the exporter and ``m27 gpus`` only see :class:`GpuBackend`. A backend reports
what it knows and ``None`` for what it does not (a field the GPU does not support, a call
that failed): a number is never made up, and an NVML error never crashes the caller.

``detect()`` chooses the backend from ``M27_GPUS``:

- ``sim:4`` or ``sim:4x80GiB``: four simulated GPUs (of 80 GiB each);
- ``nvml``: NVML, and an error if it does not initialise;
- unset, empty or ``auto``: NVML when it initialises with at least one GPU, otherwise
  two simulated GPUs, with a one-line notice on stderr.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from m27._exceptions import ConfigError, GpuError
from m27.units import parse_size

__all__ = [
    "DEFAULT_SIM_GPUS",
    "DEFAULT_SIM_MEMORY",
    "THROTTLE_REASONS",
    "BackendBase",
    "GpuBackend",
    "GpuInfo",
    "GpuSample",
    "ProcessSample",
    "detect",
    "parse_gpus_env",
]

DEFAULT_SIM_GPUS = 2
DEFAULT_SIM_MEMORY = 80 * 1024**3

#: Every name a ``GpuSample.throttle_reasons`` set may hold (NVML's clock event reasons).
THROTTLE_REASONS = frozenset(
    {
        "gpu_idle",
        "applications_clocks",
        "sw_power_cap",
        "hw_slowdown",
        "sync_boost",
        "sw_thermal",
        "hw_thermal",
        "hw_power_brake",
        "display_clocks",
        "board_limit",
        "reliability",
    }
)


@dataclass(frozen=True)
class GpuInfo:
    """A GPU as found when the backend opened; ``None`` where the GPU could not say."""

    index: int
    uuid: str | None
    name: str | None
    memory_total: int | None


@dataclass(frozen=True)
class ProcessSample:
    """One process on a GPU: memory in bytes and SM utilization in percent since the last pass."""

    pid: int
    memory_used: int | None
    sm_util: float | None


@dataclass(frozen=True)
class GpuSample:
    """One GPU in one sampling pass. ``None`` means unknown; a lost GPU has only its identity.

    Units: utilization in percent (0-100), memory in bytes, temperature in °C, power in W,
    energy in J since the driver loaded, clocks in MHz.
    """

    index: int
    uuid: str | None
    name: str | None
    time: float
    lost: bool = False
    utilization_gpu: float | None = None
    utilization_memory: float | None = None
    memory_used: int | None = None
    memory_total: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    energy_j: float | None = None
    sm_clock_mhz: float | None = None
    throttle_reasons: frozenset[str] | None = None
    processes: tuple[ProcessSample, ...] = ()


@runtime_checkable
class GpuBackend(Protocol):
    """What the agent needs from the GPUs of a node.

    ``devices()`` is fixed for the backend's life (a lost GPU stays listed and is flagged
    ``lost`` in its samples). ``sample(now)`` makes one batched pass over every device and
    returns one sample per device in ``devices()`` order. ``close()`` may be called twice;
    sampling after it raises :class:`~m27.GpuError`.
    """

    kind: str

    def devices(self) -> list[GpuInfo]: ...

    def sample(self, now: float) -> list[GpuSample]: ...

    def close(self) -> None: ...


class BackendBase:
    """What NVML and the simulator share of the :class:`GpuBackend` contract: one lock
    over every pass, and no pass once ``close()`` has run. A backend gives
    :meth:`_sample_all`, its pass over every device, which runs under the lock."""

    #: how an error names the backend ("the NVML backend is closed")
    label = "GPU"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed = False

    def sample(self, now: float) -> list[GpuSample]:
        with self._lock:
            if self._closed:
                raise GpuError(f"the {self.label} backend is closed")
            return self._sample_all(now)

    def _sample_all(self, now: float) -> list[GpuSample]:
        raise NotImplementedError


#: The most simulated GPUs a node may have: as many as a step may ask for (`gpus:`), where
#: an agent's idle tick already costs ~20 % of a core; sim:99999 once made it spin.
SIM_GPUS_MAX = 1024

_SIM = re.compile(r"^sim:(\d+)(?:x(.+))?$", re.IGNORECASE)


def parse_gpus_env(value: str) -> tuple[int, int]:
    """(count, memory per GPU in bytes) from ``sim:N`` or ``sim:NxSIZE``; ConfigError otherwise."""
    match = _SIM.match(value.strip())
    if not match:
        raise ConfigError(
            f"M27_GPUS={value!r} is not understood (use sim:4, sim:4x80GiB, nvml or auto)",
            variable="M27_GPUS",
        )
    count = int(match.group(1))
    if count < 1:
        raise ConfigError(
            f"M27_GPUS={value!r}: a node needs at least one simulated GPU", variable="M27_GPUS"
        )
    if count > SIM_GPUS_MAX:
        raise ConfigError(
            f"M27_GPUS={value!r}: at most {SIM_GPUS_MAX} simulated GPUs (the most a step may "
            "ask for; the agent samples and places on every one of them each tick)",
            variable="M27_GPUS",
        )
    memory = DEFAULT_SIM_MEMORY
    if match.group(2) is not None:
        try:
            memory = parse_size(match.group(2))
        except ValueError as exc:
            raise ConfigError(f"M27_GPUS={value!r}: {exc}", variable="M27_GPUS") from exc
        if memory <= 0:  # `sim:2x0`: GPUs that could hold no step, listed as if usable
            raise ConfigError(
                f"M27_GPUS={value!r}: a simulated GPU needs some memory, e.g. sim:2x80GiB",
                variable="M27_GPUS",
            )
    return count, memory


_notice_shown = False


def _stderr_notice_once(message: str) -> None:
    global _notice_shown
    if not _notice_shown:
        _notice_shown = True
        print(message, file=sys.stderr)


def detect(
    env: Mapping[str, str] | None = None,
    *,
    notice: Callable[[str], None] | None = None,
) -> GpuBackend:
    """The backend ``M27_GPUS`` asks for (see the module docstring).

    ``notice`` receives the fallback message; by default it goes to stderr once per process,
    so a loop that re-detects does not flood the terminal.
    """
    environ = os.environ if env is None else env
    value = environ.get("M27_GPUS", "").strip()
    from m27.gpu.sim import SimBackend

    if value.lower().startswith("sim:"):
        count, memory = parse_gpus_env(value)
        return SimBackend(count, memory_total=memory)
    if value.lower() == "nvml":
        try:
            return _open_nvml()
        except GpuError as exc:
            raise GpuError(f"M27_GPUS=nvml but NVML failed: {exc}", variable="M27_GPUS") from exc
    if value not in ("", "auto"):
        parse_gpus_env(value)  # raises the ConfigError that lists the accepted forms
    try:
        backend = _open_nvml()
    except GpuError as exc:
        reason = str(exc)
    else:
        if backend.devices():
            return backend
        backend.close()
        reason = "no devices"
    (notice or _stderr_notice_once)(
        f"m27: no NVIDIA GPU found (NVML: {reason}); using {DEFAULT_SIM_GPUS} simulated GPUs"
        " (set M27_GPUS=sim:N)"
    )
    return SimBackend(DEFAULT_SIM_GPUS)


def _open_nvml() -> GpuBackend:
    try:
        from m27.gpu.nvml import NvmlBackend
    except ImportError as exc:  # nvidia-ml-py missing from this environment
        raise GpuError(f"pynvml cannot be imported: {exc}") from exc
    return NvmlBackend()
