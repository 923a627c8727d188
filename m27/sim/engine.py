"""A discrete-event simulator on a virtual clock: jobs arrive, compute, wait on I/O, end.

The engine knows nothing about policy. At every instant where something happened (an
arrival, a phase change, an end, a requested wake-up) it asks a scheduler for actions
(the same action types :func:`m27.policy.decide` returns) and applies them. Model: GPU
compute is exclusive; a guest computes at full speed while its primary is in an I/O
phase; a paused guest makes no progress, except through its own I/O; I/O does not use
the GPU.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from m27._exceptions import M27Error
from m27.policy import (
    Action,
    Demote,
    Grant,
    Move,
    PauseGuest,
    Pending,
    Promote,
    ResumeGuest,
    Role,
    Running,
    StartCpu,
    StepKey,
    Tier,
)
from m27.sim.trace import Job, Trace

_PHASE_END, _WAKE = 1, 2


class SimulationError(M27Error):
    """A scheduler asked for something impossible (two primaries on a GPU, an unknown step)."""


class Live:
    """A job's state during one simulation."""

    __slots__ = (
        "finished_at",
        "gpus",
        "job",
        "memo",
        "paused",
        "pending",
        "phase",
        "phase_started",
        "queued_at",
        "remaining",
        "role",
        "since",
        "started_at",
        "tier",
        "token",
    )

    def __init__(self, job: Job, now: float) -> None:
        self.job = job
        self.queued_at = now
        self.pending = Pending(
            key=job.key,
            type=job.type,
            priority=job.priority,
            owner=job.owner,
            gpus=job.gpus if job.type != "cpu" else 0,
            gpu_memory=job.gpu_memory,
            queued_at=now,
            time_limit=job.time_limit,
        )
        self.role: Role | None = None
        self.tier: Tier = "immediate"
        self.gpus: tuple[int, ...] = ()
        self.paused = False
        self.phase = 0
        self.remaining = job.phases[0][1] if job.phases else 0.0
        self.since: float | None = None
        self.phase_started = now
        self.token = 0
        self.started_at: float | None = None
        self.finished_at: float | None = None
        #: a scheduler's own view of this job; the engine clears it on every change of
        #: role, tier or pause (a phase change only lists the job in `SimState.touched`:
        #: the scheduler checks what a phase can change), so it is rebuilt only then.
        self.memo: Running | None = None

    @property
    def in_io(self) -> bool:
        return self.phase < len(self.job.phases) and self.job.phases[self.phase][0] == "io"


@dataclass
class SimState:
    """What a scheduler may look at (read-only by convention)."""

    trace: Trace
    gpus: int
    now: float = 0.0
    pending: dict[str, Live] = field(default_factory=dict)
    running: dict[str, Live] = field(default_factory=dict)
    primary: list[str | None] = field(default_factory=list)
    guests: list[list[str]] = field(default_factory=list)
    by_key: dict[StepKey, str] = field(default_factory=dict)
    #: bumped on every change of the waiting steps / of the leases (who holds what, in
    #: which role, tier, pause or phase), so a scheduler may reuse what it built from them
    pending_version: int = 0
    lease_version: int = 0
    #: the leases changed since the scheduler's last step (emptied after each), so it can
    #: rebuild only their views instead of every lease's on every change
    touched: list[Live] = field(default_factory=list)
    #: how many waiting steps want a GPU (kept by the engine: read at every instant)
    gpu_waiting: int = 0
    #: each waiting step's policy input, in `pending`'s order (kept by the engine beside
    #: `pending`, so a scheduler copies it in one go instead of a loop over the queue)
    pending_inputs: dict[str, Pending] = field(default_factory=dict)

    @property
    def cpu_running(self) -> int:
        return sum(1 for lv in self.running.values() if lv.role == "cpu")


class Scheduler(Protocol):
    name: str

    def step(self, state: SimState) -> tuple[Sequence[Action], float | None]:
        """Actions to apply now, and when to be asked again even if nothing happens."""
        ...


@dataclass
class SimResult:
    policy: str
    trace: Trace
    gpus: int
    jobs: list[Live]
    #: per GPU: (start, end, tier) of time spent computing.
    busy: list[list[tuple[float, float, str]]]
    #: (start, end) intervals during which GPU work waited (pending or paused guests).
    queued: list[tuple[float, float]]
    end: float
    decisions: int = 0


class _Engine:
    def __init__(self, trace: Trace, scheduler: Scheduler, gpus: int) -> None:
        self.st = SimState(trace, gpus, primary=[None] * gpus, guests=[[] for _ in range(gpus)])
        self.sched = scheduler
        self.heap: list[tuple[float, int, int, str, int]] = []
        self.seq = 0
        self.lives: dict[str, Live] = {}
        self.jobs = {j.id: j for j in trace.jobs}
        self.deps_left = {j.id: sum(1 for d in j.depends_on if d in self.jobs) for j in trace.jobs}
        self.children: dict[str, list[str]] = {}
        for j in trace.jobs:
            for d in j.depends_on:
                self.children.setdefault(d, []).append(j.id)
        self.arrived: set[str] = set()
        self.busy: list[list[tuple[float, float, str]]] = [[] for _ in range(gpus)]
        self.queued: list[tuple[float, float]] = []
        self.queued_since: float | None = None
        self.wakes: set[float] = set()
        self.decisions = 0

    def push(self, t: float, kind: int, job_id: str = "", token: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, job_id, token))

    def run(self) -> SimResult:
        # Arrivals are known from the start: they are read in order from a sorted list
        # instead of the heap (a heap of every job made each push and pop of the running
        # ones cost log(jobs)). They come first at their instant, as if pushed first
        # (before any other event, in the trace's order), which is how they were ordered.
        arrivals = sorted((j.arrival, n, j.id) for n, j in enumerate(self.jobs.values()))
        heap, st, inf = self.heap, self.st, math.inf
        n_arrivals, a = len(arrivals), 0
        while heap or a < n_arrivals:
            now = heap[0][0] if heap else inf
            if a < n_arrivals and arrivals[a][0] <= now:
                now = arrivals[a][0]
            st.now = now
            while a < n_arrivals and arrivals[a][0] <= now:
                job_id = arrivals[a][2]
                a += 1
                self.arrived.add(job_id)
                if self.deps_left[job_id] == 0:
                    self.make_pending(job_id, now)
            while heap and heap[0][0] <= now:
                _, _, kind, job_id, token = heapq.heappop(heap)
                if kind == _PHASE_END:
                    lv = self.lives[job_id]
                    if lv.token == token and lv.since is not None:
                        self.phase_end(lv, now)
                else:
                    self.wakes.discard(now)
            wake: float | None = None
            for _ in range(16):
                actions, wake = self.sched.step(st)
                st.touched.clear()  # seen (or not needed) by this scheduler: no growth
                self.decisions += 1
                if not self.apply(actions, now):
                    break
            if wake is not None and wake > now and wake not in self.wakes:
                self.wakes.add(wake)
                self.push(wake, _WAKE)
            self.track_queue(now)
        end = max((lv.finished_at or 0.0) for lv in self.lives.values()) if self.lives else 0.0
        self.track_queue(end, closing=True)
        return SimResult(
            policy=self.sched.name,
            trace=st.trace,
            gpus=st.gpus,
            jobs=list(self.lives.values()),
            busy=self.busy,
            queued=self.queued,
            end=end,
            decisions=self.decisions,
        )

    def make_pending(self, job_id: str, now: float) -> None:
        lv = Live(self.jobs[job_id], now)
        self.lives[job_id] = lv
        self.st.pending[job_id] = lv
        self.st.pending_inputs[job_id] = lv.pending
        self.st.pending_version += 1
        if lv.job.type != "cpu":
            self.st.gpu_waiting += 1
        self.st.by_key[lv.job.key] = job_id

    def track_queue(self, now: float, closing: bool = False) -> None:
        st = self.st
        waiting = not closing and (st.gpu_waiting > 0 or _any_paused(st))
        if waiting and self.queued_since is None:
            self.queued_since = now
        elif not waiting and self.queued_since is not None:
            if now > self.queued_since:
                self.queued.append((self.queued_since, now))
            self.queued_since = None

    # --- progress ---------------------------------------------------------------------

    def stop(self, lv: Live, now: float) -> None:
        if lv.since is None:
            return
        dt = now - lv.since
        if dt > 0 and lv.job.type != "cpu" and not lv.in_io:
            for g in lv.gpus:
                self.busy[g].append((lv.since, now, lv.tier if lv.role == "primary" else "guest"))
        lv.remaining -= dt
        lv.since = None
        lv.token += 1

    def go(self, lv: Live, now: float) -> None:
        if lv.since is not None:
            return
        lv.since = now
        lv.token += 1
        self.push(now + max(0.0, lv.remaining), _PHASE_END, lv.job.id, lv.token)

    def touch(self, lv: Live) -> Live:
        """`lv`'s lease or phase changes: its policy view (``memo``) is built again and the
        layout's version moves on, so what is cached by it is not reused."""
        lv.memo = None
        self.st.lease_version += 1
        self.st.touched.append(lv)
        return lv

    def phase_end(self, lv: Live, now: float) -> None:
        self.stop(lv, now)
        # the lease itself is unchanged: its `memo` stays (the scheduler checks the I/O
        # flag, the one thing of its view a phase changes), but the layout moves on
        self.st.lease_version += 1
        self.st.touched.append(lv)
        lv.phase += 1
        lv.phase_started = now
        phases = lv.job.phases
        if lv.phase < len(phases):
            lv.remaining = phases[lv.phase][1]
            if lv.role != "guest" or not lv.paused or _io_goes_on(lv):
                self.go(lv, now)
            return
        self.finish(lv, now)

    def finish(self, lv: Live, now: float) -> None:
        st = self.st
        lv.finished_at = now
        del st.running[lv.job.id]
        st.lease_version += 1
        st.touched.append(lv)
        for g in lv.gpus:
            if st.primary[g] == lv.job.id:
                st.primary[g] = None
            if lv.job.id in st.guests[g]:
                st.guests[g].remove(lv.job.id)
        for child in self.children.get(lv.job.id, ()):
            self.deps_left[child] -= 1
            if self.deps_left[child] == 0 and child in self.arrived:
                self.make_pending(child, now)

    # --- actions ----------------------------------------------------------------------

    def live(self, key: StepKey) -> Live:
        job_id = self.st.by_key.get(key)
        if job_id is None or job_id not in self.lives:
            raise SimulationError(f"scheduler named an unknown step {key}", step=key)
        return self.lives[job_id]

    def apply(self, actions: Sequence[Action], now: float) -> bool:
        st = self.st
        changed = False
        for a in actions:
            if isinstance(a, Grant | StartCpu):
                lv = self.touch(self.live(a.key))
                st.pending_version += 1
                if st.pending.pop(lv.job.id, None) is None:
                    raise SimulationError(f"{a.key} granted twice", step=a.key)
                st.pending_inputs.pop(lv.job.id, None)
                if lv.job.type != "cpu":
                    st.gpu_waiting -= 1
                st.running[lv.job.id] = lv
                lv.started_at = now
                changed = True
                if isinstance(a, StartCpu):
                    lv.role = "cpu"
                    self.go(lv, now)
                    continue
                lv.gpus, lv.tier = a.gpus, a.tier
                as_guest = a.tier == "ready" or (
                    a.tier == "background" and st.primary[a.gpus[0]] is not None
                )
                if as_guest:
                    lv.role, lv.paused = "guest", True
                    st.guests[a.gpus[0]].append(lv.job.id)
                    continue
                for g in a.gpus:
                    if st.primary[g] is not None:
                        raise SimulationError(f"GPU {g} already has a primary", gpu=g)
                    st.primary[g] = lv.job.id
                lv.role = "primary"
                self.go(lv, now)
            elif isinstance(a, PauseGuest | ResumeGuest):
                lv = self.touch(self.live(a.key))
                if lv.role != "guest":
                    raise SimulationError(f"{a.key} is not a guest", step=a.key)
                lv.paused = isinstance(a, PauseGuest)
                if lv.paused and not _io_goes_on(lv):
                    self.stop(lv, now)
                else:
                    self.go(lv, now)
                changed = True
            elif isinstance(a, Promote):
                lv = self.touch(self.live(a.key))
                if st.primary[a.gpu] is not None:
                    raise SimulationError(f"GPU {a.gpu} already has a primary", gpu=a.gpu)
                self.stop(lv, now)  # closes a running guest's segment under its old role
                st.guests[a.gpu].remove(lv.job.id)
                st.primary[a.gpu] = lv.job.id
                lv.role, lv.paused = "primary", False
                if lv.tier == "ready":
                    lv.tier = "immediate"
                self.go(lv, now)
                changed = True
            elif isinstance(a, Demote):
                lv = self.touch(self.live(a.key))
                self.stop(lv, now)
                st.primary[a.gpu] = None
                st.guests[a.gpu].append(lv.job.id)
                lv.role, lv.paused = "guest", True
                changed = True
            elif isinstance(a, Move):
                self.requeue(self.touch(self.live(a.key)), a.gpu, now)
                changed = True
        return changed

    def requeue(self, lv: Live, gpu: int, now: float) -> None:
        """A guest's lease taken back (Move): it waits again, in its old place in the
        queue. It has not computed (the policy moves no other), so nothing is lost."""
        st = self.st
        if lv.role != "guest" or lv.job.id not in st.guests[gpu]:
            raise SimulationError(f"{lv.job.key} is not a guest on GPU {gpu}", step=lv.job.key)
        self.stop(lv, now)
        st.guests[gpu].remove(lv.job.id)
        del st.running[lv.job.id]
        lv.role, lv.paused, lv.gpus, lv.started_at = None, False, (), None
        st.pending[lv.job.id] = lv
        st.pending_inputs[lv.job.id] = lv.pending
        st.pending_version += 1
        st.gpu_waiting += 1


def _any_paused(st: SimState) -> bool:
    """Whether some guest is paused (GPU work waits at a gate); at every instant."""
    running = st.running
    for gs in st.guests:
        for g in gs:
            if running[g].paused:
                return True
    return False


def _io_goes_on(lv: Live) -> bool:
    """A paused guest keeps doing its own I/O and stops when that I/O ends: one that marks
    it (``m27.io_wait``) has only its gate closed; one without hints is not stopped by the
    agent while its own utilization is low, only once it computes (m27.node.guests)."""
    return lv.in_io


def simulate(trace: Trace, scheduler: Scheduler, gpus: int | None = None) -> SimResult:
    """Replay `trace` under `scheduler` until every job has ended."""
    return _Engine(trace, scheduler, gpus or trace.gpus).run()
