"""The read model's running counts always equal a recount from a full replay of the log."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from m27 import events as ev
from m27.events.state import NodeState, fold
from m27.monitoring.readmodel import Histogram, ReadModel, StepBucket, waiting_tier
from m27.store.memory import MemoryEventStore

RUNS = ("r1", "r2")
STEPS = ("prep", "md", "train")


def _event(kind: str, run: str, step: str, at: float) -> ev.Event:
    typ = "cpu" if step == "prep" else "gpu"
    return {
        "submit": lambda: ev.RunSubmitted(
            at=at, run_id=run, pipeline="p", spec_path="p.yaml", steps=STEPS
        ),
        "queue": lambda: ev.StepQueued(at=at, run_id=run, step=step, type=typ),
        "grant": lambda: ev.LeaseGranted(at=at, run_id=run, step=step, gpus=(0,)),
        "guest": lambda: ev.GuestStarted(at=at, run_id=run, step=step, gpu=1),
        "start": lambda: ev.StepStarted(
            at=at, run_id=run, step=step, attempt=1, pid=1, pgid=1, command=("x",)
        ),
        "retry": lambda: ev.StepFailed(
            at=at, run_id=run, step=step, attempt=1, duration_s=1, reason="x", will_retry=True
        ),
        "fail": lambda: ev.StepFailed(
            at=at, run_id=run, step=step, attempt=1, duration_s=1, reason="x"
        ),
        "succeed": lambda: ev.StepSucceeded(at=at, run_id=run, step=step, attempt=1, duration_s=1),
        "release": lambda: ev.LeaseReleased(at=at, run_id=run, step=step),
        "run_failed": lambda: ev.RunFailed(at=at, run_id=run, duration_s=1),
        "run_ok": lambda: ev.RunSucceeded(at=at, run_id=run, duration_s=1),
    }[kind]()


EVENTS = st.builds(
    _event,
    st.sampled_from(
        [
            *("submit", "queue", "grant", "guest", "start", "retry", "fail", "succeed"),
            *("release", "run_failed", "run_ok"),
        ]
    ),
    st.sampled_from(RUNS),
    st.sampled_from(STEPS),
    st.floats(0, 1e6),
)


def _recount(state: NodeState) -> Counter[StepBucket]:
    out: Counter[StepBucket] = Counter()
    for run in state.runs.values():
        for step in run.steps.values():
            leased = (run.run_id, step.name) in state.leases
            tier = step.tier or (waiting_tier(step.type) if step.status == "queued" else "none")
            out[StepBucket(step.status, tier, step.type or "unknown", leased)] += 1
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(EVENTS, max_size=40), st.integers(1, 7))
def test_incremental_counts_match_a_full_replay(events: list[ev.Event], batch: int) -> None:
    store = MemoryEventStore()
    model = ReadModel(store, batch=batch, intervals=lambda run: {})
    half = len(events) // 2
    store.append(events[:half])
    model.refresh()
    store.append(events[half:])
    model.refresh()
    state = fold(store.read())
    assert +model.step_counts == _recount(state)
    assert model.running == {
        (r.run_id, s.name)
        for r in state.runs.values()
        for s in r.steps.values()
        if s.status == "running"
    }
    statuses = Counter(run.status for run in state.runs.values())
    assert +model.run_states == statuses
    shown = model.shown_runs()
    assert len(shown) == len(set(shown))
    assert set(model.live_runs) == {r.run_id for r in state.runs.values() if r.status == "running"}


def test_histogram_buckets_are_cumulative_and_inclusive() -> None:
    hist = Histogram((1.0, 5.0))
    for value in (0.5, 1.0, 3.0, 99.0):
        hist.observe(value)
    assert hist.cumulative() == [("1", 2.0), ("5", 3.0), ("+Inf", 4.0)]
    assert hist.sum == 103.5
