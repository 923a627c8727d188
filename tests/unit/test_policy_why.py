"""Why a step waits: every waiting step gets a specific reason from `Decision.why`."""

from __future__ import annotations

from hypothesis import given, settings

from m27.policy import Grant, Pending, PolicyInput, Reserve, StartCpu, decide
from m27.policy._explain import _gpu_text
from tests.unit.test_policy import G, gpu, grants, guest, node_inputs, pend, prim, run


def test_why_names_the_full_guest_slots_and_who_holds_them() -> None:
    running = (prim("a", 0), guest("ga", 0), prim("b", 1), guest("gb", 1))
    d = run((pend("w"),), running, gpus=(gpu(0), gpu(1)), guests_per_gpu=1)
    assert grants(d) == {}
    assert "guest slots on GPU 0, 1 full (guests_per_gpu=1): held by r/ga, r/gb" in d.why(
        ("r", "w")
    )


def test_why_names_the_memory_a_step_needs_and_what_each_gpu_has_free() -> None:
    d = run((pend("w", gpu_memory=40 * G),), (prim("a", gpu_memory=4 * G),))
    assert "needs 40.0 GiB, GPU 0 has 12.0 GiB free of 16.0 GiB × overprovision 1.0" in d.why(
        ("r", "w")
    )


def test_why_names_the_reservation_that_holds_a_free_gpu() -> None:
    big = Pending(("big", "train"), priority=10, gpus=2, gpu_memory=4 * G)
    d = run((big, pend("small")), (prim("a", 0),), gpus=(gpu(0), gpu(1)), guests_per_gpu=0)
    assert Reserve(("big", "train"), (0, 1)) in d.actions
    assert "GPU 1 reserved for big/train (gpus: 2)" in d.why(("r", "small"))


def test_why_names_a_lost_gpu() -> None:
    running = (prim("a", 0), guest("ga", 0), prim("b", 1), guest("gb", 1))
    d = run((pend("w"),), running, gpus=(gpu(0), gpu(1), gpu(2, lost=True)), guests_per_gpu=1)
    assert "GPU 2 lost" in d.why(("r", "w"))
    gone = run((pend("w"),), gpus=(gpu(0, lost=True),))
    assert "needs 1 GPU, this node has 0 usable (GPU 0 lost)" in gone.why(("r", "w"))


def test_why_stays_specific_on_the_next_tick_when_slots_stay_full() -> None:
    # tick 1: "w1" becomes the guest; tick 2: the slot is full, "w2" still gets a reason
    first = run((pend("w1"), pend("w2")), (prim("a"),), guests_per_gpu=1)
    assert grants(first) == {"w1": ((0,), "ready")}
    second = run((pend("w2"),), (prim("a"), guest("w1")), now=1.0, guests_per_gpu=1)
    assert "guest slots on GPU 0 full (guests_per_gpu=1): held by r/w1" in second.why(("r", "w2"))


#: Texts that say what blocks a waiting GPU step (beyond its rank and the GPU list).
SPECIFIC = (
    "guest slots on GPU",
    "does not fit as a guest",
    "declares no gpu_memory",
    "multi-GPU steps do not run as guests",
    "needs ",
    "reserves GPU",
    "reserved for",
    "fifo:",
    " lost",
    "is background",
)


@settings(max_examples=300, deadline=None)
@given(node_inputs())
def test_every_waiting_step_gets_a_specific_reason(inp: PolicyInput) -> None:
    d = decide(inp)
    acted = {a.key for a in d.actions if isinstance(a, Grant | StartCpu)}
    for p in inp.pending:
        if p.key in acted:
            continue
        why = d.why(p.key)
        assert why.startswith("waiting: ")
        if p.type == "cpu":
            assert "CPU slots busy" in why
        else:
            # what follows the rank and precedes the list of GPUs must say what blocks it
            gpu_line = "; ".join(_gpu_text(i, st) for i, st in d._gpus.items())
            assert why.endswith(gpu_line)
            middle = why.removesuffix(gpu_line).partition("; ")[2]
            assert any(s in middle for s in SPECIFIC), why
