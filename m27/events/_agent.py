"""Events of the node agent: leases, guests on shared GPUs, GPU facts and health alerts,
measurements."""

from __future__ import annotations

from dataclasses import dataclass

from m27.events._base import Event, StepEvent, event
from m27.events._step import StepDemand

# --- leases and the agent ---------------------------------------------------------------


@event
@dataclass(frozen=True)
class StepRequested(StepDemand):
    """A step task asks the node for a lease (the agent answers with LeaseGranted)."""

    owner: str = ""
    pid: int = 0
    #: the step's declared hard limit per attempt (its ``timeout:``), seconds; None: none
    time_limit: float | None = None
    #: the requester's start time (see ``RunSubmitted.pid_started``); None: unknown
    pid_started: float | None = None


@event
@dataclass(frozen=True)
class LeaseGranted(StepEvent):
    """The agent's answer to a StepRequested; ``channel`` is the step's channel file (its
    ``M27_CHANNEL``), empty for steps that get none (cpu); ``cpus`` the cores a GPU step
    runs on (its GPUs' share, m27.gpu.cpus; empty: not confined)."""

    gpus: tuple[int, ...]
    tier: str = "immediate"
    channel: str = ""
    cpus: tuple[int, ...] = ()


@event
@dataclass(frozen=True)
class LeaseReleased(StepEvent):
    gpus: tuple[int, ...] = ()
    #: why the node agent took the lease back (`moved to GPU 1, which is free`); empty
    #: when the step's own runner released it
    reason: str = ""


@event
@dataclass(frozen=True)
class GuestStarted(StepEvent):
    gpu: int


@event
@dataclass(frozen=True)
class GuestPaused(StepEvent):
    gpu: int
    how: str = "gate"


@event
@dataclass(frozen=True)
class GuestResumed(StepEvent):
    gpu: int


@event
@dataclass(frozen=True)
class Promoted(StepEvent):
    gpu: int


@event
@dataclass(frozen=True)
class PriorityBumped(StepEvent):
    delta: int


@event
@dataclass(frozen=True)
class GpuLost(Event):
    gpu: int
    uuid: str = ""
    reason: str = ""


@event
@dataclass(frozen=True)
class AgentStarted(Event):
    pid: int
    host: str = ""
    gpus: int = 0
    backend: str = ""


@event
@dataclass(frozen=True)
class StepEnergyMeasured(StepEvent):
    gpu: int
    joules: float


@event
@dataclass(frozen=True)
class StepMemoryMeasured(StepEvent):
    """The most GPU memory a step's processes held on one GPU during its lease (NVML
    per-process memory; the simulated backend's modelled use), recorded at release so
    the next run of the same pipeline step may be a guest without declaring it."""

    gpu: int
    peak_bytes: int


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
