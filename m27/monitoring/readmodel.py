"""A read model of the event log for the exporter: applies only new events, keeps counters.

A scrape must not replay the log: with 100k events that would take a second. The read
model folds the log once, then each :meth:`ReadModel.refresh` reads the events after the
last sequence number it applied and updates, alongside the projection (:mod:`m27.events.state`),
what the metrics need as running counts:

- steps per (state, tier, type, leased) bucket, adjusted by each event's before/after;
- runs per state, run outcomes, recent ended runs (for per-run energy series);
- histograms of checkpoint durations and sizes and of dispatch latency (from the moment a
  step attempt queued until its process started);
- per-step FLOPs reports and energy totals per (pipeline, step);
- the time of each running step's newest checkpoint (or its start, if none yet);
- lease releases since the sampler last looked (when a step's energy is recorded).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from m27 import events as ev
from m27._exceptions import M27Error
from m27.events import Recorded
from m27.events.state import NodeState, RunState, StepState, apply
from m27.store import EventStore

__all__ = [
    "BYTES_BUCKETS",
    "DURATION_BUCKETS",
    "LATENCY_BUCKETS",
    "TIERS",
    "Histogram",
    "ReadModel",
    "StepBucket",
    "spec_checkpoint_intervals",
    "waiting_tier",
]

StepKey = tuple[str, str]

#: The policy's tiers, plus "guest" (a ready-tier step started on another's GPU).
TIERS = ("immediate", "ready", "background")
#: How runs end, as `m27_runs_total{outcome}`: "crashed" is a run whose m27 process died
#: (kill -9, out of memory, a power cut), closed by the crash watcher; `m27 runs` says the same.
RUN_OUTCOMES = ("succeeded", "failed", "crashed", "cancelled")

DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0)
BYTES_BUCKETS = tuple(float(1024 * 4**k) for k in range(14))  # 1 KiB .. 64 GiB
LATENCY_BUCKETS = (
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)


class StepBucket(NamedTuple):
    state: str
    tier: str
    type: str
    leased: bool


@dataclass
class Histogram:
    """Bucket counts of observed values (upper bounds inclusive, like Prometheus' ``le``)."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    sum: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                return

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, count)`` pairs ending with ``+Inf``, as a HistogramMetricFamily takes them."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip(self.bounds, self.counts, strict=True):
            running += n
            out.append((_le(bound), float(running)))
        out.append(("+Inf", float(self.count)))
        return out


def _le(bound: float) -> str:
    return str(int(bound)) if bound == int(bound) and bound >= 1 else repr(bound)


def waiting_tier(step_type: str) -> str:
    """The tier a waiting step queues for: GPU steps are the ready tier's candidates (the
    best of them becomes a GPU's primary); ``cpu`` and ``gpu_light`` are background work."""
    return "ready" if step_type == "gpu" else "background"


def spec_checkpoint_intervals(run: RunState) -> dict[str, float]:
    """Checkpoint interval (s) per step, from the run's pipeline file; {} if unreadable."""
    if not run.spec_path:
        return {}
    from m27.spec import load_pipeline

    try:
        pipeline = load_pipeline(run.spec_path, run.vars)
    except (M27Error, OSError, ValueError):
        return {}
    return {s.name: float(s.checkpoint) for s in pipeline.steps if s.checkpoint}


class ReadModel:
    """The projection plus running counters, advanced by :meth:`refresh`.

    Not thread-safe: its owner (the exporter's sampler) serializes access.
    """

    def __init__(
        self,
        store: EventStore,
        *,
        recent_runs: int = 20,
        batch: int = 5000,
        intervals: Callable[[RunState], Mapping[str, float]] = spec_checkpoint_intervals,
    ) -> None:
        self.store = store
        self.state = NodeState()
        self.batch = batch
        self.step_counts: Counter[StepBucket] = Counter()
        self.run_states: Counter[str] = Counter()
        self.run_outcomes: dict[str, int] = dict.fromkeys(RUN_OUTCOMES, 0)
        self.checkpoint_duration: dict[str, Histogram] = {}
        self.checkpoint_bytes: dict[str, Histogram] = {}
        self.dispatch_latency: dict[str, Histogram] = {}
        self.flops: dict[StepKey, float] = {}
        self.energy_total: dict[tuple[str, str], float] = {}
        self.flops_total: dict[tuple[str, str], float] = {}
        self.last_checkpoint_at: dict[StepKey, float] = {}
        self.running: set[StepKey] = set()
        self.recent_ended: deque[str] = deque(maxlen=recent_runs)
        self.live_runs: dict[str, None] = {}  # an ordered set
        self.events_applied = 0
        self._released: list[StepKey] = []
        self._waiting_since: dict[StepKey, float] = {}
        self._intervals = intervals
        self._interval_cache: dict[str, Mapping[str, float]] = {}

    @property
    def last_seq(self) -> int:
        return self.state.last_seq

    def refresh(self) -> int:
        """Apply every event appended since the last call; returns how many."""
        applied = 0
        while True:
            records = self.store.read(after=self.state.last_seq, limit=self.batch)
            for rec in records:
                self.apply(rec)
            applied += len(records)
            if len(records) < self.batch:
                return applied

    def drain_released(self) -> list[StepKey]:
        """Steps whose lease ended since the previous call."""
        out, self._released = self._released, []
        return out

    def checkpoint_interval(self, key: StepKey) -> float | None:
        run = self.state.runs.get(key[0])
        if run is None:
            return None
        intervals = self._interval_cache.get(run.run_id)
        if intervals is None:
            intervals = self._interval_cache[run.run_id] = self._intervals(run)
        return intervals.get(key[1])

    def shown_runs(self) -> list[str]:
        """Runs whose per-run series are exported: the live ones and the latest ended."""
        return list(dict.fromkeys([*self.recent_ended, *self.live_runs]))

    def pipeline_of(self, run_id: str) -> str:
        run = self.state.runs.get(run_id)
        return run.pipeline if run is not None else ""

    # --- applying one event -------------------------------------------------------------

    def apply(self, rec: Recorded) -> None:
        e = rec.event
        run_id: str | None = getattr(e, "run_id", None)
        step_name: str | None = getattr(e, "step", None)
        run_before = self.state.runs.get(run_id) if run_id is not None else None
        status_before = run_before.status if run_before is not None else None
        if isinstance(e, ev.RunSubmitted) and run_before is not None:
            for step in run_before.steps.values():  # a run submitted again replaces the old
                self._count(step, -1)
        key = (run_id, step_name) if run_id is not None and step_name is not None else None
        before = self._bucket_of(key)
        self._before(e, key)

        apply(self.state, rec)
        self.events_applied += 1

        if isinstance(e, ev.RunSubmitted):
            for step in self.state.runs[e.run_id].steps.values():
                self._count(step, +1)
        elif key is not None:
            after = self._bucket_of(key)
            if before != after:
                if before is not None:
                    self._move(key, before, -1)
                if after is not None:
                    self._move(key, after, +1)
        self._after(e, key)
        if run_id is not None:
            run = self.state.runs.get(run_id)
            status_after = run.status if run is not None else None
            if status_before != status_after:
                if status_before is not None:
                    self.run_states[status_before] -= 1
                if status_after is not None:
                    self.run_states[status_after] += 1
                if status_after == "running":
                    self.live_runs[run_id] = None
                    if run_id in self.recent_ended:  # submitted again under the same id
                        self.recent_ended.remove(run_id)
                elif status_after in RUN_OUTCOMES:
                    self.live_runs.pop(run_id, None)
                    crashed = run is not None and run.crashed
                    self.run_outcomes["crashed" if crashed else status_after] += 1
                    if run_id in self.recent_ended:
                        self.recent_ended.remove(run_id)
                    self.recent_ended.append(run_id)
                    self._interval_cache.pop(run_id, None)

    def _bucket_of(self, key: StepKey | None) -> StepBucket | None:
        if key is None:
            return None
        step = self.state.step(*key)
        return None if step is None else self._bucket(step)

    def _bucket(self, step: StepState) -> StepBucket:
        leased = (step.run_id, step.name) in self.state.leases
        tier = step.tier or (waiting_tier(step.type) if step.status == "queued" else "none")
        return StepBucket(step.status, tier, step.type or "unknown", leased)

    def _count(self, step: StepState, sign: int) -> None:
        self._move((step.run_id, step.name), self._bucket(step), sign)

    def _move(self, key: StepKey, bucket: StepBucket, sign: int) -> None:
        self.step_counts[bucket] += sign
        if bucket.state == "running":
            if sign > 0:
                self.running.add(key)
            else:
                self.running.discard(key)
                self.last_checkpoint_at.pop(key, None)

    def _before(self, e: ev.Event, key: StepKey | None) -> None:
        if key is None:
            return
        if isinstance(e, ev.StepQueued):
            self._waiting_since[key] = e.at
        elif isinstance(e, ev.StepRequested):
            self._waiting_since.setdefault(key, e.at)
        elif (isinstance(e, ev.StepFailed) and e.will_retry) or isinstance(e, ev.StepRequeued):
            self._waiting_since[key] = e.at
        elif isinstance(e, ev.StepStarted):
            since = self._waiting_since.pop(key, None)
            if since is not None:
                tier = self.state.lease_tiers.get(key, "none")
                hist = self.dispatch_latency.get(tier)
                if hist is None:
                    hist = self.dispatch_latency[tier] = Histogram(LATENCY_BUCKETS)
                hist.observe(max(0.0, e.at - since))
        elif isinstance(e, ev.LeaseReleased) and key in self.state.leases:
            self._released.append(key)
        elif isinstance(e, ev.StepSucceeded | ev.StepSkipped | ev.StepCancelled) or (
            isinstance(e, ev.StepFailed) and not e.will_retry
        ):
            self._waiting_since.pop(key, None)

    def _after(self, e: ev.Event, key: StepKey | None) -> None:
        if key is None:
            return
        pipeline = self.pipeline_of(key[0])
        if isinstance(e, ev.StepStarted) and key in self.running:
            self.last_checkpoint_at[key] = e.at
        elif isinstance(e, ev.CheckpointWritten):
            if key in self.running:
                self.last_checkpoint_at[key] = e.at
            name = pipeline or e.pipeline
            for hists, buckets, value in (
                (self.checkpoint_duration, DURATION_BUCKETS, e.duration_s),
                (self.checkpoint_bytes, BYTES_BUCKETS, float(e.bytes_written)),
            ):
                hist = hists.get(name)
                if hist is None:
                    hist = hists[name] = Histogram(buckets)
                hist.observe(value)
        elif isinstance(e, ev.StepEnergyMeasured) and e.joules > 0:
            where = (pipeline, e.step)
            self.energy_total[where] = self.energy_total.get(where, 0.0) + e.joules
        elif isinstance(e, ev.StepFlopsReported) and e.flops > 0:
            self.flops[key] = self.flops.get(key, 0.0) + e.flops
            where = (pipeline, e.step)
            self.flops_total[where] = self.flops_total.get(where, 0.0) + e.flops
