"""Guest gating: who computes on a GPU while its primary waits on I/O, and promotion.

Part of :func:`m27.policy.decide`, kept apart because it runs on every decision, also
when nothing waits (then it is all that runs).
"""

from __future__ import annotations

from m27._policy_model import Action, GpuView, PauseGuest, PolicyConfig, Promote, ResumeGuest
from m27._policy_state import GpuState, Slot


def promote(gpus: dict[int, GpuState], usable: list[int], actions: list[Action]) -> None:
    """A primary that ended: its best guest takes over in place, before anyone new."""
    for i in usable:
        st = gpus[i]
        if st.primary is None and st.guests:
            best = min(st.guests, key=Slot.guest_rank)
            st.guests.remove(best)
            best.fresh = True
            best.paused = False
            if best.tier == "ready":
                best.tier = "immediate"
            st.primary = best
            actions.append(Promote(best.key, i))


def run_or_pause(
    gpus: dict[int, GpuState],
    usable: list[int],
    cfg: PolicyConfig,
    now: float,
    actions: list[Action],
) -> float | None:
    """Let the best guest compute while its primary waits on I/O; pause all others."""
    next_check: float | None = None
    for i in usable:
        st = gpus[i]
        prim = st.primary
        if prim is None or not st.guests:
            continue
        next_check = gate(
            i, st.view, prim.fresh, prim.io_waiting, st.guests, cfg, now, actions, next_check
        )
    return next_check


def gate(
    i: int,
    view: GpuView,
    fresh: bool,
    io_waiting: bool,
    guests: list[Slot],
    cfg: PolicyConfig,
    now: float,
    actions: list[Action],
    next_check: float | None,
) -> float | None:
    """One GPU's guests: the best computes while the primary waits on I/O (hinted, or
    inferred from low utilization for ``io_timeout``), the others are paused. A fresh
    primary (just granted or promoted) is taken to compute."""
    low_since = view.util_low_since
    util_low = view.primary_util is None or view.primary_util < cfg.io_util_threshold
    inferred = low_since is not None and util_low and now - low_since >= cfg.io_timeout
    io = not fresh and (io_waiting or inferred)
    if not io and not fresh and low_since is not None and util_low:
        due = low_since + cfg.io_timeout
        next_check = due if next_check is None else min(next_check, due)
    if len(guests) == 1:
        g = guests[0]
        if io and g.paused:
            actions.append(ResumeGuest(g.key, i))
            g.paused = False
        elif not io and not g.paused:
            actions.append(PauseGuest(g.key, i))
            g.paused = True
        return next_check
    best = min(guests, key=Slot.guest_rank) if io else None
    for g in sorted(guests, key=Slot.guest_rank):
        if g is best and g.paused:
            actions.append(ResumeGuest(g.key, i))
            g.paused = False
        elif g is not best and not g.paused:
            actions.append(PauseGuest(g.key, i))
            g.paused = True
    return next_check
