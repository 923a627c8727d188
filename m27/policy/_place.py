"""Placement: pending steps onto free GPUs (immediate primaries, EASY-backfill holds for
multi-GPU steps, background work on GPUs nobody above wants, guests) and CPU slots, in
rank order. Part of the pure policy (``m27.policy.decide``): it only edits the ``Pass``."""

from __future__ import annotations

import math
from collections.abc import Iterable

from m27.policy._admit import Pass, guests
from m27.policy._model import Demote, Grant, Reserve, StartCpu
from m27.policy._state import (
    GpuState,
    Ranked,
    Slot,
    fits_beside,
    is_bg_host,
    room_beside,
    split_queues,
)


def place(ranked: list[Ranked], pa: Pass, cpu_busy: int) -> None:
    """Pending steps onto GPUs (primaries, background, guests) and CPU slots, by rank."""
    cfg = pa.cfg
    qs = split_queues(ranked, cfg, lazy=pa.fast)
    cpu_q = qs.cpu

    _immediate(qs.gpu, pa)
    if not cfg.fifo:
        _background_on_free(qs.background, pa)
        # gpu_light steps are natural guests: they compete for guest slots by rank (as
        # background guests), but never take a GPU from a gpu step.
        if guests(qs.guest, pa):
            guests(qs.background, pa)
    free_cpu = cfg.cpu_slots - cpu_busy
    if pa.needs is not None and not pa.needs.cpu:
        free_cpu = 0  # no cpu step waits: skip the scan of the queue for one
    for c in cpu_q if free_cpu > 0 else ():
        if free_cpu <= 0:
            break
        pa.actions.append(StartCpu(c.pending.key))
        pa.granted.add(c.pending.key)
        free_cpu -= 1


def _immediate(queue: Iterable[Ranked], pa: Pass) -> None:
    gpus, usable, cfg, now = pa.gpus, pa.usable, pa.cfg, pa.now
    actions, notes, granted = pa.actions, pa.notes, pa.granted
    reserved = False
    shadow = math.inf  # when the reserved step is expected to have all its GPUs
    free = [i for i in usable if gpus[i].primary is None]
    loaded = {i for i in free if gpus[i].guests}
    bg_hosts = [] if cfg.fifo else [i for i in usable if is_bg_host(gpus[i], cfg)]
    if pa.fast and not free and not bg_hosts and not cfg.fifo:
        # Nothing can start: only the first multi-GPU step that fits may act (its hold);
        # the loop would only step over the others (their notes come from a full pass).
        width = len(usable)
        wide = next(
            (r for r in queue if 1 < r.pending.gpus <= width and r.pending.key not in granted),
            None,
        )
        queue = () if wide is None else (wide,)
    for r in queue:
        p = r.pending
        if p.key in granted:
            continue
        k = max(1, p.gpus)
        if k > len(usable):
            notes[p.key] = [_too_wide_text(k, gpus, usable)]
            continue
        # Nothing can start now; only the first multi-GPU step may still need a hold.
        if not free and not bg_hosts and (reserved or cfg.fifo or k == 1):
            if cfg.fifo or (reserved and pa.fast):
                break  # nothing further down can start or hold (only notes would follow)
            if pa.needs is not None and pa.needs.narrowest_wide > len(usable):
                break  # no multi-GPU step to hold for (likewise)
            continue
        avail = [i for i in free if gpus[i].reserved_for in (None, p.key)] if reserved else free
        if loaded:
            # a free GPU that hosts guests takes a primary only if it fits beside them
            avail = [i for i in avail if i not in loaded or fits_beside(gpus[i], p, cfg)]
        demote: list[int] = []
        if len(avail) < k and bg_hosts:
            demote = [i for i in bg_hosts if room_beside(gpus[i], p.gpu_memory, cfg)]
        if len(avail) + len(demote) >= k:
            take = (avail + demote)[:k]
            for i in take:
                st = gpus[i]
                if st.primary is not None:
                    bg = st.primary
                    bg.paused, bg.fresh = True, True
                    st.guests.append(bg)
                    actions.append(Demote(bg.key, i))
                    bg_hosts.remove(i)
                else:
                    free.remove(i)
                st.primary = Slot.of_pending(p, r.eff, "immediate", started_at=now)
                st.reserved_for = None
            actions.append(Grant(p.key, tuple(take), "immediate"))
            granted.add(p.key)
            continue
        # EASY backfill: a step whose declared limit ends before the reserved step can
        # start may use GPUs held for it; they stay held, so no guest settles there.
        if reserved and p.time_limit is not None and now + p.time_limit <= shadow < math.inf:
            held = [
                i
                for i in free
                if i not in avail and (i not in loaded or fits_beside(gpus[i], p, cfg))
            ]
            if len(avail) + len(held) >= k:
                take = (avail + held)[:k]
                for i in take:
                    free.remove(i)
                    gpus[i].primary = Slot.of_pending(p, r.eff, "immediate", started_at=now)
                actions.append(Grant(p.key, tuple(take), "immediate"))
                granted.add(p.key)
                continue
        if k > 1 and not reserved and not cfg.fifo:
            # a background primary that could step aside for it counts as free now
            now_free = free + [
                i for i in bg_hosts if room_beside(gpus[i], p.gpu_memory or p.memory_peak, cfg)
            ]
            hold = reservation(gpus, usable, k, now_free)
            shadow = max(_free_at(gpus[i], i in now_free, now) for i in hold)
            for i in hold:
                gpus[i].reserved_for = p.key
                gpus[i].reserved_gpus = k
                gpus[i].reserved_need = p.gpu_memory or p.memory_peak
                gpus[i].reserved_until = shadow
            actions.append(Reserve(p.key, tuple(hold)))
            reserved = True
            every = "both" if k == 2 else f"all {k}"
            notes[p.key] = [
                f"reserves GPU {', '.join(map(str, hold))}: it starts once {every} are free "
                "(no new primary starts there meanwhile)"
            ]
        if cfg.fifo:
            notes[p.key] = [f"fifo: at the head, needs {k} free GPUs"]
            break


def _too_wide_text(k: int, gpus: dict[int, GpuState], usable: list[int]) -> str:
    lost = [str(i) for i, st in gpus.items() if st.view.lost]
    outside = [str(i) for i, st in gpus.items() if not st.view.lost and st.outside()]
    why = [f"GPU {', '.join(lost)} lost"] if lost else []
    why += [f"GPU {', '.join(outside)} used outside m27"] if outside else []
    text = f"needs {k} GPU{'s' if k > 1 else ''}, this node has {len(usable)} usable"
    return text + (f" ({'; '.join(why)})" if why else "")


def _free_at(st: GpuState, free: bool, now: float) -> float:
    """When a GPU is expected to be free: now, or when its primary's declared limit ends
    (never, as far as the policy knows, without one; now, if it is already past it)."""
    prim = st.primary
    if prim is None or free:
        return now
    if prim.time_limit is None:
        return math.inf
    return max(now, prim.started_at + prim.time_limit)


def reservation(gpus: dict[int, GpuState], usable: list[int], k: int, free: list[int]) -> list[int]:
    """The k GPUs expected to be free first: free ones, then by the primary's declared end."""

    def expected_free(i: int) -> tuple[float, int]:
        prim = gpus[i].primary
        if prim is None or i in free:
            return (-math.inf, i)
        if prim.time_limit is None:
            return (math.inf, i)
        return (prim.started_at + prim.time_limit, i)

    candidates = [i for i in usable if gpus[i].reserved_for is None or i in free]
    return sorted(sorted(candidates, key=expected_free)[:k])


def _background_on_free(queue: Iterable[Ranked], pa: Pass) -> None:
    """Background work on GPUs that no gpu step took (nor holds by reservation)."""
    gpus, usable, now, actions, granted = pa.gpus, pa.usable, pa.now, pa.actions, pa.granted
    free = [i for i in usable if gpus[i].primary is None and gpus[i].reserved_for is None]
    if not free:
        return  # before the scan for the first background step, not after it
    for r in queue:
        if not free:
            return
        p = r.pending
        k = max(1, p.gpus)
        if len(free) >= k:
            take, free = free[:k], free[k:]
            for i in take:
                gpus[i].primary = Slot.of_pending(p, r.eff, "background", started_at=now)
            actions.append(Grant(p.key, tuple(take), "background"))
            granted.add(p.key)
