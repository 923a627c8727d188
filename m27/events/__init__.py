"""What happened on a node: the event types of the append-only log.

Events are small frozen dataclasses named in the past tense that carry facts only (ids,
times, numbers, short texts), never live objects. Requests from other processes are events
too (`CancelRequested`, `StepRequested`), so the log doubles as the node's mailbox.

Each event type has a schema ``version``. Decoding an unknown kind or a newer version raises
:class:`~m27.UnknownEventError`: replay must stop loudly rather than build a wrong state.

``at`` is the wall-clock time (epoch seconds, from the injected clock) when it happened.
"""

from __future__ import annotations

from m27.events._agent import (
    AgentStarted,
    GpuLost,
    GpuOverheated,
    GpuThrottled,
    GuestPaused,
    GuestResumed,
    GuestStarted,
    LeaseGranted,
    LeaseReleased,
    PriorityBumped,
    Promoted,
    StepEnergyMeasured,
    StepMemoryMeasured,
    StepRequested,
)
from m27.events._base import (
    EVENT_TYPES,
    Event,
    Recorded,
    RunEvent,
    StepEvent,
    decode,
    encode,
    event,
    prepare_codecs,
)
from m27.events._rows import (
    Layouts,
    current_layouts,
    decode_group,
    decode_records,
    decode_row,
    encode_positional,
)
from m27.events._run import (
    AutoResumeSkipped,
    AutoResumeStarted,
    CancelRequested,
    RunAdmitted,
    RunCancelled,
    RunCrashed,
    RunFailed,
    RunSubmitted,
    RunSucceeded,
)
from m27.events._step import (
    CheckpointRestored,
    CheckpointWritten,
    SlurmJobStateChanged,
    SlurmJobSubmitted,
    StepCancelled,
    StepDemand,
    StepFailed,
    StepFlopsReported,
    StepQueued,
    StepRequeued,
    StepSkipped,
    StepStarted,
    StepSucceeded,
)

__all__ = [
    "EVENT_TYPES",
    "AgentStarted",
    "AutoResumeSkipped",
    "AutoResumeStarted",
    "CancelRequested",
    "CheckpointRestored",
    "CheckpointWritten",
    "Event",
    "GpuLost",
    "GpuOverheated",
    "GpuThrottled",
    "GuestPaused",
    "GuestResumed",
    "GuestStarted",
    "Layouts",
    "LeaseGranted",
    "LeaseReleased",
    "PriorityBumped",
    "Promoted",
    "Recorded",
    "RunAdmitted",
    "RunCancelled",
    "RunCrashed",
    "RunEvent",
    "RunFailed",
    "RunSubmitted",
    "RunSucceeded",
    "SlurmJobStateChanged",
    "SlurmJobSubmitted",
    "StepCancelled",
    "StepDemand",
    "StepEnergyMeasured",
    "StepEvent",
    "StepFailed",
    "StepFlopsReported",
    "StepMemoryMeasured",
    "StepQueued",
    "StepRequested",
    "StepRequeued",
    "StepSkipped",
    "StepStarted",
    "StepSucceeded",
    "current_layouts",
    "decode",
    "decode_group",
    "decode_records",
    "decode_row",
    "encode",
    "encode_positional",
    "event",
    "prepare_codecs",
    "run_kinds",
]


def run_kinds() -> frozenset[str]:
    """The kinds about a run as a whole (submitted, admitted, cancel asked, ended): what a
    fold needs to list every run without its steps (``EventStore.read_runs``)."""
    return frozenset(
        name
        for name, cls in EVENT_TYPES.items()
        if issubclass(cls, RunEvent) and not issubclass(cls, StepEvent)
    )
