"""The queue order of :func:`m27.policy.decide`, kept between calls and computed in arrays.

The agent and the simulator call ``decide()`` again and again with the same pending tuple
(the same object) while only the clock and the leases move; on a long queue the order is
most of a decision's cost. Two things keep it cheap without changing any decision:

- aging is tracked per step by the time it may next earn a point (a heap), so a call
  looks only at the steps whose effective priority can have changed;
- when anything the order depends on changed (a step aged, an owner's GPUs held or rank
  of recent usage, a new pending tuple), the packed integer sort keys are recomputed for
  the whole queue with numpy and sorted once: a few array operations instead of a Python
  loop per step. Steps that stay in the queue keep their :class:`Ranked` object.

The memo is keyed on the pending tuple's identity (it holds the tuple, so the identity
cannot be reused) and on everything else the order depends on, so it can never change a
decision: the policy stays a pure function of its input.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from heapq import heapify, heappop, heappush
from operator import itemgetter
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from m27.policy._model import Pending, PolicyConfig, StepKey
from m27.policy._state import Ranked, _ranked

_Ints = npt.NDArray[np.int64]


class _Static(NamedTuple):
    """What the order takes from a pending tuple that does not move with the clock: each
    step's place by (owner, queued_at, tie) and by (queued_at, tie) (:func:`_tie`), so a
    sort key is one integer instead of a tuple."""

    owners: tuple[str, ...]
    #: per position: the owner's index in `owners`
    owner_ix: _Ints
    base: _Ints
    queued: npt.NDArray[np.float64]
    base_l: list[int]
    queued_l: list[float]
    srank: _Ints
    qrank: _Ints


def _static(pending: Sequence[Pending]) -> _Static:
    n = len(pending)
    queued = [p.queued_at for p in pending]
    owner_of = [p.owner for p in pending]
    # the position last in each tuple: the same tie order as a stable sort
    ties = [_tie(p) for p in pending]
    sinv = [t[3] for t in sorted(zip(owner_of, queued, ties, range(n), strict=True))]
    qinv = [t[2] for t in sorted(zip(queued, ties, range(n), strict=True))]
    return _finish(pending, owner_of, queued, sinv, qinv)


def _finish(
    pending: Sequence[Pending],
    owner_of: list[str],
    queued: list[float],
    sinv: list[int],
    qinv: list[int],
) -> _Static:
    owners = tuple(sorted(set(owner_of)))
    index = {o: j for j, o in enumerate(owners)}
    base = [p.priority + p.bump for p in pending]
    return _Static(
        owners,
        np.array([index[o] for o in owner_of], np.int64),
        np.array(base, np.int64),
        np.array(queued, np.float64),
        base,
        queued,
        _inverse(sinv),
        _inverse(qinv),
    )


def _static_from(old: _Static, pending: Sequence[Pending], old_ix: list[int]) -> _Static | None:
    """The static part for a pending tuple that keeps most steps of the last one (a grant
    removes steps, an arrival adds one), taken from the last one's arrays: the kept steps
    keep their relative order (keys are unique, so no tie depends on a position), the new
    ones are placed by binary search. None when much is new (a full sort is cheaper)."""
    n = len(pending)
    oi = np.array(old_ix, np.int64)
    fresh: list[int] = np.flatnonzero(oi < 0).tolist()
    if len(fresh) * 8 > n:
        return None
    kept = np.flatnonzero(oi >= 0)
    from_old = oi[kept]
    sinv: list[int] = kept[np.argsort(old.srank[from_old])].tolist()
    qinv: list[int] = kept[np.argsort(old.qrank[from_old])].tolist()
    base = np.empty(n, np.int64)
    base[kept] = old.base[from_old]
    queued = np.empty(n, np.float64)
    queued[kept] = old.queued[from_old]
    owner_ix = np.empty(n, np.int64)
    owner_ix[kept] = old.owner_ix[from_old]
    names = list(old.owners)
    index = {o: j for j, o in enumerate(names)}

    def skey(j: int) -> tuple[str, float, tuple[int, StepKey]]:
        p = pending[j]
        return (p.owner, p.queued_at, _tie(p))

    def qkey(j: int) -> tuple[float, tuple[int, StepKey]]:
        p = pending[j]
        return (p.queued_at, _tie(p))

    for j in fresh:
        p = pending[j]
        sinv.insert(bisect_left(sinv, skey(j), key=skey), j)
        qinv.insert(bisect_left(qinv, qkey(j), key=qkey), j)
        base[j], queued[j] = p.priority + p.bump, p.queued_at
        if p.owner not in index:
            index[p.owner] = len(names)
            names.append(p.owner)
        owner_ix[j] = index[p.owner]
    used: list[int] = np.unique(owner_ix).tolist()
    owners = tuple(sorted(names[u] for u in used))
    if list(owners) != names:  # an owner left or came: renumber
        remap = np.zeros(len(names), np.int64)
        for u in used:
            remap[u] = owners.index(names[u])
        owner_ix = remap[owner_ix]
    return _Static(
        owners,
        owner_ix,
        base,
        queued,
        base.tolist(),
        queued.tolist(),
        _inverse(sinv),
        _inverse(qinv),
    )


def _tie(p: Pending) -> tuple[int, StepKey]:
    """What breaks a tie of rank and queue time: the larger GPU need first (GPUs times
    memory, declared or measured), then the key. Steps queued together (a backlog, a
    sweep) start in decreasing size, as first-fit-decreasing packs bins: a big step
    started first still finds small ones to load as guests beside it; started last, it
    finds none left and its I/O waits idle."""
    return (-max(1, p.gpus) * (p.gpu_memory or p.memory_peak), p.key)


def _inverse(perm: list[int]) -> _Ints:
    rank = np.empty(len(perm), np.int64)
    rank[perm] = np.arange(len(perm))
    return rank


@dataclass(slots=True)
class _Memo:
    """The last queue order, and what it was computed from (see :func:`order_pending`)."""

    pending: Sequence[Pending]
    cfg: PolicyConfig
    static: _Static
    now: float
    effs: _Ints
    #: (a time a little before a step may next earn an aging point, its position): a
    #: min-heap, built when the memo is first reused
    ages: list[tuple[float, int]] | None
    share: tuple[tuple[int, int], ...]
    result: list[Ranked]
    #: one Ranked per pending position, replaced when its effective priority changes
    by_index: list[Ranked]


_memo: _Memo | None = None


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
    """Queue order: effective priority, then fair share, then queue time, then the larger
    GPU need, then key (:func:`_tie`).

    Fair share at equal priority interleaves owners: an owner's n-th waiting step counts as
    if the owner held n more GPUs, so two owners alternate and the one holding fewer GPUs
    now (then the one with less recent GPU time) goes first. The returned list is shared
    with later calls that would compute the same order: read it, never change it.
    """
    if cfg.fifo:
        return [Ranked(p, 0, False) for p in sorted(pending, key=lambda p: (p.queued_at, p.key))]
    if len(pending) < _SMALL:
        return _order_small(pending, held, usage, now, cfg)
    memo = _memo
    if memo is None or memo.pending is not pending or memo.cfg != cfg or now < memo.now:
        return _afresh(pending, held, usage, now, cfg)
    st = memo.static
    share = _share_key(st.owners, held, usage) if len(st.owners) > 1 else ()
    changed = _age(memo, now, cfg)
    if not changed and share == memo.share:
        return memo.result
    bg_max, by_index, effs = cfg.background_priority_max, memo.by_index, memo.effs
    for i in changed:
        by_index[i] = _ranked(pending[i], int(effs[i]), bg_max)
    memo.share = share
    memo.result = _arrange(st, effs, share, by_index)
    return memo.result


#: Below this many pending steps the order is sorted in plain Python each time (array
#: operations cost more than they save on a short queue).
_SMALL = 48

#: The last short queue's order, reused while nothing it depends on changed.
_small_memo: (
    tuple[Sequence[Pending], PolicyConfig, list[int], tuple[tuple[int, int], ...], list[Ranked]]
    | None
) = None


def _order_small(
    pending: Sequence[Pending],
    held: Mapping[str, int],
    usage: Mapping[str, float],
    now: float,
    cfg: PolicyConfig,
) -> list[Ranked]:
    global _small_memo
    rate, cap = max(0.0, cfg.aging_per_s), cfg.aging_cap
    effs = [
        p.priority
        + p.bump
        + (min(cap, int(rate * (now - p.queued_at))) if now > p.queued_at else 0)
        for p in pending
    ]
    owners = tuple(sorted({p.owner for p in pending}))
    share = _share_key(owners, held, usage) if len(owners) > 1 else ()
    memo = _small_memo
    if (
        memo is not None
        and memo[0] is pending
        and memo[2] == effs
        and memo[3] == share
        and memo[1] == cfg
    ):
        return memo[4]
    n = len(pending)
    order = sorted(
        range(n), key=lambda i: (-effs[i], pending[i].owner, pending[i].queued_at, _tie(pending[i]))
    )
    if share:
        # place: a step's index among its owner's steps of the same effective priority
        place = [0] * n
        prev: tuple[int, str] | None = None
        count = 0
        for i in order:
            group = (effs[i], pending[i].owner)
            count = count + 1 if group == prev else 0
            prev = group
            place[i] = count
        level = {o: lv for o, (_, lv) in zip(owners, share, strict=True)}
        order.sort(
            key=lambda i: (
                -effs[i],
                held.get(pending[i].owner, 0) + place[i],
                level[pending[i].owner],
                pending[i].queued_at,
                _tie(pending[i]),
            )
        )
    bg_max = cfg.background_priority_max
    result = [_ranked(pending[i], effs[i], bg_max) for i in order]
    _small_memo = (pending, cfg, effs, share, result)
    return result


def _age(memo: _Memo, now: float, cfg: PolicyConfig) -> list[int]:
    """Bring the memo's effective priorities to `now` (>= memo.now), looking only at the
    steps whose next aging point may be due; the positions whose priority changed."""
    rate, cap = max(0.0, cfg.aging_per_s), cfg.aging_cap
    st, effs = memo.static, memo.effs
    ages = memo.ages
    if ages is None:
        ages = memo.ages = _ages(st, effs, rate, cap)
    memo.now = now
    if not ages or ages[0][0] > now:
        return []
    changed: list[int] = []
    seen: list[tuple[float, int]] = []
    queued, base = st.queued_l, st.base_l
    while ages and ages[0][0] <= now:
        _, i = heappop(ages)
        q = queued[i]
        pts = min(cap, int(rate * (now - q))) if now > q else 0
        e = base[i] + pts
        if e != effs[i]:
            changed.append(i)
            effs[i] = e
        seen.append((_next_age(q, pts, rate, cap), i))
    for item in seen:
        heappush(ages, item)
    return changed


def _next_age(q: float, pts: int, rate: float, cap: int) -> float:
    """A time a little before the step queued at `q` with `pts` aging points earns the
    next one (never, at the cap): until then its effective priority cannot change. The
    margin covers float rounding; a step looked at early is recomputed exactly."""
    if rate <= 0 or pts >= cap:
        return math.inf
    t = q + (pts + 1) / rate
    return t - (1e-6 + 1e-9 * abs(t))


def _ages(st: _Static, effs: _Ints, rate: float, cap: int) -> list[tuple[float, int]]:
    """The aging heap for every position (see :func:`_next_age`), built in arrays."""
    if rate <= 0:
        return []
    pts = effs - st.base
    t = st.queued + (pts + 1) / rate
    due = t - (1e-6 + 1e-9 * np.abs(t))
    due[pts >= cap] = math.inf
    ages = list(zip(due.tolist(), range(len(pts)), strict=True))
    heapify(ages)
    return ages


def _afresh(
    pending: Sequence[Pending],
    held: Mapping[str, int],
    usage: Mapping[str, float],
    now: float,
    cfg: PolicyConfig,
) -> list[Ranked]:
    global _memo
    rate, cap = max(0.0, cfg.aging_per_s), cfg.aging_cap
    bg_max = cfg.background_priority_max
    memo = _memo
    old_ix: list[int] | None = None
    if memo is None:
        st = _static(pending)
    elif memo.pending is pending:
        st = memo.static
    else:
        where = dict(zip(map(id, memo.pending), range(len(memo.pending)), strict=True)).get
        old_ix = [where(id(p), -1) for p in pending]
        st = _static_from(memo.static, pending, old_ix) or _static(pending)
    waited = now - st.queued
    # min(cap, int(rate * waited)) if waited > 0 else 0, per step (the same float steps)
    aged = np.minimum(float(cap), np.trunc(rate * waited))
    effs = st.base + np.where(waited > 0, aged, 0.0).astype(np.int64)
    effs_l: list[int] = effs.tolist()
    by_index: list[Ranked]
    if memo is not None and memo.pending is pending:
        by_index = (
            [
                r if r.eff == e else _ranked(p, e, bg_max)
                for p, e, r in zip(pending, effs_l, memo.by_index, strict=True)
            ]
            if memo.cfg.background_priority_max == bg_max
            else [_ranked(p, e, bg_max) for p, e in zip(pending, effs_l, strict=True)]
        )
    elif memo is not None and old_ix is not None and memo.cfg.background_priority_max == bg_max:
        # steps still waiting keep their Ranked (the old tuple is alive: ids are unique)
        ob = memo.by_index
        by_index = [
            ob[i] if i >= 0 and ob[i].eff == e else _ranked(p, e, bg_max)
            for p, e, i in zip(pending, effs_l, old_ix, strict=True)
        ]
    else:
        by_index = [_ranked(p, e, bg_max) for p, e in zip(pending, effs_l, strict=True)]
    share = _share_key(st.owners, held, usage) if len(st.owners) > 1 else ()
    result = _arrange(st, effs, share, by_index)
    _memo = _Memo(pending, cfg, st, now, effs, None, share, result, by_index)
    return result


def _arrange(
    st: _Static, effs: _Ints, share: tuple[tuple[int, int], ...], by_index: list[Ranked]
) -> list[Ranked]:
    """The ranked steps in order. The key of (-eff, owner, queued_at, tie) is
    -eff * n + srank; with several owners, (-eff, held + place, usage rank, queued_at, tie)
    is packed the same way, place being a step's index among its owner's steps of the same
    effective priority."""
    n = len(by_index)
    if n <= 1:
        return list(by_index)
    first = -effs * n + st.srank
    if share:
        s1 = np.argsort(first)
        neg = -effs[s1]
        own = st.owner_ix[s1]
        new = np.empty(n, np.bool_)
        new[0] = True
        new[1:] = (neg[1:] != neg[:-1]) | (own[1:] != own[:-1])
        idx = np.arange(n)
        place = np.empty(n, np.int64)
        place[s1] = idx - np.maximum.accumulate(np.where(new, idx, 0))
        hold = np.array([h for h, _ in share], np.int64)[st.owner_ix]
        level = np.array([lv for _, lv in share], np.int64)[st.owner_ix]
        width = n + max(64, max(h for h, _ in share) + 1)  # > held + place
        levels = len(st.owners)
        first = ((-effs * width + hold + place) * levels + level) * n + st.qrank
    order: list[int] = np.argsort(first).tolist()
    return list(itemgetter(*order)(by_index))
