"""Guest gating: who computes on a GPU while its primary waits on I/O, and promotion
(or, when a waiting step outranks the guest, the GPU for that step).

Part of :func:`m27.policy.decide`, kept apart because it runs on every decision, also
when nothing waits (then it is all that runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, cast

from m27.policy._model import (
    Action,
    GpuView,
    Grant,
    PauseGuest,
    PolicyConfig,
    Promote,
    ResumeGuest,
    Running,
    StepKey,
    Tier,
)
from m27.policy._state import GpuState, Ranked, Slot, is_bg_host, lease_eff, room_beside


class Guest(Protocol):
    """What gating reads of a guest: a :class:`Slot` (a full decision) or the lease's own
    :class:`Running` (a decision with nothing pending builds no Slot)."""

    @property
    def key(self) -> StepKey: ...
    @property
    def paused(self) -> bool: ...
    @property
    def io_waiting(self) -> bool: ...
    @property
    def gpu_memory(self) -> int: ...
    @property
    def util_low_since(self) -> float | None: ...
    @property
    def tier(self) -> Tier: ...


def promote(
    gpus: dict[int, GpuState],
    usable: list[int],
    actions: list[Action],
    wide: Ranked | None = None,
    cfg: PolicyConfig | None = None,
) -> None:
    """A primary that ended: its best guest takes over in place, before anyone new.

    Except for the first multi-GPU step by rank (`wide`), when it outranks that guest and
    fits beside the guests: the GPU stays free for its reservation (the guests stay
    loaded and paused) instead of being held by one guest after another."""
    for i in usable:
        st = gpus[i]
        if st.primary is None and st.guests:
            best = min(st.guests, key=Slot.guest_rank)
            if (
                wide is not None
                and cfg is not None
                and wide.eff >= best.eff
                and room_beside(st, wide.pending.gpu_memory, cfg)
            ):
                continue
            st.guests.remove(best)
            best.fresh = True
            best.paused = False
            if best.tier == "ready":
                best.tier = "immediate"
            st.primary = best
            actions.append(Promote(best.key, i))


def outrank(
    ranked: list[Ranked],
    gpus: dict[int, GpuState],
    usable: list[int],
    cfg: PolicyConfig,
    now: float,
    actions: list[Action],
    granted: set[StepKey],
) -> None:
    """A GPU whose primary ended goes to a waiting gpu step that outranks its best guest.

    Promotion in place is the normal case (no reload); it only yields to a step with a
    strictly higher effective priority that gets no free GPU otherwise (the free and
    demotable GPUs go to the best steps first), needs one GPU, and declares memory that
    fits beside the guests, which stay loaded and paused in their slots. The weakest
    guest is displaced first, so the stronger ones are still promoted.
    """
    open_ = {
        i: min(gpus[i].guests, key=Slot.guest_rank)
        for i in usable
        if gpus[i].primary is None and gpus[i].guests
    }
    if not open_:
        return
    free_left = sum(
        1
        for i in usable
        if (gpus[i].primary is None and not gpus[i].guests) or is_bg_host(gpus[i], cfg)
    )
    weakest = min(best.eff for best in open_.values())
    for r in ranked:
        p = r.pending
        if p.type == "cpu" or r.background:
            continue
        if r.eff <= weakest:
            return  # the queue is in rank order: nobody below outranks a guest either
        k = max(1, p.gpus)
        if free_left >= k:
            free_left -= k
            continue
        if k > 1:
            free_left = 0  # a reservation takes the free GPUs first
            continue
        if p.gpu_memory <= 0:
            continue  # unknown need: never placed beside loaded guests
        fits = [
            i
            for i, best in open_.items()
            if r.eff > best.eff and room_beside(gpus[i], p.gpu_memory, cfg)
        ]
        if not fits:
            continue
        i = min(fits, key=lambda j: (open_[j].eff, j))
        del open_[i]
        gpus[i].primary = Slot.of_pending(p, r.eff, "immediate", started_at=now)
        actions.append(Grant(p.key, (i,), "immediate"))
        granted.add(p.key)
        if not open_:
            return
        weakest = min(best.eff for best in open_.values())


def run_or_pause(
    gpus: dict[int, GpuState],
    usable: list[int],
    cfg: PolicyConfig,
    now: float,
    actions: list[Action],
    standby: dict[int, StepKey],
    followers: dict[int, tuple[StepKey, ...]],
    yield_to: dict[int, tuple[StepKey, ...]],
) -> float | None:
    """Let the best guest compute while its primary waits on I/O; pause all others. On a
    GPU with guests and no primary (held free for a reservation) the best guest computes
    alone until the reserved step starts there (then it is paused like any guest). Whom
    each primary yields to: :func:`yielders`."""
    next_check: float | None = None
    rank = Slot.guest_rank
    for i in usable:
        st = gpus[i]
        guests = st.guests
        if not guests:
            continue
        order = guests if len(guests) == 1 else sorted(guests, key=rank)
        prim = st.primary
        if prim is None:
            next_check = gate(
                i, st.view, False, True, order, cfg, now, actions, next_check, standby, followers
            )
            continue
        next_check = gate(
            i, st.view, prim.fresh, prim.io_waiting, order, cfg, now, actions, next_check,
            standby, followers,
        )  # fmt: skip
        yielders(i, prim.eff, order, cfg, now, standby, followers, yield_to)
    return next_check


def yielders(
    i: int,
    primary_eff: int,
    order: Sequence[Guest],
    cfg: PolicyConfig,
    now: float,
    standby: dict[int, StepKey],
    followers: dict[int, tuple[StepKey, ...]],
    yield_to: dict[int, tuple[StepKey, ...]],
) -> None:
    """GPU `i`'s standby and followers (as :func:`gate` named them) that rank as high as
    its primary, whose effective priority is `primary_eff`: ready-tier guests whose own is
    at least that. Its primary yields to them (:attr:`m27.policy.Decision.yield_to`): a
    guest that began a compute phase in the primary's I/O wait ends it, at most
    ``primary_yield`` seconds more, before the primary computes again. Between equals that
    is a turn taken whole; a guest that ranks lower is stopped at once, as before."""
    if cfg.primary_yield <= 0 or cfg.fifo or i not in standby:
        return
    by_key = {g.key: g for g in order}
    out = []
    for key in (standby[i], *followers.get(i, ())):
        g = by_key[key]
        eff = g.eff if isinstance(g, Slot) else lease_eff(cast(Running, g), now, cfg)
        if g.tier != "background" and eff >= primary_eff:
            out.append(key)
    if out:
        yield_to[i] = tuple(out)


def gate(
    i: int,
    view: GpuView,
    fresh: bool,
    io_waiting: bool,
    order: Sequence[Guest],
    cfg: PolicyConfig,
    now: float,
    actions: list[Action],
    next_check: float | None,
    standby: dict[int, StepKey],
    followers: dict[int, tuple[StepKey, ...]],
) -> float | None:
    """One GPU's guests, in rank order (:meth:`Slot.guest_rank`): the best computes while
    the primary waits on I/O (hinted, or inferred from low utilization for
    ``io_timeout``), the others are paused. A fresh primary (just granted or promoted) is
    taken to compute. The best guest is also the GPU's `standby`: the one that computes in
    the primary's next I/O wait, which the agent lets follow the primary's own hint
    without waiting for the next decision; the other guests, in rank order, are its
    `followers`: each computes when the ones before it wait on their own I/O. It reads
    the guests and writes nothing on them (each is gated once per decision): only
    `actions`."""
    if view.memory_used is not None and view.memory_total > 0:
        # memory running short: guests of unknown need stay paused (they may be what
        # grows), so the primary never meets an out-of-memory error because of them
        limit = view.memory_total * cfg.memory_overprovision * (1 - cfg.guest_memory_margin / 2)
        if view.memory_used > limit and any(g.gpu_memory <= 0 for g in order):
            for g in order:
                if g.gpu_memory <= 0 and not g.paused:
                    actions.append(PauseGuest(g.key, i))
            order = [g for g in order if g.gpu_memory > 0]
            if not order:
                return next_check
    low_since = view.util_low_since
    util_low = view.primary_util is None or view.primary_util < cfg.io_util_threshold
    # `now >= low_since + io_timeout`, the very sum `next_check` asks to be woken at: the
    # difference `now - low_since` can round below io_timeout at that instant, and the
    # guests would stay paused until some other event (minutes, in a simulated week)
    inferred = low_since is not None and util_low and now >= low_since + cfg.io_timeout
    io = not fresh and (io_waiting or inferred)
    if not io and not fresh and low_since is not None and util_low:
        due = low_since + cfg.io_timeout
        next_check = due if next_check is None else min(next_check, due)
    if len(order) == 1:
        g = order[0]
        standby[i] = g.key
        if io and g.paused:
            actions.append(ResumeGuest(g.key, i))
        elif not io and not g.paused:
            actions.append(PauseGuest(g.key, i))
        return next_check
    # a guest in its own I/O wait (its hint, or its own utilization low for io_timeout)
    # would leave the gap unused: the next one fills it
    timeout = cfg.io_timeout
    ready = None
    for g in order:
        since = g.util_low_since
        inferred = since is not None and now >= since + timeout
        if since is not None and not inferred:  # its own I/O is inferred then: ask again
            due = since + timeout
            next_check = due if next_check is None else min(next_check, due)
        if ready is None and not g.io_waiting and not inferred:
            ready = g
    ready = ready or order[0]
    standby[i] = ready.key
    followers[i] = tuple(g.key for g in order if g is not ready)
    best = ready if io else None
    for g in order:
        if g is best:
            if g.paused:
                actions.append(ResumeGuest(g.key, i))
        elif not g.paused:
            actions.append(PauseGuest(g.key, i))
    return next_check
