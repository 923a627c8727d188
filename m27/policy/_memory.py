"""Guest memory: where a step of unknown need may go, and the texts that say why a guest
did not fit (built only when someone asks, see :mod:`m27.policy._explain`)."""

from __future__ import annotations

from m27.policy._model import PolicyConfig
from m27.policy._state import GpuState


def _unknown_host(
    hosts: list[int],
    gpus: dict[int, GpuState],
    cap: dict[int, float],
    used: dict[int, float],
    cfg: PolicyConfig,
) -> int | None:
    """The host with the most observed free memory, if it keeps ``guest_memory_margin``
    of the GPU free; None when no host reports its memory in use."""
    best: int | None = None
    for i in hosts:
        if gpus[i].view.memory_used is None or cap[i] <= 0:
            continue
        if cap[i] - used[i] > cfg.guest_memory_margin * cap[i] and (
            best is None or cap[i] - used[i] > cap[best] - used[best]
        ):
            best = i
    return best


def _unknown_text(seen: tuple[tuple[int, float, float], ...], cfg: PolicyConfig) -> str:
    parts = ", ".join(f"GPU {i} {_gib(max(0.0, c - u))} free of {_gib(c)}" for i, u, c in seen)
    return (
        "declares no gpu_memory and has no measured peak: a guest only where observed free"
        f" memory exceeds {cfg.guest_memory_margin:.0%} of the GPU ({parts or 'no host'};"
        " memory in use not observed counts as no room)"
    )


def _no_fit_text(memory: int, over: float, seen: tuple[tuple[int, float, int], ...]) -> str:
    free = ", ".join(
        f"GPU {i} has {_gib(max(0.0, total * over - used))} free of {_gib(total)}"
        f" × overprovision {over}"
        for i, used, total in seen
    )
    return f"does not fit as a guest: needs {_gib(memory)}, {free}"


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"
