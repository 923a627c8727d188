"""The common case of a busy node, decided without ranking the whole queue.

When every usable GPU has a primary, no background primary could step aside, no guest slot
is open and no CPU slot is free for a waiting cpu step, no pending step can start: the only
queue-dependent action of :func:`m27.policy.decide` is the reservation of the first
multi-GPU step by rank (and the notes of the steps too wide for the node). That step is
found from the rank keys of the multi-GPU steps alone (O(n) with no sort of the queue),
so a tick with hundreds of waiting steps costs what the GPUs cost. The full ranking is
built only if someone asks why a step waits. The actions are the ones the full pass would
return (``tests/unit/test_policy_hold.py`` compares both on random busy nodes).
"""

from __future__ import annotations

from collections.abc import Sequence

from m27.policy._model import Pending, PolicyConfig, PolicyInput, StepKey
from m27.policy._state import GpuState, Ranked, is_bg_host, order_pending


def nothing_starts(
    inp: PolicyInput, gpus: dict[int, GpuState], usable: list[int], cpu_busy: int
) -> bool:
    """True when no pending step can be granted anything in this decision."""
    cfg = inp.config
    if cfg.fifo or not usable:
        return False
    for i in usable:
        st = gpus[i]
        prim = st.primary
        if prim is None or is_bg_host(st, cfg):
            return False
        if prim.tier == "immediate" and len(st.guests) < cfg.guests_per_gpu:
            return False
    return cpu_busy >= cfg.cpu_slots or not any(p.type == "cpu" for p in inp.pending)


def first_wide(
    inp: PolicyInput, held: dict[str, int], width: int
) -> tuple[Pending | None, list[Pending]]:
    """The first gpu step by rank that needs 2..`width` GPUs, and the gpu steps that need
    more than `width` (the node's usable GPUs); background steps are neither. The rank
    key is order_pending's, computed for the multi-GPU steps only."""
    cfg, now = inp.config, inp.now
    bg_max = cfg.background_priority_max
    rate, cap = max(0.0, cfg.aging_per_s), cfg.aging_cap
    too_wide: list[Pending] = []
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
            if p.gpus > width:
                too_wide.append(p)
            else:
                candidates.append((n, p))
    if not candidates:
        return None, too_wide
    if one_owner:
        first = min(candidates, key=lambda t: (t[0], t[1].queued_at, t[1].key))
        return first[1], too_wide
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
    return best, too_wide


class LazyRanking(Sequence[Ranked]):
    """The full queue order, built on first use (only :attr:`Decision.reasons` needs it)."""

    def __init__(self, inp: PolicyInput, held: dict[str, int], cfg: PolicyConfig) -> None:
        self._args = (inp.pending, held, inp.usage_by_owner, inp.now, cfg)
        self._ranked: list[Ranked] | None = None

    def _get(self) -> list[Ranked]:
        if self._ranked is None:
            self._ranked = order_pending(*self._args)
        return self._ranked

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        return self._get()[i]

    def __len__(self) -> int:
        return len(self._get())
