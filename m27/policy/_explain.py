"""Why a step waits: one readable line per pending step, for `m27 queue --why STEP`.

Built lazily from what :func:`m27.policy.decide` saw and left behind, so the simulator,
which never asks, does not pay for the text.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from m27.policy._model import PolicyConfig, PolicyInput, StepKey, key_text
from m27.policy._state import GpuState, Ranked, aged_points


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
            said = [n if isinstance(n, str) else n() for n in notes.get(p.key, ())]
            parts = [head, *dict.fromkeys(said)]  # a gpu_light step may be noted twice
            if kind != "cpu" and not said:
                parts.append(_blocked(p.key, max(1, p.gpus), pos, gpus, cfg))
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
    if st.outside():
        return outside_text(i, st)
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


def outside_text(i: int, st: GpuState) -> str:
    """`GPU 0 used outside m27 (30.0 GiB by processes m27 did not start)`."""
    gib = st.view.foreign_memory / 2**30
    return f"GPU {i} used outside m27 ({gib:.1f} GiB by processes m27 did not start)"


def _blocked(
    key: StepKey, k: int, pos: int, gpus: Mapping[int, GpuState], cfg: PolicyConfig
) -> str:
    """Why a GPU step the placement passed over silently got neither a GPU nor a guest
    slot (its guest pass ended early: no host had a free slot), from the final layout."""
    if cfg.fifo:
        if pos == 1:
            return f"fifo: at the head, needs {k} free GPU{'s' if k > 1 else ''}"
        return f"fifo: behind {pos - 1} earlier step{'s' if pos > 2 else ''}, no guests"
    parts = []
    full = [
        (i, st)
        for i, st in gpus.items()
        if not st.view.lost
        and st.primary is not None
        and st.primary.tier == "immediate"
        and st.reserved_for is None
        and len(st.guests) >= cfg.guests_per_gpu
    ]
    if full:
        held = [key_text(g.key) for _, st in full for g in st.guests]
        text = (
            f"guest slots on GPU {', '.join(str(i) for i, _ in full)} full"
            f" (guests_per_gpu={cfg.guests_per_gpu})"
        )
        parts.append(text + (f": held by {', '.join(held)}" if held else ""))
    for i, st in gpus.items():
        if st.view.lost:
            parts.append(f"GPU {i} lost")
        elif st.outside():
            parts.append(outside_text(i, st))
        elif st.reserved_for is not None and st.reserved_for != key:
            parts.append(
                f"GPU {i} reserved for {key_text(st.reserved_for)} (gpus: {st.reserved_gpus})"
            )
        elif st.primary is not None and st.primary.tier == "background":
            parts.append(f"GPU {i} primary {key_text(st.primary.key)} is background: no guests")
    if not parts:
        free = sum(
            1 for st in gpus.values() if st.primary is None and not (st.view.lost or st.outside())
        )
        parts.append(f"needs {k} free GPU{'s' if k > 1 else ''} at once, {free} free")
    return "; ".join(parts)
