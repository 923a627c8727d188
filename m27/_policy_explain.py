"""Why a step waits: one readable line per pending step, for `m27 queue --why STEP`.

Built lazily from what :func:`m27.policy.decide` saw and left behind, so the simulator,
which never asks, does not pay for the text.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from m27._policy_model import PolicyInput, StepKey, key_text
from m27._policy_state import GpuState, Ranked, aged_points


def explain(
    inp: PolicyInput,
    ranked: Sequence[Ranked],
    gpus: Mapping[int, GpuState],
    notes: Mapping[StepKey, list[str | Callable[[], str]]],
    started: Collection[StepKey],
) -> dict[StepKey, str]:
    cfg = inp.config
    gpu_line = "; ".join(_gpu_text(i, st) for i, st in gpus.items()) or "this node has no GPUs"
    cpu_busy = sum(1 for r in inp.running if r.role == "cpu")
    queues: dict[str, list[Ranked]] = {"cpu": [], "gpu": [], "background": []}
    for r in ranked:
        kind = "cpu" if r.pending.type == "cpu" else "background" if r.background else "gpu"
        queues[kind].append(r)
    out: dict[StepKey, str] = {}
    for kind, queue in queues.items():
        for pos, r in enumerate(queue, 1):
            p = r.pending
            if p.key in started:
                continue
            if cfg.fifo:
                head = f"waiting: position {pos} of {len(queue)} in the fifo {kind} queue"
            else:
                aged = aged_points(p.queued_at, inp.now, cfg)
                head = (
                    f"waiting: rank {pos} of {len(queue)} in the {kind} queue, prio {r.eff}"
                    f" (base {p.priority} + bump {p.bump} + aged {aged})"
                )
            parts = [head, *(n if isinstance(n, str) else n() for n in notes.get(p.key, ()))]
            if kind == "cpu":
                parts.append(f"{cpu_busy} of {cfg.cpu_slots} CPU slots busy")
            else:
                if kind == "background":
                    why = (
                        "gpu_light"
                        if p.type == "gpu_light"
                        else f"prio < {cfg.background_priority_max}"
                    )
                    parts.append(f"background ({why}): only GPU time no higher tier wants")
                parts.append(gpu_line)
            out[p.key] = "; ".join(parts)
    return out


def _gpu_text(i: int, st: GpuState) -> str:
    if st.view.lost:
        return f"GPU {i} lost"
    bits = []
    if st.primary is not None:
        bits.append(
            f"primary {key_text(st.primary.key)} ({st.primary.tier}, prio {st.primary.eff})"
        )
    else:
        bits.append("free")
    if st.guests:
        bits.append("guests " + ", ".join(key_text(g.key) for g in st.guests))
    if st.reserved_for is not None:
        bits.append(f"reserved for {key_text(st.reserved_for)} (gpus: {st.reserved_gpus})")
    return f"GPU {i} " + ", ".join(bits)
