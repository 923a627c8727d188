"""A guest that has not computed yet, moved to a GPU that sits idle.

Part of :func:`m27.policy.decide`. A guest is placed beside a primary when no GPU is free;
when a GPU frees later and nothing pending takes it (no step waits, or none fits), the
guest would wait, paused, for its primary to end: hours behind an MD run that never waits
on I/O, beside an idle GPU. It cannot move in place (its CUDA context and memory live on
its GPU), so its lease is taken back and it asks again: only a guest that has not computed
since its grant, which loses nothing but its start.
"""

from __future__ import annotations

from m27.policy._model import Action, Move, PolicyConfig
from m27.policy._state import GpuState, Slot


def move_to_idle(
    gpus: dict[int, GpuState], usable: list[int], cfg: PolicyConfig, actions: list[Action]
) -> None:
    """One :class:`Move` per idle GPU (no primary, no guest, held for no reservation), for
    the best-ranked guest that has not computed, waits behind a primary on another GPU and
    fits the idle GPU's memory. Runs after placement, so pending steps take free GPUs
    first."""
    if cfg.fifo:
        return
    idle = [
        i
        for i in usable
        if gpus[i].primary is None and not gpus[i].guests and gpus[i].reserved_for is None
    ]
    if not idle:
        return
    waiting = sorted(
        (
            (g, i)
            for i in usable
            if gpus[i].primary is not None
            for g in gpus[i].guests
            if not g.computed and not g.fresh and g.gpus == 1
        ),
        key=lambda t: Slot.guest_rank(t[0]),
    )
    for to in idle:
        cap = gpus[to].view.memory_total * cfg.memory_overprovision
        for n, (guest, on) in enumerate(waiting):
            if cap <= 0 or guest.memory <= cap:
                del waiting[n]
                gpus[on].guests.remove(guest)
                actions.append(Move(guest.key, on, to))
                break
