"""Guest admission: which waiting steps are loaded beside a GPU's primary (or on a GPU held
free for a reservation), and the placement pass's working state that it shares with
:func:`m27.policy.decide`'s other placement steps."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

from m27.policy._hold import Needs
from m27.policy._memory import _no_fit_text, _unknown_host, _unknown_text
from m27.policy._model import Action, Grant, PolicyConfig, StepKey, Tier
from m27.policy._state import GpuState, Ranked, Slot

#: A reason fragment: text, or a function that builds it when someone asks.
Note = str | Callable[[], str]
Notes = dict[StepKey, list[Note]]


@dataclass
class Pass:
    """One placement pass over the pending steps: the GPUs as the pass changes them, the
    configuration and time it decides for, and what it decided so far."""

    gpus: dict[int, GpuState]
    usable: list[int]
    cfg: PolicyConfig
    now: float
    actions: list[Action]
    notes: Notes
    granted: set[StepKey]
    #: actions only: skip what only feeds the notes (the reasons redo the pass in full)
    fast: bool = False
    #: what the waiting steps need (a fast pass stops where nothing further can fit)
    needs: Needs | None = None


def guests(queue: Iterable[Ranked], pa: Pass) -> bool:
    """Load waiting single-GPU steps, by rank, as paused guests where their memory fits
    (``guests_per_gpu`` slots a GPU): a guest computes only in its primary's I/O waits, so
    it costs the primary nothing and starts at once when the GPU frees. False when no
    slot is left open, or (a fast pass) no waiting step fits one: a second queue would
    find the same, so the caller skips it."""
    gpus, usable, cfg, now = pa.gpus, pa.usable, pa.cfg, pa.now
    actions, notes, granted = pa.actions, pa.notes, pa.granted
    # Hosts: GPUs with an immediate primary, and GPUs held for a reservation (with an
    # immediate primary or free): there a guest must also fit beside the reserved step,
    # so it stays loaded when that step starts (on a held free GPU it computes alone).
    #
    # Memory per host, kept up to date here: a long queue asks about every host per step.
    # On a held GPU with no primary (a guest computes alone there, at the speed its
    # declared limit assumes), or where the reserved step leaves less than
    # `guest_memory_margin` of the GPU beside it, a guest whose declared limit ends before
    # that step is expected to have all its GPUs need not fit beside it (EASY backfill,
    # as a guest): only beside who is there now (`now_used`). `room`: the most any host
    # has (one pass builds all).
    hosts: list[int] = []
    cap: dict[int, float] = {}
    used: dict[int, float] = {}
    now_used: dict[int, float] = {}
    room = -math.inf
    slots, over, margin = cfg.guests_per_gpu, cfg.memory_overprovision, cfg.guest_memory_margin
    for g in usable:
        st = gpus[g]
        prim = st.primary
        if len(st.guests) >= slots or (
            prim.tier != "immediate" if prim is not None else st.reserved_for is None
        ):
            continue
        hosts.append(g)
        c = cap[g] = st.view.memory_total * over
        u = used[g] = st.guest_used()
        if st.reserved_for is not None and (prim is None or c - st.reserved_need < margin * c):
            u = now_used[g] = st.used_memory()
        if c - u > room:
            room = c - u
    if not hosts:
        return False
    needs = pa.needs
    if needs is not None and not needs.unknown and needs.least - room > 1.0:
        return False  # a fast pass: no waiting step fits any open slot (only notes follow)
    seen: tuple[tuple[int, float, int], ...] | None = None
    unknown_seen: tuple[tuple[int, float, float], ...] | None = None
    # `room` only shrinks during the pass, so a step that misses it now is skipped below
    # whatever happens before its turn: a fast pass visits only the others (`room` read
    # as it shrinks: the steps left out could only have added notes).
    order = (r for r in queue if r.need - room <= 1.0) if pa.fast else queue
    for r in order:
        if not hosts:
            return False
        p = r.pending
        if p.key in granted:
            continue
        if max(1, p.gpus) > 1:
            notes.setdefault(p.key, []).append("multi-GPU steps do not run as guests")
            continue
        memory = p.gpu_memory or p.memory_peak
        if memory <= 0:
            # Unknown need: only where the observed free memory leaves the margin, and it
            # is taken to use all of that free memory (nobody else joins it this time).
            unreserved = [j for j in hosts if gpus[j].reserved_for is None]
            i = _unknown_host(unreserved, gpus, cap, used, cfg)
            if i is None:
                if unknown_seen is None:  # one snapshot per layout, not one per step
                    unknown_seen = tuple((j, used[j], cap[j]) for j in unreserved)
                notes.setdefault(p.key, []).append(partial(_unknown_text, unknown_seen, cfg))
                continue
            memory = max(1, int(cap[i] - used[i]))
            fitting = [i]
        else:
            # `room` is a float difference: only a clear miss skips the exact test below.
            fitting = [] if memory - room > 1.0 else _fitting(hosts, cap, used, memory)
            if now_used and p.time_limit is not None and memory - room <= 1.0:
                ends = now + p.time_limit
                fitting += [
                    i
                    for i, u in now_used.items()
                    if i in hosts
                    and i not in fitting
                    and ends <= gpus[i].reserved_until < math.inf
                    and cap[i] > 0
                    and u + memory <= cap[i]
                ]
            if r.eff < cfg.background_priority_max and fitting:
                # a background grant on a GPU with no primary would be a primary (the
                # background tier's own meaning): background guests need a primary. A
                # gpu_light step above that bound is a natural guest, not background
                # work: on a held free GPU it is a ready guest, computing alone.
                fitting = [i for i in fitting if gpus[i].primary is not None]
        if not fitting:
            if seen is None:
                seen = tuple((i, used[i], gpus[i].view.memory_total) for i in hosts)
            over = cfg.memory_overprovision
            notes.setdefault(p.key, []).append(partial(_no_fit_text, memory, over, seen))
            continue
        i = fitting[0]
        if len(fitting) > 1:  # the roomiest, the lowest index on a tie
            best = cap[i] - used[i]
            for j in fitting:
                if cap[j] - used[j] > best:
                    i, best = j, cap[j] - used[j]
        tier: Tier = "background" if r.background and gpus[i].primary is not None else "ready"
        slot = Slot.of_pending(p, r.eff, tier, paused=True, started_at=now)
        slot.memory = memory
        gpus[i].guests.append(slot)
        used[i] = gpus[i].guest_used()
        if i in now_used:
            now_used[i] = gpus[i].used_memory()
        if len(gpus[i].guests) >= cfg.guests_per_gpu:
            hosts.remove(i)
        if hosts:
            room = max(cap[j] - now_used.get(j, used[j]) for j in hosts)
        seen = unknown_seen = None
        actions.append(Grant(p.key, (i,), tier))
        granted.add(p.key)
    return bool(hosts)


def _fitting(
    hosts: list[int], cap: dict[int, float], used: dict[int, float], memory: int
) -> list[int]:
    """The hosts where `memory` fits beside what they hold, in host order."""
    out = []
    for i in hosts:
        c = cap[i]
        if c > 0 and used[i] + memory <= c:
            out.append(i)
    return out
