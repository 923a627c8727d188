"""Filling the gaps (issue 16.2): the rules that keep a GPU busy while work waits, in the
policy and in the simulator that drives it."""

from __future__ import annotations

from m27.policy import (
    GpuView,
    Grant,
    PauseGuest,
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


def test_an_inferred_io_wait_is_seen_at_the_instant_the_decision_asked_to_be_woken() -> None:
    # low since 0.3: `next_check` is 0.3 + io_timeout, and at that instant `now - low_since`
    # rounds below io_timeout; the guest must resume all the same
    low = 0.3
    assert (low + 0.05) - low < 0.05
    view = GpuView(0, 16 * G, None, False, 0.0, low)
    running = (Running(("r", "md"), gpus=(0,), gpu_memory=4 * G), _guest("g"))
    first = decide(PolicyInput((), running, (view,), low))
    assert first.actions == () and first.next_check == low + 0.05
    woken = decide(PolicyInput((), running, (view,), first.next_check))
    assert woken.actions == (ResumeGuest(("r", "g"), 0),)


def test_a_held_gpu_takes_a_guest_that_fits_beside_the_reserved_step_too() -> None:
    # GPU 0: x (4 GiB) computes until 100; GPU 1 free; wide (2 GPUs, 10 GiB) holds both.
    views = (GpuView(0, 16 * G), GpuView(1, 16 * G))
    running = (Running(("r", "x"), gpus=(0,), gpu_memory=4 * G, time_limit=100.0),)
    wide = Pending(("r", "wide"), priority=10, gpus=2, gpu_memory=10 * G)
    fits = Pending(("r", "fits"), gpu_memory=6 * G, queued_at=1.0)
    big = Pending(("r", "big"), gpu_memory=7 * G, queued_at=1.0)  # 7 + 10 > 16
    d = decide(PolicyInput((wide, fits), running, views, 10.0))
    assert Reserve(("r", "wide"), (0, 1)) in d.actions
    # both held GPUs leave 6 GiB beside wide: the lower index
    assert [(a.key[1], a.gpus, a.tier) for a in d.actions if hasattr(a, "tier")] == [
        ("fits", (0,), "ready")
    ]
    d = decide(PolicyInput((wide, big), running, views, 10.0))
    assert not [a for a in d.actions if hasattr(a, "tier")]
    assert "does not fit as a guest" in d.why(("r", "big"))


def test_where_the_reserved_step_leaves_no_room_a_guest_may_backfill_by_its_limit() -> None:
    # wide needs 15 of 16 GiB (under guest_memory_margin left): a guest must end, by its
    # declared limit, before the reservation is complete (x's end at 100)
    views = (GpuView(0, 16 * G), GpuView(1, 16 * G))
    running = (Running(("r", "x"), gpus=(0,), gpu_memory=4 * G, time_limit=100.0),)
    wide = Pending(("r", "wide"), priority=10, gpus=2, gpu_memory=15 * G)
    # time limits too long for EASY backfill as a primary on GPU 1 would be checked first
    short = Pending(("r", "short"), gpu_memory=4 * G, queued_at=1.0, time_limit=90.0)
    late = Pending(("r", "late"), gpu_memory=4 * G, queued_at=1.0, time_limit=91.0)
    cfg = PolicyConfig(guests_per_gpu=2)
    d = decide(PolicyInput((wide, late), running, views, 10.0, cfg))
    assert not [a for a in d.actions if hasattr(a, "tier")]
    # short ends by 100: backfilled as the primary of the held free GPU 1 (EASY), and a
    # second short step, as a guest beside x
    other = Pending(("r", "other"), gpu_memory=4 * G, queued_at=2.0, time_limit=80.0)
    d = decide(PolicyInput((wide, short, other), running, views, 10.0, cfg))
    got = {a.key[1]: (a.gpus, a.tier) for a in d.actions if hasattr(a, "tier")}
    assert got["short"] == ((1,), "immediate")
    assert got["other"][1] == "ready"


def test_a_guest_without_hints_whose_own_utilization_stays_low_gives_way_to_the_next() -> None:
    # the primary's I/O is inferred (idle since 0); the running guest shows no compute of
    # its own since 10.0: after io_timeout it is known to wait on its own I/O
    view = GpuView(0, 16 * G, None, False, 0.0, 0.0)
    prim = Running(("r", "md"), gpus=(0,), gpu_memory=4 * G)
    first = Running(("r", "first"), role="guest", tier="ready", gpus=(0,), gpu_memory=2 * G,
                    priority=9, util_low_since=10.0)  # fmt: skip
    running = (prim, first, _guest("second", priority=1))
    cfg = PolicyConfig(guests_per_gpu=2)
    d = decide(PolicyInput((), running, (view,), 10.01, cfg))
    assert d.actions == () and d.next_check == 10.0 + cfg.io_timeout
    assert d.standby == {0: ("r", "first")}
    d = decide(PolicyInput((), running, (view,), 10.0 + cfg.io_timeout, cfg))
    assert d.actions == (PauseGuest(("r", "first"), 0), ResumeGuest(("r", "second"), 0))
    assert d.standby == {0: ("r", "second")}


def test_a_paused_guest_without_hints_keeps_doing_its_own_io_while_another_fills_the_gap() -> None:
    # b (no hint, ranked first) enters its own I/O at 15 while a waits on I/O: c computes
    # instead from 15.05; b's I/O goes on while it is paused (the agent stops it only once
    # it computes), so at 35 it is ready and takes the gap back (it ranks first) and ends
    # at 40; c has 0.05 s left, done once promoted at 50. Without the rule c would have
    # computed nothing before 50 and end at 70.
    def job(id: str, phases: tuple[tuple[str, float], ...], **kw: object) -> Job:
        return Job(id, 0, phases, gpu_memory=4 * GIB, **kw)  # type: ignore[arg-type]

    trace = Trace(
        jobs=(
            job("a/main", (("compute", 10), ("io", 30), ("compute", 10)), priority=10),
            job("b/md", (("compute", 5), ("io", 20), ("compute", 5)), priority=5, io_hint=False),
            job("c/fit", (("compute", 20),), priority=1),
        ),
        gpus=1,
    )
    result = simulate(trace, make_scheduler("m27", PolicyConfig(guests_per_gpu=2)))
    ends = {lv.job.id: round(lv.finished_at or 0.0, 2) for lv in result.jobs}
    assert ends == {"a/main": 50.0, "b/md": 40.0, "c/fit": 50.05}


def _held_free() -> tuple[tuple[GpuView, GpuView], Running, Pending]:
    """GPU 0 free and GPU 1 busy for an hour at most: both held for a 2-GPU step."""
    views = (GpuView(0, 16 * G), GpuView(1, 16 * G))
    other = Running(("r", "other"), gpus=(1,), gpu_memory=4 * G, time_limit=3600.0)
    return views, other, Pending(("r", "wide"), priority=20, gpus=2, gpu_memory=10 * G)


def test_a_gpu_light_step_is_a_ready_guest_on_a_held_free_gpu_and_background_work_is_not() -> None:
    views, other, wide = _held_free()
    light = Pending(("r", "light"), type="gpu_light", priority=10, gpu_memory=4 * G)
    sweep = Pending(("r", "sweep"), priority=-5, gpu_memory=4 * G)
    d = decide(PolicyInput((wide, light, sweep), (other,), views, 0.0))
    # light computes alone where nothing runs; the sweep needs a primary to be a guest beside
    assert Grant(("r", "light"), (0,), "ready") in d.actions
    assert Grant(("r", "sweep"), (1,), "background") in d.actions
    assert d.standby[0] == ("r", "light")


def test_a_guest_that_ends_by_its_limit_before_the_reservation_need_not_fit_beside_it() -> None:
    views, other, wide = _held_free()
    # 8 GiB beside the reserved 10 GiB does not fit a 16 GiB GPU; on the held free GPU the
    # guest computes alone, so a declared limit within the hour is kept
    short = Pending(("r", "short"), type="gpu_light", priority=10, gpu_memory=8 * G,
                    time_limit=1800.0)  # fmt: skip
    d = decide(PolicyInput((wide, short), (other,), views, 0.0))
    assert Grant(("r", "short"), (0,), "ready") in d.actions
    late = Pending(("r", "late"), type="gpu_light", priority=10, gpu_memory=8 * G,
                   time_limit=7200.0)  # fmt: skip
    d = decide(PolicyInput((wide, late), (other,), views, 0.0))
    assert not any(isinstance(a, Grant) for a in d.actions)


def test_steps_queued_together_start_biggest_first_so_the_small_ones_fill_beside_it() -> None:
    # one free GPU of 32 GiB, a backlog queued at the same instant: key order would start
    # "a-small" and leave "z-big" no room as a guest; biggest first starts the 24 GiB step
    # and loads the 4 GiB one beside it, to compute in its I/O waits
    small = Pending(("a-small", "s"), priority=10, gpu_memory=4 * G, queued_at=5.0)
    big = Pending(("z-big", "s"), priority=10, gpu_memory=24 * G, queued_at=5.0)
    inp = PolicyInput((small, big), (), (GpuView(0, 32 * G),), 10.0)
    d = decide(inp)
    assert d.actions[:2] == (
        Grant(("z-big", "s"), (0,), "immediate"),
        Grant(("a-small", "s"), (0,), "ready"),
    )
    # a measured peak counts as the need where none is declared
    big_unknown = Pending(("z-big", "s"), priority=10, memory_peak=24 * G, queued_at=5.0)
    d = decide(PolicyInput((small, big_unknown), (), (GpuView(0, 32 * G),), 10.0))
    assert d.actions[0] == Grant(("z-big", "s"), (0,), "immediate")
    # queue time still comes first: the small step queued earlier starts first
    earlier = Pending(("a-small", "s"), priority=10, gpu_memory=4 * G, queued_at=4.0)
    d = decide(PolicyInput((earlier, big), (), (GpuView(0, 32 * G),), 10.0))
    assert d.actions[0] == Grant(("a-small", "s"), (0,), "immediate")
