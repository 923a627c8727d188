"""The common case of a busy node, decided without ranking the whole queue.

When every usable GPU has a primary, no background primary could step aside, no open guest
slot has room for any waiting single-GPU step and no CPU slot is free for a waiting cpu
step, no pending step can start: the only queue-dependent action of
:func:`m27.policy.decide` is the reservation of the first multi-GPU step by rank. It is
found from the rank keys of the multi-GPU steps alone (O(n) with no sort of the queue),
so a tick with hundreds of waiting steps costs what the GPUs cost. If someone asks why a
step waits, the full pass runs on the same input and answers. The actions are the ones
the full pass would return (``tests/unit/test_policy_hold.py`` compares both on random
busy nodes).
"""

from __future__ import annotations

import math

from m27.policy._model import Pending, PolicyInput, StepKey
from m27.policy._state import GpuState, is_bg_host


def nothing_starts(
    inp: PolicyInput, gpus: dict[int, GpuState], usable: list[int], cpu_busy: int
) -> bool:
    """True when no pending step can be granted anything in this decision: no GPU free,
    none demotable, no open guest slot with room for any single-GPU step (conservative:
    the GPUs a reservation would hold count as hosts), no CPU slot for a cpu step."""
    cfg = inp.config
    if cfg.fifo or not usable:
        return False
    room = -math.inf  # the most memory any open guest slot has beside its GPU's residents
    observed = False  # an open slot where an unknown need could be admitted
    for i in usable:
        st = gpus[i]
        prim = st.primary
        if prim is None or is_bg_host(st, cfg):
            return False
        if prim.tier == "immediate" and len(st.guests) < cfg.guests_per_gpu:
            cap = st.view.memory_total * cfg.memory_overprovision
            if cap > 0:
                free = cap - st.used_memory()
                room = max(room, free)
                observed = observed or (
                    st.view.memory_used is not None and free > cfg.guest_memory_margin * cap
                )
    if room > -math.inf:
        for p in inp.pending:
            if p.type == "cpu" or p.gpus > 1:
                continue
            need = p.gpu_memory or p.memory_peak
            if (need <= 0 and observed) or (need > 0 and need <= room + 1.0):
                return False
    return cpu_busy >= cfg.cpu_slots or not any(p.type == "cpu" for p in inp.pending)


def first_wide(inp: PolicyInput, held: dict[str, int], width: int) -> Pending | None:
    """The first gpu step by rank that needs 2..`width` GPUs (the node's usable GPUs),
    background steps left out. The rank key is order_pending's, computed for the
    multi-GPU steps only."""
    cfg, now = inp.config, inp.now
    bg_max = cfg.background_priority_max
    rate, cap = max(0.0, cfg.aging_per_s), cfg.aging_cap
    candidates: list[tuple[int, Pending]] = []
    pending = inp.pending
    first_owner = pending[0].owner if pending else ""
    one_owner = True
    for p in pending:
        if one_owner and p.owner != first_owner:
            one_owner = False
        if p.gpus > 1 and p.type == "gpu":
            qa = p.queued_at
            n = -(p.priority + p.bump + (min(cap, int(rate * (now - qa))) if now > qa else 0))
            if -n < bg_max:
                continue
            if p.gpus <= width:
                candidates.append((n, p))
    if not candidates:
        return None
    if one_owner:
        first = min(candidates, key=lambda t: (t[0], t[1].queued_at, t[1].key))
        return first[1]
    # fair share: an owner's n-th waiting step (same effective priority) counts as if the
    # owner held n more GPUs; n is its place among that owner's steps at that priority
    before: dict[tuple[int, str], list[tuple[float, StepKey]]] = {
        (n, p.owner): [] for n, p in candidates
    }
    owners = {p.owner for _, p in candidates}
    for q in pending:
        if q.owner in owners:
            qa = q.queued_at
            n = -(q.priority + q.bump + (min(cap, int(rate * (now - qa))) if now > qa else 0))
            group = before.get((n, q.owner))
            if group is not None:
                group.append((qa, q.key))
    usage = inp.usage_by_owner
    best_key: tuple[int, int, float, float, StepKey] | None = None
    best: Pending | None = None
    for n, p in candidates:
        me = (p.queued_at, p.key)
        place = sum(1 for t in before[(n, p.owner)] if t < me)
        key = (n, held.get(p.owner, 0) + place, usage.get(p.owner, 0.0), p.queued_at, p.key)
        if best_key is None or key < best_key:
            best_key, best = key, p
    return best
