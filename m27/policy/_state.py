"""Working state of one :func:`m27.policy.decide` call: per-GPU occupancy and queue order.

These objects live only inside one decision (they are mutable scratch space, built fresh
from the frozen input every time), so the policy stays a pure function.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from m27.policy._model import GpuView, Pending, PolicyConfig, Running, StepKey, Tier


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

    @classmethod
    def of_running(cls, r: Running, now: float, cfg: PolicyConfig) -> Slot:
        # effective_priority, inlined: this runs for every lease on every decision.
        if cfg.fifo:
            eff = 0
        elif cfg.aging_per_s <= 0:
            eff = r.priority + r.bump
        else:
            waited = now - r.queued_at
            aged = int(cfg.aging_per_s * waited) if waited > 0 else 0
            eff = r.priority + r.bump + min(cfg.aging_cap, aged)
        n = len(r.gpus)
        return cls(
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
        )

    @classmethod
    def of_pending(
        cls, p: Pending, eff: int, tier: Tier, paused: bool = False, started_at: float = 0.0
    ) -> Slot:
        return cls(
            key=p.key,
            tier=tier,
            memory=p.gpu_memory,
            eff=eff,
            queued_at=p.queued_at,
            owner=p.owner,
            paused=paused,
            fresh=True,
            started_at=started_at,
            time_limit=p.time_limit,
            gpus=max(1, p.gpus),
        )

    def guest_rank(self) -> tuple[bool, int, float, StepKey]:
        """Which guest runs (and is promoted) first: ready before background, then order."""
        return (self.tier == "background", -self.eff, self.queued_at, self.key)


@dataclass(slots=True)
class GpuState:
    view: GpuView
    primary: Slot | None = None
    guests: list[Slot] = field(default_factory=list)
    reserved_for: StepKey | None = None
    reserved_gpus: int = 0

    def used_memory(self) -> int:
        """The larger of what was observed and what the residents declared."""
        declared = sum(g.memory for g in self.guests)
        if self.primary is not None:
            declared += self.primary.memory
        observed = self.view.memory_used or 0
        return max(observed, declared)

    def free_memory(self, cfg: PolicyConfig) -> float:
        return self.view.memory_total * cfg.memory_overprovision - self.used_memory()


class Ranked(NamedTuple):
    """A pending step with its place in the queue."""

    pending: Pending
    eff: int
    background: bool


def order_pending(
    pending: Sequence[Pending],
    held: Mapping[str, int],
    usage: Mapping[str, float],
    now: float,
    cfg: PolicyConfig,
) -> list[Ranked]:
    """Queue order: effective priority, then fair share, then queue time, then key.

    Fair share at equal priority interleaves owners: an owner's n-th waiting step counts as
    if the owner held n more GPUs, so two owners alternate and the one holding fewer GPUs
    now (then the one with less recent GPU time) goes first.
    """
    if cfg.fifo:
        return [Ranked(p, 0, False) for p in sorted(pending, key=lambda p: (p.queued_at, p.key))]
    bg_max = cfg.background_priority_max
    rate, cap = max(0.0, cfg.aging_per_s), cfg.aging_cap
    items = [
        (
            -(
                p.priority
                + p.bump
                + (min(cap, int(rate * (now - p.queued_at))) if now > p.queued_at else 0)
            ),
            p.owner,
            p.queued_at,
            p.key,
            p,
        )
        for p in pending
    ]
    items.sort()  # keys are unique, so the Pending objects themselves are never compared
    if len({t[1] for t in items}) > 1:
        keyed = []
        prev: tuple[int, str] | None = None
        n = 0
        for neg, owner, queued_at, key, p in items:
            group = (neg, owner)
            n = n + 1 if group == prev else 0
            prev = group
            keyed.append((neg, held.get(owner, 0) + n, usage.get(owner, 0.0), queued_at, key, p))
        keyed.sort()
        return [Ranked(t[5], -t[0], t[5].type == "gpu_light" or -t[0] < bg_max) for t in keyed]
    return [Ranked(t[4], -t[0], t[4].type == "gpu_light" or -t[0] < bg_max) for t in items]


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


def room_beside(st: GpuState, memory: int, cfg: PolicyConfig) -> bool:
    """Whether `memory` fits beside what a GPU holds (never on one held by a reservation)."""
    if st.reserved_for is not None:
        return False
    cap = st.view.memory_total * cfg.memory_overprovision
    return cap > 0 and st.used_memory() + memory <= cap
