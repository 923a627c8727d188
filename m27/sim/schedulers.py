"""Who decides in a simulation: m27's own policy, and the baselines it is compared with.

`m27` and `fifo` call :func:`m27.policy.decide` unchanged (fifo through
``PolicyConfig(fifo=True)``). `backfill` (Slurm-like EASY backfill on declared time
limits) and `manual` (a person who starts the next job after a delay, in working hours)
are not m27's policy, so they live here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import fields, replace
from typing import Any, TypeVar

from m27.policy import (
    Action,
    GpuView,
    Grant,
    Pending,
    PolicyConfig,
    PolicyInput,
    Running,
    StartCpu,
    decide,
)
from m27.sim.engine import Live, SimState

POLICIES = ("manual", "fifo", "backfill", "m27")

#: Marks a GPU whose view was never built (no lease memo is this object).
_UNSEEN = object()

_T = TypeVar("_T")


def _plain_template(sample: object) -> dict[str, Any] | None:
    """Every field of a frozen dataclass instance, defaults included, when its instances
    can be built by filling `__dict__` (no `__post_init__`, no slots); else None."""
    if hasattr(type(sample), "__post_init__") or not hasattr(sample, "__dict__"):
        return None
    return dict(vars(sample))


def _frozen(cls: type[_T], template: dict[str, Any] | None, values: dict[str, Any]) -> _T:
    """An instance of the frozen dataclass `cls` equal to ``cls(**values)``.

    The generated ``__init__`` of a frozen dataclass sets each field through
    ``object.__setattr__`` (7-9 us for a `PolicyInput` or a `Running` on this machine, ~1 us
    this way); the simulator builds one input per decision and a lease view per lease
    change. A field added later gets its default from `template` (a real instance);
    ``tests/unit/test_sim.py`` checks the result against the real constructor."""
    if template is None:
        return cls(**values)
    obj: _T = object.__new__(cls)
    d = obj.__dict__
    d.update(template)
    d.update(values)
    return obj


_RUNNING = _plain_template(Running(key=("", "")))
_GPU_VIEW = _plain_template(GpuView(0))
#: PolicyInput has exactly the fields the simulator sets one by one (else: its constructor)
_INPUT_PLAIN = _plain_template(PolicyInput((), (), (), 0.0)) is not None and [
    f.name for f in fields(PolicyInput)
] == ["pending", "running", "gpus", "now", "config", "usage_by_owner"]


class PolicyScheduler:
    """Drives :func:`m27.policy.decide` from the simulated node, as the agent would."""

    def __init__(self, config: PolicyConfig, name: str = "m27", usage_half_life: float = 3600.0):
        self.name = name
        self.config = config
        self._tau = usage_half_life / math.log(2)
        self._usage: dict[str, float] = {}
        self._last = 0.0
        #: the last input handed to decide (tests compare it with a direct call).
        self.last_input: PolicyInput | None = None
        #: per GPU: the primary (or None) and its phase that the view was built for
        self._views: list[tuple[object, int, GpuView | None]] = []
        self._gpu_views: tuple[GpuView, ...] = ()
        #: per (GPU, has a primary): the view while nobody is in I/O there (it never varies)
        self._steady: dict[tuple[int, bool], GpuView] = {}
        self._state: SimState | None = None
        self._lease_version = -1
        self._pending_version = -1
        self._running: tuple[Running, ...] = ()
        #: (owner, GPUs) of each primary lease, for GPU time per owner (None: to build)
        self._primaries: list[tuple[str, int]] | None = None
        self._by_id: dict[str, Running] = {}
        self._pending: tuple[Pending, ...] = ()

    def step(self, state: SimState) -> tuple[Sequence[Action], float | None]:
        now = state.now
        if state is not self._state:
            if self.config.cpu_slots != state.trace.cpu_slots:
                self.config = replace(self.config, cpu_slots=state.trace.cpu_slots)
            self._start(state)
        # Recent GPU-seconds per owner, decaying with a half-life, for fair share.
        usage = self._usage
        dt = now - self._last
        self._last = now
        if dt > 0:
            decay = math.exp(-dt / self._tau)
            for owner in usage:
                usage[owner] *= decay
        # A lease's frozen input changes only with its role, tier, pause or I/O flag; the
        # engine lists the leases it changed (or whose phase moved) in `touched` and bumps
        # `lease_version`, so only their views (and the GPU views of primaries whose phase
        # moved) are rebuilt, and the rest is reused.
        if state.lease_version != self._lease_version:
            self._leases(state)
        if dt > 0:
            primaries = self._primaries
            if primaries is None:
                primaries = self._primaries = [
                    (r.owner, len(r.gpus)) for r in self._running if r.role == "primary"
                ]
            for owner, n in primaries:
                usage[owner] = usage.get(owner, 0.0) + dt * n
        if state.pending_version != self._pending_version:
            self._pending_version = state.pending_version
            inputs = state.pending_inputs
            if len(inputs) == len(state.pending):
                self._pending = tuple(inputs.values())
            else:  # a state built by hand (tests): from the waiting steps themselves
                self._pending = tuple([lv.pending for lv in state.pending.values()])
        if _INPUT_PLAIN:
            inp = object.__new__(PolicyInput)  # see _frozen: one input per decision
            f = inp.__dict__
            f["pending"], f["running"], f["gpus"] = self._pending, self._running, self._gpu_views
            f["now"], f["config"], f["usage_by_owner"] = now, self.config, usage
        else:
            views, cfg = self._gpu_views, self.config
            inp = PolicyInput(self._pending, self._running, views, now, cfg, usage)
        self.last_input = inp
        d = decide(inp)
        return d.actions, d.next_check

    def _start(self, state: SimState) -> None:
        """A new simulation (or a first look at it): every lease and GPU view afresh."""
        self._state = state
        by_id = self._by_id
        by_id.clear()
        for job_id, lv in state.running.items():
            by_id[job_id] = lv.memo = _running(lv)
        state.touched.clear()
        self._views = [(_UNSEEN, -1, None)] * state.gpus
        self._steady.clear()
        self._pending_version = -1
        self._lease_version = state.lease_version
        self._arrange(state)

    def _leases(self, state: SimState) -> None:
        # Only the leases the engine touched since the last look can have a new view; the
        # others keep theirs. `by_id` mirrors `state.running` in its order (a changed
        # lease keeps its place, a new one comes last, an ended one goes), so the input
        # is the one a full rebuild would give.
        self._lease_version = state.lease_version
        by_id = self._by_id
        live = state.running
        moved = False
        gpus: set[int] = set()  # where a primary (or its phase) may have moved
        for lv in state.touched:
            gpus.update(lv.gpus)
            job_id = lv.job.id
            if job_id in live:
                r = lv.memo
                if (
                    r is None
                    or r.io_waiting != (lv.job.io_hint and lv.role != "cpu" and lv.in_io)
                    or r.util_low_since != _low_since(lv)
                ):
                    r = lv.memo = _running(lv)
                if by_id.get(job_id) is not r:
                    by_id[job_id] = r
                    moved = True
            elif by_id.pop(job_id, None) is not None:
                moved = True
        state.touched.clear()
        if moved:
            self._running = tuple(by_id.values())
            self._primaries = None  # built when GPU time is next counted
        self._gpu_views_of(state, gpus)

    def _arrange(self, state: SimState) -> None:
        self._running = tuple(self._by_id.values())
        self._primaries = None
        self._gpu_views_of(state, range(state.gpus))

    def _gpu_views_of(self, state: SimState, gpus: Iterable[int]) -> None:
        """A GPU's view follows its primary and the primary's phase (I/O or not, since
        when): rebuilt only where either moved (only a touched lease's GPUs can have)."""
        cache = self._views
        leases = state.running
        changed = False
        for g in gpus:
            prim_id = state.primary[g]
            prim = leases[prim_id] if prim_id is not None else None
            seen, phase, _ = cache[g]
            if seen is not prim or (prim is not None and phase != prim.phase):
                cache[g] = (prim, prim.phase if prim is not None else -1, self._view(state, g))
                changed = True
        if changed:
            self._gpu_views = tuple([v for _, _, v in cache if v is not None])

    def _view(self, state: SimState, g: int) -> GpuView:
        """What the agent's samples would say: no utilization while the primary is in I/O."""
        memory = state.trace.gpu_memory
        prim_id = state.primary[g]
        prim = state.running[prim_id] if prim_id is not None else None
        if prim is not None and prim.in_io:
            return _io_view(g, memory, prim.phase_started)
        view = self._steady.get((g, prim is not None))
        if view is None:
            view = GpuView(g, memory, None, False, 100.0 if prim else None, None)
            self._steady[(g, prim is not None)] = view
        return view


def _io_view(g: int, memory: int, since: float) -> GpuView:
    """GPU `g` while its primary waits on I/O since `since` (one per such phase)."""
    values: dict[str, Any] = {"index": g, "memory_total": memory, "memory_used": None}
    values["lost"], values["primary_util"], values["util_low_since"] = False, 0.0, since
    return _frozen(GpuView, _GPU_VIEW, values)


def _running(lv: Live) -> Running:
    assert lv.role is not None
    job = lv.job
    return _frozen(
        Running,
        _RUNNING,
        {
            "key": lv.pending.key,
            "type": job.type,
            "role": lv.role,
            "tier": lv.tier,
            "gpus": lv.gpus,
            "paused": lv.paused,
            "gpu_memory": job.gpu_memory,
            "priority": job.priority,
            "owner": job.owner,
            "queued_at": lv.queued_at,
            "started_at": lv.started_at or 0.0,
            "time_limit": job.time_limit,
            "io_waiting": job.io_hint and lv.role != "cpu" and lv.in_io,
            "util_low_since": _low_since(lv),
            "computed": lv.role == "guest" and _progressed(lv),
        },
    )


def _progressed(lv: Live) -> bool:
    """Whether the job has run at all (a guest that has is never moved to a free GPU)."""
    phases = lv.job.phases
    return lv.since is not None or lv.phase > 0 or (bool(phases) and lv.remaining < phases[0][1])


def _low_since(lv: Live) -> float | None:
    """What the agent's samples would say of a guest that gives no I/O hint: its own
    utilization is low since its I/O phase began (it can only enter one while it runs: a
    paused guest without a hint stands still, and the agent keeps the time while it is
    paused). Hinted steps and primaries report none (their hint, or the GPU view)."""
    if lv.role != "guest" or lv.job.io_hint or not lv.in_io:
        return None
    return lv.phase_started


def _free_gpus(state: SimState) -> list[int]:
    return [g for g in range(state.gpus) if state.primary[g] is None]


class BackfillScheduler:
    """EASY backfill, exclusive GPUs: the queue head gets a reservation at the earliest
    time the declared limits of running jobs promise enough GPUs; a later job may start now
    only if it ends (by its declared limit) before that, or uses GPUs the head won't need."""

    name = "backfill"

    def step(self, state: SimState) -> tuple[Sequence[Action], float | None]:
        now = state.now
        actions: list[Action] = _cpu_fifo(state)
        free = _free_gpus(state)
        queue = sorted(
            (lv for lv in state.pending.values() if lv.job.type != "cpu"),
            key=lambda lv: (lv.queued_at, lv.job.id),
        )
        shadow: float | None = None
        extra = 0
        for lv in queue:
            k = max(1, lv.job.gpus)
            if k > state.gpus:
                continue
            limit = lv.job.time_limit if lv.job.time_limit is not None else math.inf
            if shadow is None:
                if k <= len(free):
                    actions.append(Grant(lv.job.key, tuple(free[:k]), "immediate"))
                    free = free[k:]
                    continue
                shadow, extra = self._shadow(state, now, k, len(free), actions)
                continue
            if k > len(free):
                continue
            if now + limit <= shadow:
                actions.append(Grant(lv.job.key, tuple(free[:k]), "immediate"))
                free = free[k:]
            elif k <= extra:
                actions.append(Grant(lv.job.key, tuple(free[:k]), "immediate"))
                free = free[k:]
                extra -= k
        return actions, None

    @staticmethod
    def _shadow(
        state: SimState, now: float, need: int, free: int, started: list[Action]
    ) -> tuple[float, int]:
        ends: list[tuple[float, int]] = []
        for lv in state.running.values():
            if lv.role == "primary":
                limit = lv.job.time_limit if lv.job.time_limit is not None else math.inf
                ends.append((max(now, (lv.started_at or now) + limit), len(lv.gpus)))
        for a in started:
            if isinstance(a, Grant):
                lv = state.pending[state.by_key[a.key]]
                limit = lv.job.time_limit if lv.job.time_limit is not None else math.inf
                ends.append((now + limit, len(a.gpus)))
        avail = free
        for t, n in sorted(ends):
            avail += n
            if avail >= need:
                return t, avail - need
        return math.inf, 0


class ManualScheduler:
    """A person: notices a free GPU (or a finished upstream step) after `delay` seconds,
    only between `day_start` and `day_end` hours (trace time 0 is a midnight), then starts
    queued jobs in order on every free GPU (exclusive)."""

    name = "manual"

    def __init__(self, delay: float = 1800.0, day_start: float = 9.0, day_end: float = 18.0):
        self.delay = delay
        self.day = (day_start * 3600.0, day_end * 3600.0)
        self._due: float | None = None

    def working(self, t: float) -> float:
        """The first moment at or after `t` when someone is in the lab."""
        day, into = divmod(t, 86400.0)
        start, end = self.day
        if into < start:
            return day * 86400.0 + start
        if into >= end:
            return (day + 1) * 86400.0 + start
        return t

    def step(self, state: SimState) -> tuple[Sequence[Action], float | None]:
        now = state.now
        free = _free_gpus(state)
        cpu_free = state.trace.cpu_slots - state.cpu_running
        chance = any(
            (lv.job.type == "cpu" and cpu_free > 0)
            or (lv.job.type != "cpu" and max(1, lv.job.gpus) <= len(free))
            for lv in state.pending.values()
        )
        if not chance:
            self._due = None
            return [], None
        if self._due is None:
            self._due = self.working(now + self.delay)
        if now < self._due:
            return [], self._due
        self._due = None
        actions: list[Action] = _cpu_fifo(state)
        for lv in sorted(state.pending.values(), key=lambda lv: (lv.queued_at, lv.job.id)):
            k = max(1, lv.job.gpus)
            if lv.job.type != "cpu" and k <= len(free):
                actions.append(Grant(lv.job.key, tuple(free[:k]), "immediate"))
                free = free[k:]
        return actions, None


def _cpu_fifo(state: SimState) -> list[Action]:
    slots = state.trace.cpu_slots - state.cpu_running
    out: list[Action] = []
    for lv in sorted(state.pending.values(), key=lambda lv: (lv.queued_at, lv.job.id)):
        if slots <= 0:
            break
        if lv.job.type == "cpu":
            out.append(StartCpu(lv.job.key))
            slots -= 1
    return out


def make_scheduler(
    name: str, config: PolicyConfig | None = None
) -> PolicyScheduler | BackfillScheduler | ManualScheduler:
    """A fresh scheduler by name (one per simulation: some keep state)."""
    cfg = config or PolicyConfig()
    if name == "m27":
        return PolicyScheduler(cfg, "m27")
    if name == "fifo":
        return PolicyScheduler(replace(cfg, fifo=True), "fifo")
    if name == "backfill":
        return BackfillScheduler()
    if name == "manual":
        return ManualScheduler()
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
