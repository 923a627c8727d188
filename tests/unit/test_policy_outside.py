"""A GPU that work m27 did not start holds (another user's node, a notebook, a job run by
hand) takes no step of m27's until that work ends: before, a free-looking GPU got a
primary beside a 60 GiB job, and one of the two could run out of memory."""

from __future__ import annotations

from m27.policy import OUTSIDE_MEMORY_MIN, GpuView, Grant, Pending, PolicyInput, decide

GIB = 2**30


def _decide(gpus: list[GpuView], *pending: Pending) -> tuple[list[Grant], dict[str, str]]:
    d = decide(PolicyInput(pending=pending, running=(), gpus=tuple(gpus), now=10.0))
    grants = [a for a in d.actions if isinstance(a, Grant)]
    return grants, {k[1]: v for k, v in d.reasons.items()}


def test_a_step_goes_to_the_gpu_nobody_else_uses() -> None:
    gpus = [GpuView(0, 80 * GIB, 60 * GIB, foreign_memory=60 * GIB), GpuView(1, 80 * GIB, 0)]
    grants, _ = _decide(gpus, Pending(("r", "a"), owner="u"))
    assert [(g.key, g.gpus) for g in grants] == [(("r", "a"), (1,))]


def test_a_step_waits_while_its_only_gpu_is_used_outside_m27_and_says_why() -> None:
    gpus = [GpuView(0, 80 * GIB, 60 * GIB, foreign_memory=60 * GIB)]
    grants, why = _decide(gpus, Pending(("r", "a"), owner="u"))
    assert grants == []
    assert "GPU 0 used outside m27 (60.0 GiB by processes m27 did not start)" in why["a"]


def test_a_wide_step_counts_only_the_gpus_m27_may_use() -> None:
    gpus = [GpuView(0, 80 * GIB, 60 * GIB, foreign_memory=60 * GIB), GpuView(1, 80 * GIB, 0)]
    grants, why = _decide(gpus, Pending(("r", "w"), gpus=2, owner="u"))
    assert grants == []
    assert "needs 2 GPUs, this node has 1 usable (GPU 0 used outside m27)" in why["w"]


def test_a_cuda_context_or_a_display_server_does_not_count() -> None:
    small = OUTSIDE_MEMORY_MIN - 1
    grants, _ = _decide([GpuView(0, 80 * GIB, small, foreign_memory=small)], Pending(("r", "a")))
    assert [g.gpus for g in grants] == [(0,)]
