"""A fold of some runs' events (``EventStore.read_runs``) tells those runs exactly as the
fold of the whole log does: what lets `m27 status`, `m27 runs`, `m27 logs` and `m27
cancel` read a few runs instead of the node's whole history (m27.cli.commands._common)."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from m27.events import EVENT_TYPES, Event, RunEvent, StepEvent
from m27.events.state import NodeState, RunState, StepState, fill_in, fold
from m27.store.memory import MemoryEventStore
from tests.unit.event_samples import sample_event

KINDS = sorted(EVENT_TYPES.values(), key=lambda c: c.__name__)
RUNS = ("r0", "r1", "r2", "r3")


def _event(kind: int, run: int, step: int, at: int) -> Event:
    ev = dataclasses.replace(sample_event(KINDS[kind]), at=float(at))
    if isinstance(ev, StepEvent):
        return dataclasses.replace(ev, run_id=RUNS[run], step=f"s{step}")
    if isinstance(ev, RunEvent):
        return dataclasses.replace(ev, run_id=RUNS[run])
    return ev


logs = st.lists(
    st.tuples(st.integers(0, len(KINDS) - 1), st.integers(0, len(RUNS) - 1), st.integers(0, 2)),
    max_size=80,
)


def _of(state: NodeState, runs: set[str]) -> dict[str, object]:
    """What the state says about `runs`, and the node's own facts."""
    mine = lambda key: key[0] in runs  # noqa: E731
    return {
        "runs": {k: v for k, v in state.runs.items() if k in runs},
        "leases": {k: v for k, v in state.leases.items() if mine(k)},
        "tiers": {k: v for k, v in state.lease_tiers.items() if mine(k)},
        "requests": {k: v for k, v in state.requests.items() if mine(k)},
        "guests": {k: v for k, v in state.guests.items() if mine(k)},
        "admitted": {k: v for k, v in state.admitted.items() if k in runs},
        "node": (state.lost_gpus, state.overheated, state.throttled, state.agent),
    }


@settings(max_examples=200, deadline=None)
@given(logs, st.sets(st.sampled_from(RUNS)))
def test_a_fold_of_some_runs_tells_them_as_the_whole_log_does(
    picks: list[tuple[int, int, int]], runs: set[str]
) -> None:
    store = MemoryEventStore()
    store.append([_event(k, r, s, at) for at, (k, r, s) in enumerate(picks)])
    whole = fold(store.read())
    some = fold(store.read_runs(runs, outline=True))
    assert _of(some, runs) == _of(whole, runs)
    # every run is listed, with its status and times as a whole
    assert _as_a_whole(some) == _as_a_whole(whole)
    # the outline, then the runs' own events folded apart and filled in: the same
    outline = fold(store.read_runs((), outline=True))
    assert _as_a_whole(outline) == _as_a_whole(whole)
    filled = fill_in(outline, fold(store.read_runs(runs)), runs)
    assert _of(filled, runs) == _of(whole, runs)
    assert list(filled.runs) == list(whole.runs)


def _as_a_whole(state: NodeState) -> dict[str, tuple[object, ...]]:
    return {k: (v.status, v.submitted_at, v.ended_at, v.pid) for k, v in state.runs.items()}


def test_a_new_step_has_the_defaults_of_its_class_and_shares_no_mutable_one() -> None:
    """RunState.step copies one dict of defaults instead of calling StepState(...)."""
    made = RunState("r", "p", priority=4).step("s")
    assert made == StepState(name="s", run_id="r", priority=4)
    for f in dataclasses.fields(StepState)[1:]:  # after `name`, which it sets
        assert f.default_factory is dataclasses.MISSING, f.name
        assert isinstance(f.default, (str, int, float, bool, tuple, type(None))), f.name
