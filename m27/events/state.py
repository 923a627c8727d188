"""The projection: what the node's event log means now.

``fold(records) -> NodeState`` replays the log; :func:`apply` is the only code that changes
a state, one event at a time, so every past state can be rebuilt (`m27 history`,
`m27 replay`) and the agent, the CLI and the exporter all see the same facts.

Every event kind has an explicit handler in ``_HANDLERS`` (a test checks that no kind is
missing). An event that names a run this log never saw submitted (a pruned or foreign log)
changes only node-wide facts and is counted in ``NodeState.unknown_run_events``; a kind
without a handler is recorded in ``NodeState.unhandled_kinds`` rather than stopping a node.

Leases change only through ``LeaseGranted``/``LeaseReleased``: a step that ended without a
release (its runner crashed) keeps its lease here until the agent releases it, so the
projection shows the truth rather than a guess.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sized

from m27._gc import collector_paused
from m27.events import Event, Recorded
from m27.events._handlers import _HANDLERS
from m27.events._projection import (
    STEP_DONE,
    AgentInfo,
    NodeState,
    RunState,
    RunStatus,
    StepState,
    StepStatus,
    step_ended,
)

__all__ = [
    "STEP_DONE",
    "AgentInfo",
    "NodeState",
    "RunState",
    "RunStatus",
    "StepState",
    "StepStatus",
    "apply",
    "fill_in",
    "fold",
    "handled_kinds",
    "live_runs",
    "orphaned_steps",
    "step_ended",
]


def handled_kinds() -> frozenset[str]:
    """Names of the event kinds this projection knows how to apply."""
    return frozenset(cls.__name__ for cls in _HANDLERS)


def apply(state: NodeState, rec: Recorded | Event) -> NodeState:
    """Apply one event (or a recorded one, which also moves ``last_seq``) to `state`."""
    event = rec.event if isinstance(rec, Recorded) else rec
    handler = _HANDLERS.get(type(event))
    if handler is None:
        # A kind added to events.py without a handler here: the unit suite fails on it;
        # at run time the node keeps going and the gap stays visible.
        state.unhandled_kinds.add(event.kind)
    else:
        handler(state, event)
    if isinstance(rec, Recorded):
        state.last_seq = rec.seq
    state.last_at = event.at
    return state


def fold(records: Iterable[Recorded | Event], state: NodeState | None = None) -> NodeState:
    """Replay `records` onto `state` (a fresh one by default).

    What :func:`apply` does for each, with its steps inline for a ``Recorded`` (what a
    replay of the log is made of): one call per event instead of two, and no
    ``isinstance`` checks; anything else goes through :func:`apply` itself.
    """
    state = NodeState() if state is None else state
    if isinstance(records, Sized) and len(records) >= _MANY:
        with collector_paused():  # a replay makes many objects, and no cycles
            return _fold(records, state)
    return _fold(records, state)


#: A fold of at least this many records pauses the cyclic collector (m27._gc): 30% of
#: folding the 30k run events of 15,000 runs went to its passes over the growing state.
_MANY = 1000


def _fold(records: Iterable[Recorded | Event], state: NodeState) -> NodeState:
    handlers = _HANDLERS
    for rec in records:
        if rec.__class__ is not Recorded:
            apply(state, rec)
            continue
        event = rec.event  # type: ignore[union-attr]
        handler = handlers.get(event.__class__)
        if handler is None:
            state.unhandled_kinds.add(event.kind)
        else:
            handler(state, event)
        state.last_seq = rec.seq  # type: ignore[union-attr]
        state.last_at = event.at
    return state


def fill_in(outline: NodeState, full: NodeState, run_ids: Collection[str]) -> NodeState:
    """`outline` (a fold of every run's own events and the node's: ``EventStore.read_runs``
    with ``outline=True``) with the runs `run_ids` as `full` (a fold of their events) tells
    them: their steps, leases, requests and guests. Changes and returns `outline`.

    Exact because every handler changes only the run its event names and the node's own
    facts (tests/unit/test_partial_fold.py checks it against a fold of the whole log)."""
    for run_id in run_ids:
        if run_id in full.runs:
            outline.runs[run_id] = full.runs[run_id]
    for mine, theirs in (
        (outline.leases, full.leases),
        (outline.lease_tiers, full.lease_tiers),
        (outline.requests, full.requests),
        (outline.guests, full.guests),
    ):
        mine.update((k, v) for k, v in theirs.items() if k[0] in run_ids)  # type: ignore[misc]
    outline.unhandled_kinds |= full.unhandled_kinds
    return outline


def live_runs(state: NodeState) -> list[RunState]:
    """Runs not yet ended, in submission order."""
    return [run for run in state.runs.values() if run.status == "running"]


def orphaned_steps(
    state: NodeState, is_alive: Callable[[int, float | None], bool]
) -> list[StepState]:
    """Running steps whose process is gone: after a crash, these need a requeue.

    `is_alive(pid, started)` is :func:`m27.liveness.alive` outside tests."""
    return [
        step
        for run in state.runs.values()
        for step in run.steps.values()
        if step.status == "running"
        and (step.pid is None or not is_alive(step.pid, step.pid_started))
    ]
