"""Working state of one :func:`m27.policy.decide` call: per-GPU occupancy and queue order.

These objects live only inside one decision (they are mutable scratch space, built fresh
from the frozen input every time), so the policy stays a pure function.
"""

from __future__ import annotations

import math
from bisect import insort
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


class _Static(NamedTuple):
    """What the order takes from a pending tuple that does not move with the clock: each
    step's place by (owner, queued_at, key) and by (queued_at, key), both ways round, so
    a sort key is one integer instead of a tuple."""

    owners: tuple[str, ...]
    owner_of: list[str]
    base: list[int]
    queued: list[float]
    srank: list[int]
    sinv: list[int]
    qrank: list[int]
    qinv: list[int]


def _static(pending: Sequence[Pending]) -> _Static:
    n = len(pending)
    sinv = sorted(range(n), key=lambda i: (pending[i].owner, pending[i].queued_at, pending[i].key))
    qinv = sorted(range(n), key=lambda i: (pending[i].queued_at, pending[i].key))
    srank = [0] * n
    qrank = [0] * n
    for r, i in enumerate(sinv):
        srank[i] = r
    for r, i in enumerate(qinv):
        qrank[i] = r
    owner_of = [p.owner for p in pending]
    return _Static(
        tuple(sorted(set(owner_of))),
        owner_of,
        [p.priority + p.bump for p in pending],
        [p.queued_at for p in pending],
        srank,
        sinv,
        qrank,
        qinv,
    )


class _RankMemo(NamedTuple):
    """The last queue order, and what it was computed from (see :func:`order_pending`)."""

    pending: Sequence[Pending]
    cfg: PolicyConfig
    static: _Static
    effs: list[int]
    share: tuple[tuple[int, int], ...]
    result: list[Ranked]
    #: one Ranked per pending position, reused while its effective priority stays
    by_index: list[Ranked]
    #: the packed sort key per pending position (see `_rank`)
    key_of: list[int]
    #: with several owners: (-eff, owner) -> the srank of its steps, in order
    groups: dict[tuple[int, str], list[int]]


#: One entry: the agent and the simulator call decide() again and again with the same
#: pending tuple (the same object) while only the clock and the leases move. It is keyed on
#: that immutable tuple (held here, so its identity cannot be reused) and on everything else
#: the order depends on, so it can never change a decision; callers never mutate the list.
_memo: _RankMemo | None = None


def _share_key(
    owners: tuple[str, ...], held: Mapping[str, int], usage: Mapping[str, float]
) -> tuple[tuple[int, int], ...]:
    """What the fair-share sort looks at: GPUs held per owner, and how the owners' recent
    usage compares (its rank, ties kept), not its value, which decays on every call."""
    vals = [usage.get(o, 0.0) for o in owners]
    levels = sorted(set(vals))
    return tuple((held.get(o, 0), levels.index(v)) for o, v in zip(owners, vals, strict=True))


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
    now (then the one with less recent GPU time) goes first. The returned list is shared
    with later calls that would compute the same order: read it, never change it.
    """
    global _memo
    if cfg.fifo:
        return [Ranked(p, 0, False) for p in sorted(pending, key=lambda p: (p.queued_at, p.key))]
    rate, cap = max(0.0, cfg.aging_per_s), cfg.aging_cap
    memo = _memo
    bg_max = cfg.background_priority_max
    same = memo is not None and memo.pending is pending and memo.cfg == cfg
    st = memo.static if same and memo is not None else _static(pending)
    effs = [
        b + (min(cap, int(rate * (now - q))) if now > q else 0)
        for b, q in zip(st.base, st.queued, strict=True)
    ]
    owners = st.owners
    share = _share_key(owners, held, usage) if len(owners) > 1 else ()
    if same and memo is not None:
        if memo.effs == effs and memo.share == share:
            return memo.result
        by_index = memo.by_index
        if memo.effs != effs:
            by_index = [
                old if old.eff == e else _ranked(p, e, bg_max)
                for old, e, p in zip(by_index, effs, pending, strict=True)
            ]
        if _width(st, memo.share) == _width(st, share):
            # some steps aged, or an owner's share changed: re-key only their groups
            _memo = None  # the groups are updated in place below
            key_of, groups = _rekey(st, memo, effs, share)
            qinv, n = st.qinv if share else st.sinv, len(effs)
            result = [by_index[qinv[k % n]] for k in sorted(key_of)]
            _memo = _RankMemo(pending, cfg, st, effs, share, result, by_index, key_of, groups)
            return result
    else:
        by_index = [_ranked(p, e, bg_max) for p, e in zip(pending, effs, strict=True)]
    result, key_of, groups = _rank(st, effs, share, by_index)
    _memo = _RankMemo(pending, cfg, st, effs, share, result, by_index, key_of, groups)
    return result


def _packing(
    st: _Static, share: tuple[tuple[int, int], ...]
) -> tuple[dict[str, int], dict[str, int], int, int]:
    hold = {o: h for o, (h, _) in zip(st.owners, share, strict=True)}
    level = {o: lv for o, (_, lv) in zip(st.owners, share, strict=True)}
    return hold, level, _width(st, share), len(st.owners)


def _width(st: _Static, share: tuple[tuple[int, int], ...]) -> int:
    """The packing room for held + place (held + place < width), the same for most shares,
    so a change of one owner's share re-keys only that owner's steps."""
    if not share:
        return 0
    return len(st.owner_of) + max(64, max(h for h, _ in share) + 1)


def _rekey(
    st: _Static, memo: _RankMemo, effs: list[int], share: tuple[tuple[int, int], ...]
) -> tuple[list[int], dict[tuple[int, str], list[int]]]:
    """The sort keys after some steps' effective priority or some owners' share changed
    (with the same packing width)."""
    n = len(effs)
    key_of = memo.key_of[:]
    old = memo.effs
    changed = [i for i, (a, b) in enumerate(zip(effs, old, strict=True)) if a != b]
    srank = st.srank
    if not share:
        for i in changed:
            key_of[i] = -effs[i] * n + srank[i]
        return key_of, memo.groups
    groups = memo.groups
    owner_of, sinv, qrank = st.owner_of, st.sinv, st.qrank
    touched: set[tuple[int, str]] = set()
    for i in changed:
        owner = owner_of[i]
        was, now = (-old[i], owner), (-effs[i], owner)
        members = groups[was]
        members.remove(srank[i])
        if not members:
            del groups[was]
        insort(groups.setdefault(now, []), srank[i])
        touched.add(was)
        touched.add(now)
    if share != memo.share:
        moved = {o for o, a, b in zip(st.owners, share, memo.share, strict=True) if a != b}
        touched.update(g for g in groups if g[1] in moved)
    hold, level, width, levels = _packing(st, share)
    for group in touched:
        members = groups.get(group, [])
        neg, owner = group
        start = neg * width + hold[owner]
        lv = level[owner]
        for place, r in enumerate(members):
            i = sinv[r]
            key_of[i] = ((start + place) * levels + lv) * n + qrank[i]
    return key_of, groups


def _rank(
    st: _Static, effs: list[int], share: tuple[tuple[int, int], ...], by_index: list[Ranked]
) -> tuple[list[Ranked], list[int], dict[tuple[int, str], list[int]]]:
    """The order as integer keys: (-eff, owner, queued_at, key) is -eff * n + srank; with
    several owners, (-eff, held + place, usage, queued_at, key) is packed the same way."""
    n = len(effs)
    srank = st.srank
    key_of = [-e * n + r for e, r in zip(effs, srank, strict=True)]
    first = sorted(key_of)
    sinv = st.sinv
    if not share:
        return [by_index[sinv[k % n]] for k in first], key_of, {}
    hold, level, width, levels = _packing(st, share)
    owner_of, qrank = st.owner_of, st.qrank
    groups: dict[tuple[int, str], list[int]] = {}
    members: list[int] = []
    prev_neg: int | None = None
    prev_owner = ""
    place = 0
    for k in first:
        neg, r = divmod(k, n)
        i = sinv[r]
        owner = owner_of[i]
        if neg == prev_neg and owner == prev_owner:
            place += 1
        else:
            place, prev_neg, prev_owner = 0, neg, owner
            members = groups[(neg, owner)] = []
        members.append(r)
        key_of[i] = ((neg * width + hold[owner] + place) * levels + level[owner]) * n + qrank[i]
    qinv = st.qinv
    return [by_index[qinv[k % n]] for k in sorted(key_of)], key_of, groups


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


class Queues(NamedTuple):
    """The ranked queue split the way the placement pass reads it."""

    cpu: list[Ranked]
    gpu: list[Ranked]
    background: list[Ranked]
    guest: list[Ranked]


#: The split of the last ranked list (the same object again when the order was reused).
_queues_memo: tuple[list[Ranked], int, Queues] | None = None


def split_queues(ranked: list[Ranked], cfg: PolicyConfig) -> Queues:
    """cpu steps, gpu steps, background steps, and guest candidates (gpu steps and the
    gpu_light steps at or above the background bound), each in rank order."""
    global _queues_memo
    bg_max = cfg.background_priority_max
    memo = _queues_memo
    if memo is not None and memo[0] is ranked and memo[1] == bg_max:
        return memo[2]
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
