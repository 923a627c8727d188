"""Working state of one :func:`m27.policy.decide` call: per-GPU occupancy and queue order.

These objects live only inside one decision (they are mutable scratch space, built fresh
from the frozen input every time), so the policy stays a pure function.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from m27.policy._model import (
    OUTSIDE_MEMORY_MIN,
    GpuView,
    Pending,
    PolicyConfig,
    Running,
    StepKey,
    Tier,
)


def aged_points(queued_at: float, now: float, cfg: PolicyConfig) -> int:
    """Whole priority points earned by waiting (whole points, so equal priorities can tie
    and fair share decides between owners)."""
    if cfg.fifo or cfg.aging_per_s <= 0:
        return 0
    return min(cfg.aging_cap, int(cfg.aging_per_s * max(0.0, now - queued_at)))


def effective_priority(
    priority: int, bump: int, queued_at: float, now: float, cfg: PolicyConfig
) -> int:
    """base + bump + aging; fifo mode ignores priority entirely."""
    if cfg.fifo:
        return 0
    return priority + bump + aged_points(queued_at, now, cfg)


@dataclass(slots=True)
class Slot:
    """A step occupying a GPU in this decision: primary or guest."""

    key: StepKey
    tier: Tier
    memory: int
    eff: int
    queued_at: float
    owner: str = ""
    paused: bool = False
    fresh: bool = False
    io_waiting: bool = False
    started_at: float = 0.0
    time_limit: float | None = None
    gpus: int = 1
    #: a guest's own utilization low since then (inferred I/O; see `Running`)
    util_low_since: float | None = None
    #: a guest that has computed since its grant (see `Running.computed`)
    computed: bool = False

    @classmethod
    def of_pending(
        cls, p: Pending, eff: int, tier: Tier, paused: bool = False, started_at: float = 0.0
    ) -> Slot:
        n = p.gpus
        return cls(
            p.key,
            tier,
            p.gpu_memory,
            eff,
            p.queued_at,
            p.owner,
            paused,
            True,
            False,
            started_at,
            p.time_limit,
            n if n > 1 else 1,
        )

    def guest_rank(self) -> tuple[bool, int, float, StepKey]:
        """Which guest runs (and is promoted) first: ready before background, then order."""
        return (self.tier == "background", -self.eff, self.queued_at, self.key)

    @property
    def gpu_memory(self) -> int:
        """`memory` under the lease's name for it (gating reads Slots and leases alike)."""
        return self.memory


def lease_eff(r: Running, now: float, cfg: PolicyConfig) -> int:
    """A lease's effective priority: :func:`effective_priority`, inlined (it runs for every
    lease on every decision)."""
    if cfg.fifo:
        return 0
    if cfg.aging_per_s <= 0:
        return r.priority + r.bump
    waited = now - r.queued_at
    aged = int(cfg.aging_per_s * waited) if waited > 0 else 0
    return r.priority + r.bump + min(cfg.aging_cap, aged)


def place_leases(
    running: Iterable[Running], now: float, cfg: PolicyConfig, gpus: dict[int, GpuState]
) -> tuple[int, dict[str, int]]:
    """Each lease's Slot onto its GPUs in `gpus` (a primary on each of its GPUs, a guest in
    lease order); the CPU steps running and the GPUs held per owner. One loop, the Slots
    built in place (this runs for every lease on every full decision)."""
    fifo, rate, cap = cfg.fifo, cfg.aging_per_s, cfg.aging_cap
    slot_of = Slot
    cpu_busy = 0
    held: dict[str, int] = {}
    for r in running:
        role = r.role
        if role == "cpu":
            cpu_busy += 1
            continue
        # lease_eff, inlined
        if fifo:
            eff = 0
        elif rate <= 0:
            eff = r.priority + r.bump
        else:
            waited = now - r.queued_at
            eff = r.priority + r.bump + min(cap, int(rate * waited) if waited > 0 else 0)
        on = r.gpus
        n = len(on)
        slot = slot_of(
            r.key,
            r.tier,
            r.gpu_memory,
            eff,
            r.queued_at,
            r.owner,
            r.paused,
            False,
            r.io_waiting,
            r.started_at,
            r.time_limit,
            n if n > 1 else 1,
            r.util_low_since,
            r.computed,
        )
        if role == "primary":
            held[r.owner] = held.get(r.owner, 0) + n
            for g in on:
                st = gpus.get(g)
                if st is not None:
                    st.primary = slot
        elif on:
            st = gpus.get(on[0])
            if st is not None:
                st.guests.append(slot)
    return cpu_busy, held


def by_guest_rank(leases: list[Running], now: float, cfg: PolicyConfig) -> list[Running]:
    """`leases` in the order of :meth:`Slot.guest_rank` of the Slots they would have,
    without building them (ties, which distinct keys never leave, in list order)."""
    keyed = [
        (r.tier == "background", -lease_eff(r, now, cfg), r.queued_at, r.key, n)
        for n, r in enumerate(leases)
    ]
    keyed.sort()
    return [leases[k[4]] for k in keyed]


@dataclass(slots=True)
class GpuState:
    view: GpuView
    primary: Slot | None = None
    guests: list[Slot] = field(default_factory=list)
    reserved_for: StepKey | None = None
    reserved_gpus: int = 0
    #: the reserved step's memory need (declared or measured; 0: unknown)
    reserved_need: int = 0
    #: when the reserved step is expected to have all its GPUs (by declared limits)
    reserved_until: float = math.inf

    def outside(self) -> bool:
        """Held by work m27 did not start, and by no step of m27's: no step is placed on it
        (a primary would share it unasked and could run either out of memory) until that
        work ends; `m27 queue --why` says so."""
        return (
            self.primary is None
            and not self.guests
            and self.view.foreign_memory >= OUTSIDE_MEMORY_MIN
        )

    def used_memory(self) -> int:
        """The larger of what was observed and what the residents declared."""
        declared = 0
        for g in self.guests:
            declared += g.memory
        if self.primary is not None:
            declared += self.primary.memory
        observed = self.view.memory_used or 0
        return max(observed, declared)

    def guest_used(self) -> float:
        """The memory a new guest must fit beside: what the GPU holds, and on a GPU held
        for a reservation also what it will hold once the reserved step is its primary
        (its need beside the guests; no room at all while that need is unknown)."""
        used = self.used_memory()
        if self.reserved_for is None:
            return used
        if self.reserved_need <= 0 or any(g.memory <= 0 for g in self.guests):
            return math.inf
        return max(used, sum(g.memory for g in self.guests) + self.reserved_need)

    def free_memory(self, cfg: PolicyConfig) -> float:
        return self.view.memory_total * cfg.memory_overprovision - self.used_memory()


class Ranked(NamedTuple):
    """A pending step with its place in the queue.

    ``need`` is the memory it asks for as a guest: the declared or measured bytes,
    ``-inf`` when unknown, ``inf`` for a multi-GPU step (never a guest)."""

    pending: Pending
    eff: int
    background: bool
    need: float = 0.0


_new = tuple.__new__


def _ranked(p: Pending, eff: int, bg_max: int) -> Ranked:
    if p.gpus > 1:
        need = math.inf
    else:
        memory = p.gpu_memory or p.memory_peak
        need = float(memory) if memory > 0 else -math.inf
    return _new(Ranked, (p, eff, p.type == "gpu_light" or eff < bg_max, need))


def is_bg_host(st: GpuState, cfg: PolicyConfig) -> bool:
    """A GPU whose background primary could step aside as a guest."""
    bg = st.primary
    return (
        bg is not None
        and bg.tier == "background"
        and bg.gpus == 1
        and not bg.fresh
        and len(st.guests) + 1 <= cfg.guests_per_gpu
    )


def fits_beside(st: GpuState, p: Pending, cfg: PolicyConfig) -> bool:
    """Whether `p` fits as the primary beside the guests loaded on a free GPU (an unknown
    need, or a GPU of unknown size, is not judged here, as on a GPU with no guests)."""
    cap = st.view.memory_total * cfg.memory_overprovision
    need = p.gpu_memory or p.memory_peak
    return cap <= 0 or need <= 0 or st.used_memory() + need <= cap


def room_beside(st: GpuState, memory: int, cfg: PolicyConfig) -> bool:
    """Whether `memory` fits beside what a GPU holds (never on one held by a reservation)."""
    if st.reserved_for is not None:
        return False
    cap = st.view.memory_total * cfg.memory_overprovision
    return cap > 0 and st.used_memory() + memory <= cap


class Queues(NamedTuple):
    """The ranked queue split the way the placement pass reads it."""

    cpu: Iterable[Ranked]
    gpu: Iterable[Ranked]
    background: Iterable[Ranked]
    guest: Iterable[Ranked]


#: The split of the last ranked list (the same object again when the order was reused).
_queues_memo: tuple[list[Ranked], int, Queues] | None = None


class _Lane:
    """One split queue read straight from the ranked list, as far as a pass reads it (a
    busy node's pass stops early): iterable again and again, never materialized."""

    __slots__ = ("bg_max", "kind", "ranked")

    def __init__(self, ranked: list[Ranked], kind: int, bg_max: int) -> None:
        self.ranked, self.kind, self.bg_max = ranked, kind, bg_max

    def __iter__(self) -> Iterator[Ranked]:
        ranked, bg_max = self.ranked, self.bg_max
        if self.kind == 0:
            return (r for r in ranked if r.pending.type == "cpu")
        if self.kind == 1:
            return (r for r in ranked if not r.background and r.pending.type != "cpu")
        if self.kind == 2:
            return (r for r in ranked if r.background and r.pending.type != "cpu")
        return (
            r
            for r in ranked
            if r.pending.type != "cpu"
            and (not r.background or (r.pending.type == "gpu_light" and r.eff >= bg_max))
        )


def split_queues(ranked: list[Ranked], cfg: PolicyConfig, lazy: bool = False) -> Queues:
    """cpu steps, gpu steps, background steps, and guest candidates (gpu steps and the
    gpu_light steps at or above the background bound), each in rank order. `lazy`: read
    from `ranked` as the pass goes (for a pass that may stop early), unless the lists for
    this order are at hand."""
    global _queues_memo
    bg_max = cfg.background_priority_max
    memo = _queues_memo
    if memo is not None and memo[0] is ranked and memo[1] == bg_max:
        return memo[2]
    if lazy:
        return Queues(*(_Lane(ranked, kind, bg_max) for kind in range(4)))
    cpu_q = [r for r in ranked if r.pending.type == "cpu"]
    gpu_q = [r for r in ranked if r.pending.type != "cpu" and not r.background]
    bg_q = [r for r in ranked if r.pending.type != "cpu" and r.background]
    guest_q = [
        r
        for r in ranked
        if r.pending.type != "cpu"
        and (not r.background or (r.pending.type == "gpu_light" and r.eff >= bg_max))
    ]
    q = Queues(cpu_q, gpu_q, bg_q, guest_q)
    _queues_memo = (ranked, bg_max, q)
    return q
