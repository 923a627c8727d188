"""What happened on a node: the event types of the append-only log.

Events are small frozen dataclasses named in the past tense that carry facts only (ids,
times, numbers, short texts), never live objects. Requests from other processes are events
too (`CancelRequested`, `StepRequested`), so the log doubles as the node's mailbox.

Each event type has a schema ``version``. Decoding an unknown kind or a newer version raises
:class:`~m27.UnknownEventError`: replay must stop loudly rather than build a wrong state.

``at`` is the wall-clock time (epoch seconds, from the injected clock) when it happened.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson

from m27._exceptions import UnknownEventError

#: kind name -> event class; filled by the @event decorator.
EVENT_TYPES: dict[str, type[Event]] = {}


@dataclass(frozen=True)
class Event:
    """Base of every event; ``kind`` is the class name and ``version`` its schema version."""

    version: ClassVar[int] = 1

    at: float

    @property
    def kind(self) -> str:
        return type(self).__name__

    def to_payload(self) -> dict[str, Any]:
        """The event's fields as JSON-able values (tuples are written as lists by json).

        Shallow on purpose: events hold only plain values (numbers, strings, tuples, flat
        dicts), and ``dataclasses.asdict``'s deep copy was most of the cost of an append
        (~14 us of ~22 us per event on a loaded 2-core VM).
        """
        values = self.__dict__
        return {name: values[name] for name in _spec(type(self)).names}


@dataclass(frozen=True)
class RunEvent(Event):
    """Base of the events about one run: they all name it first (after ``at``)."""

    run_id: str


@dataclass(frozen=True)
class StepEvent(RunEvent):
    """Base of the events about one step of a run (``run_id``, then ``step``).

    Field order is the serialized order and the positional order: ``at, run_id, step``
    then the event's own fields, as before the bases existed, so stored payloads and
    ``StepFailed(now, run_id, step, ...)`` calls are unchanged.
    """

    step: str


@dataclass(frozen=True)
class Recorded:
    """An event as stored: its gapless sequence number in the node's log, and the event."""

    seq: int
    event: Event


_E = typing.TypeVar("_E", bound=type[Event])


def event(cls: _E) -> _E:
    """Register an event class under its name so it can be decoded from the log."""
    if cls.__name__ in EVENT_TYPES:
        raise TypeError(f"event kind {cls.__name__} registered twice")
    EVENT_TYPES[cls.__name__] = cls
    return cls


def encode(ev: Event) -> tuple[str, int, str]:
    """(kind, version, JSON payload) for storage."""
    return ev.kind, type(ev).version, json.dumps(ev.to_payload(), separators=(",", ":"))


def decode(kind: str, version: int, payload: str | dict[str, Any]) -> Event:
    """Rebuild an event from storage; unknown kinds and newer versions fail loudly."""
    cls = EVENT_TYPES.get(kind)
    if cls is None:
        raise UnknownEventError(f"unknown event kind {kind!r} in the log", kind=kind)
    if version > cls.version:
        raise UnknownEventError(
            f"event {kind} has schema version {version}, this m27 knows up to {cls.version}",
            kind=kind,
            version=version,
        )
    data = _loads(payload) if isinstance(payload, str) else dict(payload)
    spec = _spec(cls)
    for name in spec.tuples:
        value = data.get(name)
        if isinstance(value, list):
            # Tuple fields hold plain values or (homogeneous) tuples of them.
            data[name] = (
                tuple(map(tuple, value)) if value and isinstance(value[0], list) else (tuple(value))
            )
    keys = data.keys()
    if spec.fast and keys == spec.known:
        # The common case (the payload names every field, as encode writes it), without
        # the dataclass __init__ and its object.__setattr__ per field: about half of the
        # cost of a decode, and a replay of the log is mostly decodes.
        ev = object.__new__(cls)
        ev.__dict__.update(data)
        return ev
    if spec.fast and spec.required <= keys and keys <= spec.known:
        ev = object.__new__(cls)  # an older payload: fields added since take defaults
        ev.__dict__.update(spec.defaults)
        for name, factory in spec.factories:
            ev.__dict__[name] = factory()
        ev.__dict__.update(data)
        return ev
    kwargs: dict[str, Any] = {}
    for name, is_tuple in _fields(cls):
        if name not in data:
            continue
        value = data[name]
        if isinstance(value, list) and is_tuple:
            value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise UnknownEventError(f"event {kind} payload does not fit: {exc}", kind=kind) from exc


def _loads(payload: str) -> Any:
    """json.loads, through orjson (~2x faster per payload) where it parses the text.

    ``json.dumps`` writes NaN and Infinity, and Python ints of any size; orjson refuses
    those, and the standard parser then reads the payload as it always did.
    """
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return json.loads(payload)


_FIELDS: dict[str, tuple[tuple[str, bool], ...]] = {}


def _fields(cls: type[Event]) -> tuple[tuple[str, bool], ...]:
    """(field name, is a tuple) per field; resolving type hints is slow, so once per class."""
    found = _FIELDS.get(cls.__name__)
    if found is None:
        hints = typing.get_type_hints(cls)
        found = tuple((f.name, _is_tuple(hints.get(f.name))) for f in dataclasses.fields(cls))
        _FIELDS[cls.__name__] = found
    return found


@dataclass(frozen=True)
class _Spec:
    """How to build one event class fast from a decoded payload (computed once per class)."""

    names: tuple[str, ...]
    known: frozenset[str]
    required: frozenset[str]
    tuples: tuple[str, ...]
    defaults: dict[str, Any]
    factories: tuple[tuple[str, Any], ...]
    #: False for a class that validates in ``__post_init__``: it always takes ``__init__``
    fast: bool


_SPECS: dict[type[Event], _Spec] = {}


def _spec(cls: type[Event]) -> _Spec:
    found = _SPECS.get(cls)
    if found is None:
        fields = dataclasses.fields(cls)
        plain = {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
        factories = tuple(
            (f.name, f.default_factory)
            for f in fields
            if f.default_factory is not dataclasses.MISSING
        )
        needed = {f.name for f in fields} - set(plain) - {n for n, _ in factories}
        found = _Spec(
            names=tuple(f.name for f in fields),
            known=frozenset(f.name for f in fields),
            required=frozenset(needed),
            tuples=tuple(name for name, is_tuple in _fields(cls) if is_tuple),
            defaults=plain,
            factories=factories,
            fast=not hasattr(cls, "__post_init__"),
        )
        _SPECS[cls] = found
    return found


def _is_tuple(hint: Any) -> bool:
    if hint is None:
        return False
    if typing.get_origin(hint) is tuple:
        return True
    return any(typing.get_origin(a) is tuple for a in typing.get_args(hint))


# --- runs -----------------------------------------------------------------------------


@event
@dataclass(frozen=True)
class RunSubmitted(RunEvent):
    """A pipeline run was accepted: the spec validated and its steps are known."""

    pipeline: str
    spec_path: str
    steps: tuple[str, ...]
    vars: dict[str, str] = field(default_factory=dict)
    owner: str = ""
    priority: int = 0
    resume_of: str | None = None
    flow_run_id: str | None = None
    prefect_url: str | None = None
    pid: int = 0
    host: str = ""
    #: the flow process's start time (:func:`m27.liveness.start_time`), so a reused pid is
    #: not taken for it; None in logs written before it was recorded
    pid_started: float | None = None


@event
@dataclass(frozen=True)
class RunSucceeded(RunEvent):
    duration_s: float


@event
@dataclass(frozen=True)
class RunFailed(RunEvent):
    duration_s: float
    failed_steps: tuple[str, ...] = ()
    reason: str = ""


@event
@dataclass(frozen=True)
class RunCancelled(RunEvent):
    reason: str = ""


@event
@dataclass(frozen=True)
class CancelRequested(RunEvent):
    """Someone (`m27 cancel`, Ctrl-C, the bot, Prefect) asked a run to stop."""

    by: str = ""


# --- steps ----------------------------------------------------------------------------


@dataclass(frozen=True)
class StepDemand(StepEvent):
    """Base of the events that say what a step needs: its type (cpu, gpu, gpu_light), its
    priority, how many GPUs and how much GPU memory (bytes)."""

    type: str
    priority: int = 0
    gpus: int = 0
    gpu_memory: int = 0


@event
@dataclass(frozen=True)
class StepQueued(StepDemand):
    """A step is waiting for its dependencies and a slot (CPU or GPUs)."""

    depends_on: tuple[str, ...] = ()


@event
@dataclass(frozen=True)
class StepStarted(StepEvent):
    """The step's process was started in its own process group."""

    attempt: int
    pid: int
    pgid: int
    command: tuple[str, ...]
    gpus: tuple[int, ...] = ()
    log_path: str = ""
    resume_from: str | None = None
    host: str = ""
    #: the step process's start time (see ``RunSubmitted.pid_started``); None: unknown
    pid_started: float | None = None


@event
@dataclass(frozen=True)
class StepSucceeded(StepEvent):
    attempt: int
    duration_s: float
    outputs: tuple[str, ...] = ()


@event
@dataclass(frozen=True)
class StepFailed(StepEvent):
    """An attempt failed; ``will_retry`` says whether another attempt follows."""

    attempt: int
    duration_s: float
    reason: str
    exit_code: int | None = None
    signal: int | None = None
    log_tail: str = ""
    will_retry: bool = False


@event
@dataclass(frozen=True)
class StepSkipped(StepEvent):
    """A step did not run: an upstream step failed, or it already succeeded (resume)."""

    reason: str


@event
@dataclass(frozen=True)
class StepCancelled(StepEvent):
    reason: str = ""


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
    ``M27_CHANNEL``), empty for steps that get none (cpu)."""

    gpus: tuple[int, ...]
    tier: str = "immediate"
    channel: str = ""


@event
@dataclass(frozen=True)
class LeaseReleased(StepEvent):
    gpus: tuple[int, ...] = ()


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


# --- checkpoints ------------------------------------------------------------------------


@event
@dataclass(frozen=True)
class CheckpointWritten(StepEvent):
    """A checkpoint was committed durably (manifest renamed into place)."""

    path: str
    sim_step: int
    bytes_written: int
    bytes_total: int
    duration_s: float
    pipeline: str = ""
    #: "arrays" (m27.Checkpointer) or "files" (a self-checkpointing program's files,
    #: captured by the runner); `files` names them
    source: str = "arrays"
    files: tuple[str, ...] = ()


@event
@dataclass(frozen=True)
class CheckpointRestored(StepEvent):
    path: str
    sim_step: int


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


# --- exporter: what a step reports about its own work -----------------------------------


@event
@dataclass(frozen=True)
class StepFlopsReported(StepEvent):
    """A step counted `flops` floating-point operations (``report_flops``); reports
    add up, and the Energy board divides them by the step's joules into TFLOPS/W."""

    flops: float


# --- scale: the m27 worker and crash truth ---------------------------------------------


@event
@dataclass(frozen=True)
class RunAdmitted(RunEvent):
    """An m27 worker took a Prefect flow run for this node, on a seat of `tier`; the run
    holds that seat until it ends (RunSubmitted follows from the flow's own process)."""

    flow_run_id: str
    tier: str
    node: str = ""
    host: str = ""
    worker_pid: int = 0
    #: the worker's start time (see ``RunSubmitted.pid_started``); None: unknown
    worker_pid_started: float | None = None


@event
@dataclass(frozen=True)
class RunCrashed(RunEvent):
    """The run's process died without recording an end (kill -9, OOM, power cut); the
    watchdog stopped its orphaned steps and set the Prefect flow run to Crashed."""

    reason: str


# --- slurm: steps run as Slurm jobs (m27.executors.slurm) ----------------------------------------


@event
@dataclass(frozen=True)
class SlurmJobSubmitted(StepEvent):
    """sbatch accepted a step's attempt as Slurm job `job_id` (kept across requeues)."""

    job_id: str
    attempt: int


@event
@dataclass(frozen=True)
class SlurmJobStateChanged(StepEvent):
    """The job's Slurm state changed (PENDING, RUNNING, TIMEOUT, ...); `reason` is Slurm's."""

    job_id: str
    state: str
    reason: str = ""
