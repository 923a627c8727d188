"""Filling the gaps (issue 16.2): the rules that keep a GPU busy while work waits, in the
policy and in the simulator that drives it."""

from __future__ import annotations

from m27.policy import (
    GpuView,
    Pending,
    PolicyInput,
    Promote,
    Reserve,
    ResumeGuest,
    Running,
    decide,
)
from m27.policy._model import PolicyConfig
from m27.sim import make_scheduler, simulate
from m27.sim.trace import GIB, Job, Trace

G = 2**30


def _guest(name: str, **kw: object) -> Running:
    return Running(("r", name), role="guest", tier="ready", gpus=(0,), paused=True,
                   gpu_memory=2 * G, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_a_guest_in_its_own_io_wait_is_passed_over_for_the_next_guest() -> None:
    prim = Running(("r", "md"), gpus=(0,), gpu_memory=4 * G, io_waiting=True)
    running = (prim, _guest("first", priority=9, io_waiting=True), _guest("second", priority=1))
    inp = PolicyInput((), running, (GpuView(0, 16 * G),), 0.0, PolicyConfig(guests_per_gpu=2))
    d = decide(inp)
    assert d.actions == (ResumeGuest(("r", "second"), 0),)
    assert d.standby == {0: ("r", "second")}


def test_a_freed_gpu_waits_for_an_outranking_multi_gpu_step_instead_of_promoting() -> None:
    running = (
        Running(("r", "other"), gpus=(1,), gpu_memory=4 * G),
        _guest("loaded", priority=1),
    )
    views = (GpuView(0, 16 * G), GpuView(1, 16 * G))
    wide = Pending(("r", "wide"), priority=20, gpus=2, gpu_memory=4 * G)
    d = decide(PolicyInput((wide,), running, views, 0.0))
    # the guest stays a guest, and computes alone on the held GPU until wide starts there
    assert d.actions == (Reserve(("r", "wide"), (0, 1)), ResumeGuest(("r", "loaded"), 0))
    assert d.standby == {0: ("r", "loaded")}
    assert "GPU 0 free, guests r/loaded, reserved for r/wide" in d.why(("r", "wide"))
    # a multi-GPU step that does not outrank the guest: the guest is promoted as before
    low = Pending(("r", "wide"), priority=0, gpus=2, gpu_memory=4 * G)
    d = decide(PolicyInput((low,), running, views, 0.0))
    assert Promote(("r", "loaded"), 0) in d.actions


def test_a_paused_guest_that_hints_its_io_keeps_doing_its_io_in_the_simulator() -> None:
    # b's I/O (10 s) falls while a computes: with the gate closed it still goes on, so b is
    # ready to compute in a's next I/O wait and ends 10 s sooner than if it stood still
    trace = Trace(
        jobs=(
            Job("a/main", 0, (("compute", 10), ("io", 10), ("compute", 10), ("io", 10),
                              ("compute", 10)), priority=10, gpu_memory=4 * GIB),
            Job("b/main", 0, (("compute", 10), ("io", 10), ("compute", 10)),
                gpu_memory=4 * GIB),
        ),
        gpus=1,
    )  # fmt: skip
    ends = {lv.job.id: lv.finished_at for lv in simulate(trace, make_scheduler("m27")).jobs}
    assert ends == {"a/main": 50.0, "b/main": 40.0}
