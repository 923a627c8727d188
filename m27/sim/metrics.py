"""The figures a simulation is judged by, computed once from its recorded intervals.

- busy %: time some step computed on a GPU / GPU time in the window;
- idle while queued %: GPU time in the window with nothing computing on that GPU while
  GPU work waited (pending, or a paused guest) / GPU time in the window;
- makespan: first arrival to last end; jobs done: ends within the window;
- JCT: end minus the moment the job became runnable (arrived and its upstream done),
  mean and p95 per priority class.

The window is the trace's (e.g. 72 h for the lab week), else the run's own makespan.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from m27.sim.engine import SimResult


@dataclass(frozen=True)
class Metrics:
    policy: str
    gpus: int
    window_s: float
    busy_pct: float
    idle_queued_pct: float
    makespan_s: float
    jobs_done: int
    jobs_total: int
    unfinished: int
    jct: dict[str, dict[str, float]] = field(default_factory=dict)
    decisions: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def _clip(intervals: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total length of the intersection of two sorted, merged interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def p95(values: list[float]) -> float:
    """Nearest-rank 95th percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def compute_metrics(result: SimResult, window: float | None = None) -> Metrics:
    jobs = result.trace.jobs
    t0 = min((j.arrival for j in jobs), default=0.0)
    makespan = max(0.0, result.end - t0)
    span = window or result.trace.window or makespan
    lo, hi = t0, t0 + span
    gpu_time = span * result.gpus
    queued = _clip(_merge(result.queued), lo, hi)
    busy_total = idle_q = 0.0
    for segs in result.busy:
        busy = _clip(_merge((s, e) for s, e, _ in segs), lo, hi)
        busy_total += _length(busy)
        idle_q += _length(queued) - _overlap(queued, busy)
    done = [lv for lv in result.jobs if lv.finished_at is not None]
    by_class: dict[str, list[float]] = {}
    for lv in done:
        assert lv.finished_at is not None
        by_class.setdefault(lv.job.klass, []).append(lv.finished_at - lv.queued_at)
    jct = {
        k: {"n": float(len(v)), "mean_s": sum(v) / len(v), "p95_s": p95(v)}
        for k, v in sorted(by_class.items())
    }
    return Metrics(
        policy=result.policy,
        gpus=result.gpus,
        window_s=span,
        busy_pct=100.0 * busy_total / gpu_time if gpu_time else 0.0,
        idle_queued_pct=100.0 * idle_q / gpu_time if gpu_time else 0.0,
        makespan_s=makespan,
        jobs_done=sum(1 for lv in done if lv.finished_at is not None and lv.finished_at <= hi),
        jobs_total=len(jobs),
        unfinished=len(jobs) - len(done),
        jct=jct,
        decisions=result.decisions,
    )
