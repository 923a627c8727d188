"""Turn a node's recorded event log into a trace, so a lab can replay its own week.

Each step that ran becomes a job: it arrives when it was queued (or requested, or its run
was submitted), carries its run's owner and priority and its declared GPUs and memory,
depends on its upstream steps, and computes for the time its last attempt ran, minus the
time it spent paused as a guest. The log does not say when a step waited on I/O, so a
replayed step computes throughout: what m27 would gain from its I/O gaps is not counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from m27 import events as ev
from m27.policy import StepType
from m27.sim.trace import GIB, Job, Trace, klass_of


@dataclass
class _Step:
    run: str
    step: str
    arrival: float | None = None
    type: str = "gpu"
    priority: int = 0
    gpus: int = 0
    gpu_memory: int = 0
    depends_on: tuple[str, ...] = ()
    duration: float | None = None
    paused_at: float | None = None
    paused_s: float = 0.0
    owner: str = ""
    time_limit: float | None = None
    gpus_used: tuple[int, ...] = field(default_factory=tuple)


def trace_from_events(
    records: Iterable[ev.Recorded | ev.Event],
    *,
    gpus: int = 4,
    gpu_memory: int = 32 * GIB,
    cpu_slots: int = 4,
) -> Trace:
    runs: dict[str, ev.RunSubmitted] = {}
    steps: dict[tuple[str, str], _Step] = {}

    def step(run: str, name: str) -> _Step:
        return steps.setdefault((run, name), _Step(run, name))

    for rec in records:
        e = rec.event if isinstance(rec, ev.Recorded) else rec
        if isinstance(e, ev.RunSubmitted):
            runs[e.run_id] = e
        elif isinstance(e, ev.StepQueued | ev.StepRequested):
            s = step(e.run_id, e.step)
            s.arrival = e.at if s.arrival is None else min(s.arrival, e.at)
            s.type, s.priority = e.type, e.priority
            s.gpus = max(s.gpus, e.gpus)
            s.gpu_memory = max(s.gpu_memory, e.gpu_memory)
            if isinstance(e, ev.StepQueued) and e.depends_on:
                s.depends_on = e.depends_on
            if isinstance(e, ev.StepRequested):
                s.owner = e.owner or s.owner
                s.time_limit = e.time_limit if e.time_limit is not None else s.time_limit
        elif isinstance(e, ev.StepStarted):
            s = step(e.run_id, e.step)
            s.gpus_used = e.gpus
            s.paused_s, s.paused_at = 0.0, None
        elif isinstance(e, ev.GuestPaused):
            step(e.run_id, e.step).paused_at = e.at
        elif isinstance(e, ev.GuestResumed | ev.Promoted):
            s = step(e.run_id, e.step)
            if s.paused_at is not None:
                s.paused_s += e.at - s.paused_at
                s.paused_at = None
        elif isinstance(e, ev.StepSucceeded | ev.StepFailed):
            step(e.run_id, e.step).duration = e.duration_s
    jobs: list[Job] = []
    for (run, name), s in sorted(steps.items()):
        if s.duration is None:
            continue
        sub = runs.get(run)
        arrival = s.arrival if s.arrival is not None else (sub.at if sub else 0.0)
        kind: StepType = s.type if s.type in ("cpu", "gpu", "gpu_light") else "gpu"  # type: ignore[assignment]
        priority = s.priority or (sub.priority if sub else 0)
        jobs.append(
            Job(
                id=f"{run}/{name}",
                arrival=arrival,
                phases=(("compute", max(0.0, s.duration - s.paused_s)),),
                type=kind,
                priority=priority,
                owner=s.owner or (sub.owner if sub else ""),
                gpus=max(1, s.gpus, len(s.gpus_used)) if kind != "cpu" else 0,
                gpu_memory=s.gpu_memory,
                depends_on=tuple(f"{run}/{d}" for d in s.depends_on),
                klass=klass_of(priority),
                time_limit=s.time_limit,
            )
        )
    t0 = min((j.arrival for j in jobs), default=0.0)
    jobs = [Job(**{**j.__dict__, "arrival": j.arrival - t0}) for j in jobs]
    return Trace(
        jobs=tuple(jobs),
        gpus=gpus,
        gpu_memory=gpu_memory,
        cpu_slots=cpu_slots,
        name="event-log",
        meta={"epoch_start": t0},
    )
