"""The common case of a busy node, decided without a placement pass over the queue.

When every usable GPU has a primary, no background primary could step aside, no open guest
slot has room for any waiting single-GPU step and no CPU slot is free for a waiting cpu
step, no pending step can start: the only queue-dependent action of
:func:`m27.policy.decide` is the reservation of the first multi-GPU step by rank, read
from the kept queue order (m27.policy._order, brought up to date incrementally), and the
guest-room test reads the least waiting need, kept per pending tuple: a tick with
hundreds of waiting steps costs what the GPUs cost. If someone asks why a
step waits, the full pass runs on the same input and answers. The actions are the ones
the full pass would return (``tests/unit/test_policy_hold.py`` compares both on random
busy nodes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from m27.policy._model import Pending, PolicyInput
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
    needs = waiting_needs(inp.pending)
    if room > -math.inf and ((needs.unknown and observed) or needs.least <= room + 1.0):
        return False
    return cpu_busy >= cfg.cpu_slots or not needs.cpu


class Needs(NamedTuple):
    """What the waiting steps ask for, summed up once per pending tuple."""

    #: the least known memory a single-GPU step needs as a guest (inf: none)
    least: float
    #: a single-GPU step of unknown need waits
    unknown: bool
    #: a cpu step waits
    cpu: bool
    #: the fewest GPUs a waiting multi-GPU gpu step needs (inf: none waits)
    narrowest_wide: float


#: The last pending tuple's (held, so its identity cannot be reused) needs.
_needs_memo: tuple[Sequence[Pending], Needs] | None = None


def waiting_needs(pending: Sequence[Pending]) -> Needs:
    """The needs of the waiting steps: the same on every call with the same pending tuple
    (the agent and the simulator pass the same object until it changes)."""
    global _needs_memo
    memo = _needs_memo
    if memo is not None and memo[0] is pending:
        return memo[1]
    least, unknown, cpu, wide = math.inf, False, False, math.inf
    for p in pending:
        if p.type == "cpu":
            cpu = True
            continue
        if p.gpus > 1:
            if p.type == "gpu" and p.gpus < wide:
                wide = p.gpus
            continue
        need = p.gpu_memory or p.memory_peak
        if need <= 0:
            unknown = True
        elif need < least:
            least = need
    needs = Needs(least, unknown, cpu, wide)
    _needs_memo = (pending, needs)
    return needs
