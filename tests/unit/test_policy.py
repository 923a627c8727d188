"""The three-tier policy as a pure function: hand-built inputs, expected actions."""

from __future__ import annotations

import random
from typing import Any

from m27.policy import (
    Decision,
    Demote,
    GpuView,
    Grant,
    PauseGuest,
    Pending,
    PolicyConfig,
    PolicyInput,
    Promote,
    Reserve,
    ResumeGuest,
    Running,
    StartCpu,
    decide,
)

G = 2**30


def gpu(i: int, total: int = 16 * G, **kw: Any) -> GpuView:
    return GpuView(i, total, **kw)


def pend(name: str, **kw: Any) -> Pending:
    kw.setdefault("gpu_memory", 4 * G)
    return Pending(("r", name), **kw)


def prim(name: str, gpu: int = 0, **kw: Any) -> Running:
    kw.setdefault("gpu_memory", 4 * G)
    return Running(("r", name), role="primary", gpus=(gpu,), **kw)


def guest(name: str, gpu: int = 0, paused: bool = True, **kw: Any) -> Running:
    kw.setdefault("gpu_memory", 4 * G)
    return Running(("r", name), role="guest", tier="ready", gpus=(gpu,), paused=paused, **kw)


def run(
    pending: tuple[Pending, ...] = (),
    running: tuple[Running, ...] = (),
    gpus: tuple[GpuView, ...] = (gpu(0),),
    now: float = 0.0,
    usage: dict[str, float] | None = None,
    **cfg: Any,
) -> Decision:
    return decide(
        PolicyInput(pending, running, gpus, now, PolicyConfig(**cfg), usage_by_owner=usage or {})
    )


def grants(d: Decision) -> dict[str, tuple[tuple[int, ...], str]]:
    return {a.key[1]: (a.gpus, a.tier) for a in d.actions if isinstance(a, Grant)}


def test_highest_priority_step_is_the_only_primary_and_the_next_waits_as_guest() -> None:
    d = run((pend("low", priority=5), pend("high", priority=10)))
    assert grants(d) == {"high": ((0,), "immediate"), "low": ((0,), "ready")}


def test_guest_is_admitted_only_when_its_memory_fits_beside_the_primary() -> None:
    busy = (prim("p", gpu_memory=10 * G),)
    too_big = run((pend("g", gpu_memory=8 * G),), busy)
    assert grants(too_big) == {}
    assert "does not fit" in too_big.reasons[("r", "g")]
    assert grants(run((pend("g", gpu_memory=6 * G),), busy)) == {"g": ((0,), "ready")}
    overprovisioned = run((pend("g", gpu_memory=8 * G),), busy, memory_overprovision=1.2)
    assert grants(overprovisioned) == {"g": ((0,), "ready")}


def test_observed_memory_counts_when_it_exceeds_what_the_primary_declared() -> None:
    d = run((pend("g", gpu_memory=4 * G),), (prim("p", gpu_memory=2 * G),),
            gpus=(gpu(0, memory_used=14 * G),))  # fmt: skip
    assert grants(d) == {}


def test_undeclared_step_is_no_guest_where_the_memory_in_use_is_not_observed() -> None:
    d = run((pend("g", gpu_memory=0),), (prim("p"),))
    assert grants(d) == {}
    assert "declares no gpu_memory and has no measured peak" in d.reasons[("r", "g")]


def test_undeclared_step_is_a_guest_where_observed_free_memory_leaves_the_margin() -> None:
    roomy = run((pend("g", gpu_memory=0),), (prim("p"),), gpus=(gpu(0, memory_used=4 * G),))
    assert grants(roomy) == {"g": ((0,), "ready")}
    # 14 of 16 GiB in use: 12.5 % free is under the 20 % margin
    full = run((pend("g", gpu_memory=0),), (prim("p"),), gpus=(gpu(0, memory_used=14 * G),))
    assert grants(full) == {}
    assert "exceeds 20% of the GPU" in full.reasons[("r", "g")]


def test_an_undeclared_guest_takes_the_free_memory_so_no_second_one_joins_it() -> None:
    d = run(
        (pend("a", gpu_memory=0), pend("b", gpu_memory=0)),
        (prim("p"),),
        gpus=(gpu(0, memory_used=4 * G),),
        guests_per_gpu=2,
    )
    assert grants(d) == {"a": ((0,), "ready")}


def test_undeclared_step_is_a_guest_by_the_peak_measured_in_earlier_runs() -> None:
    busy = (prim("p", gpu_memory=10 * G),)
    fits = run((pend("g", gpu_memory=0, memory_peak=5 * G),), busy)
    assert grants(fits) == {"g": ((0,), "ready")}
    too_big = run((pend("g", gpu_memory=0, memory_peak=7 * G),), busy)
    assert grants(too_big) == {} and "does not fit" in too_big.reasons[("r", "g")]


def test_an_undeclared_guest_stays_paused_while_memory_runs_short() -> None:
    running = (prim("p", io_waiting=True), guest("g", gpu_memory=0))
    roomy = run(running=running, gpus=(gpu(0, memory_used=8 * G),))
    assert roomy.actions == (ResumeGuest(("r", "g"), 0),)
    short = run(running=running, gpus=(gpu(0, memory_used=15 * G),))
    assert short.actions == ()
    computing = (prim("p", io_waiting=True), guest("g", paused=False, gpu_memory=0))
    paused = run(running=computing, gpus=(gpu(0, memory_used=15 * G),))
    assert paused.actions == (PauseGuest(("r", "g"), 0),)


def test_guest_resumes_when_the_primary_hints_io() -> None:
    d = run(running=(prim("p", io_waiting=True), guest("g")))
    assert d.actions == (ResumeGuest(("r", "g"), 0),)


def test_guest_resumes_after_low_utilization_for_io_timeout_only() -> None:
    running = (prim("p"), guest("g"))
    low = gpu(0, primary_util=2.0, util_low_since=10.0)
    early = run(running=running, gpus=(low,), now=10.03, io_timeout=0.05)
    assert early.actions == ()
    assert early.next_check == 10.05
    late = run(running=running, gpus=(low,), now=10.05, io_timeout=0.05)
    assert late.actions == (ResumeGuest(("r", "g"), 0),)


def test_guest_is_paused_when_the_primary_computes_again() -> None:
    d = run(running=(prim("p"), guest("g", paused=False)), gpus=(gpu(0, primary_util=95.0),))
    assert d.actions == (PauseGuest(("r", "g"), 0),)


def test_only_the_best_guest_runs_during_io() -> None:
    running = (
        prim("p", io_waiting=True, gpu_memory=2 * G),
        guest("a", priority=1, paused=False),
        guest("b", priority=9),
    )
    d = run(running=running, guests_per_gpu=2)
    assert set(d.actions) == {ResumeGuest(("r", "b"), 0), PauseGuest(("r", "a"), 0)}


def test_best_guest_is_promoted_in_place_when_the_primary_ends() -> None:
    running = (guest("a", priority=1), guest("b", priority=9))
    d = run((pend("new", priority=9), pend("low", priority=2)), running, guests_per_gpu=2)
    assert Promote(("r", "b"), 0) in d.actions
    assert "new" not in grants(d) or grants(d)["new"][1] != "immediate"


def test_a_higher_priority_step_takes_the_gpu_and_the_guest_stays_paused() -> None:
    d = run((pend("urgent", priority=9),), (guest("g", priority=1),))
    assert grants(d) == {"urgent": ((0,), "immediate")}
    assert not any(isinstance(a, Promote) for a in d.actions)


def test_a_guest_running_when_its_primary_ended_is_paused_for_the_outranking_step() -> None:
    d = run((pend("urgent", priority=9),), (guest("g", priority=1, paused=False),))
    assert d.actions == (Grant(("r", "urgent"), (0,), "immediate"), PauseGuest(("r", "g"), 0))


def test_equal_or_lower_pending_priority_never_displaces_a_loaded_guest() -> None:
    for prio in (0, 5):
        d = run((pend("next", priority=prio),), (guest("g", priority=5),))
        assert d.actions[0] == Promote(("r", "g"), 0)
        assert grants(d) == {"next": ((0,), "ready")}  # it waits as the new guest


def test_aging_counts_for_the_guest_when_a_pending_step_would_outrank_it() -> None:
    # the guest has waited 2 h (4 points): a priority-5 step does not outrank 2 + 4
    d = run((pend("p5", priority=5, queued_at=7200.0),), (guest("g", priority=2),), now=7200.0)
    assert d.actions[0] == Promote(("r", "g"), 0)


def test_an_outranking_step_that_gets_a_free_gpu_leaves_the_promotion_alone() -> None:
    d = run((pend("urgent", priority=9),), (guest("g", priority=1),), gpus=(gpu(0), gpu(1)))
    assert d.actions[0] == Promote(("r", "g"), 0)
    assert grants(d) == {"urgent": ((1,), "immediate")}


def test_an_outranking_step_must_fit_beside_the_guest_and_declare_memory() -> None:
    big = run((pend("urgent", priority=9, gpu_memory=14 * G),), (guest("g", priority=1),))
    assert big.actions[0] == Promote(("r", "g"), 0)
    unknown = run((pend("urgent", priority=9, gpu_memory=0),), (guest("g", priority=1),))
    assert unknown.actions[0] == Promote(("r", "g"), 0)


def test_the_weakest_of_several_guests_is_displaced_and_the_others_promoted() -> None:
    running = (guest("g0", gpu=0, priority=4), guest("g1", gpu=1, priority=1))
    d = run((pend("urgent", priority=9),), running, gpus=(gpu(0), gpu(1)))
    assert Promote(("r", "g0"), 0) in d.actions
    assert grants(d) == {"urgent": ((1,), "immediate")}


def test_free_gpu_goes_to_the_best_pending_step_when_there_is_no_guest() -> None:
    d = run((pend("a", priority=1), pend("b", priority=3)), gpus=(gpu(0), gpu(1)))
    assert grants(d) == {"b": ((0,), "immediate"), "a": ((1,), "immediate")}


def test_aging_lets_a_low_priority_step_beat_a_stream_of_high_ones() -> None:
    low = pend("low", priority=0, queued_at=0.0)
    won_at = None
    for hour in range(48):
        now = hour * 3600.0
        fresh = pend(f"high{hour}", priority=20, queued_at=now)
        d = run((low, fresh), now=now, guests_per_gpu=0)
        if grants(d).get("low", ((), ""))[1] == "immediate":
            won_at = hour
            break
    assert won_at is not None and 9 <= won_at <= 11  # 2 points/h closes 20 points in 10 h


def test_bump_raises_effective_priority() -> None:
    d = run((pend("a", priority=10), pend("b", priority=5, bump=10)), gpus=(gpu(0, lost=False),))
    assert grants(d)["b"][1] == "immediate"


def test_fair_share_alternates_owners_at_equal_priority() -> None:
    pending = (
        pend("a1", owner="alice", queued_at=0.0),
        pend("a2", owner="alice", queued_at=1.0),
        pend("a3", owner="alice", queued_at=2.0),
        pend("b1", owner="bob", queued_at=3.0),
    )
    d = run(pending, gpus=(gpu(0), gpu(1)), now=10.0, guests_per_gpu=0)
    assert {k for k, (_, t) in grants(d).items() if t == "immediate"} == {"a1", "b1"}


def test_fair_share_prefers_the_owner_with_less_recent_usage() -> None:
    pending = (pend("a", owner="alice", queued_at=0.0), pend("b", owner="bob", queued_at=5.0))
    d = run(pending, usage={"alice": 3600.0, "bob": 10.0}, now=10.0, guests_per_gpu=0)
    assert grants(d) == {"b": ((0,), "immediate")}


def test_multi_gpu_step_reserves_gpus_so_lower_steps_cannot_take_them() -> None:
    gpus = (gpu(0), gpu(1))
    # small (13 GiB) fits neither beside x nor beside big on the held GPU 1 (16 GiB)
    small = pend("small", priority=5, queued_at=1.0, gpu_memory=13 * G)
    pending = (pend("big", gpus=2, priority=10), small)
    d = run(pending, (prim("x", gpu=0, time_limit=100.0),), gpus)
    assert Reserve(("r", "big"), (0, 1)) in d.actions
    assert grants(d) == {}
    assert "does not fit as a guest" in d.reasons[("r", "small")]
    d = run(pending, (prim("x", gpu=0, time_limit=100.0),), gpus, guests_per_gpu=0)
    assert "reserved for r/big" in d.reasons[("r", "small")]
    after = run(pending, (), gpus, now=100.0)
    assert grants(after)["big"] == ((0, 1), "immediate")


def test_reservation_prefers_the_gpus_whose_primaries_end_first() -> None:
    gpus = (gpu(0), gpu(1), gpu(2))
    running = (
        prim("slow", gpu=0, time_limit=1000.0),
        prim("quick", gpu=1, time_limit=10.0),
        prim("mid", gpu=2, time_limit=100.0),
    )
    d = run((pend("big", gpus=2),), running, gpus)
    assert Reserve(("r", "big"), (1, 2)) in d.actions


def test_short_step_backfills_a_reserved_gpu_only_if_it_ends_before_the_reservation() -> None:
    # GPU 0 frees at 100 (declared); big holds 0 and the free 1 until then (EASY backfill).
    gpus = (gpu(0), gpu(1))
    running = (prim("x", gpu=0, started_at=0.0, time_limit=100.0),)
    # big leaves 3 GiB beside it, so no 4 GiB step can wait loaded as a guest on GPU 0/1
    big = pend("big", gpus=2, priority=10, gpu_memory=13 * G)
    fits = pend("fits", queued_at=1.0, time_limit=90.0)  # ends at 100: in time
    late = pend("late", queued_at=1.0, time_limit=91.0)
    unknown = pend("unknown", queued_at=1.0)  # no declared limit: never backfilled
    d = run((big, fits), running, gpus, now=10.0)
    assert Reserve(("r", "big"), (0, 1)) in d.actions
    assert grants(d) == {"fits": ((1,), "immediate")}
    for other in (late, unknown):
        d = run((big, other), running, gpus, now=10.0)
        assert grants(d) == {}
        assert Reserve(("r", "big"), (0, 1)) in d.actions


def test_a_step_granted_in_the_same_decision_counts_as_started_now_for_reservations() -> None:
    # a takes GPU 1 now (500) and declares 800 s: it frees at 1300, after x on GPU 0 (1000).
    gpus = (gpu(0), gpu(1), gpu(2))
    running = (prim("x", gpu=0, started_at=0.0, time_limit=1000.0),)
    pending = (pend("a", priority=20, time_limit=800.0), pend("big", gpus=2, priority=10))
    d = run(pending, running, gpus, now=500.0)
    assert grants(d)["a"] == ((1,), "immediate")
    assert Reserve(("r", "big"), (0, 2)) in d.actions


def test_no_backfill_while_a_reserved_gpu_has_no_declared_end() -> None:
    gpus = (gpu(0), gpu(1))
    running = (prim("x", gpu=0),)  # no time limit: when big can start is unknown
    big = pend("big", gpus=2, gpu_memory=13 * G)  # no 4 GiB guest fits beside it
    d = run((big, pend("short", queued_at=1.0, time_limit=1.0)), running, gpus)
    assert grants(d) == {}


def test_a_backfilled_gpu_stays_held_so_no_guest_settles_beside_it() -> None:
    gpus = (gpu(0), gpu(1))
    running = (prim("x", gpu=0, time_limit=100.0),)
    pending = (
        pend("big", gpus=2, priority=10, gpu_memory=13 * G),
        pend("fits", priority=5, time_limit=50.0),
        pend("guest", queued_at=2.0),
    )
    d = run(pending, running, gpus)
    assert grants(d) == {"fits": ((1,), "immediate")}
    assert "does not fit as a guest" in d.reasons[("r", "guest")]
    # a guest that fits beside big may settle there: it stays loaded when big starts
    pending = (pending[0], pending[1], pend("guest", queued_at=2.0, gpu_memory=2 * G))
    d = run(pending, running, gpus)
    assert grants(d) == {"fits": ((1,), "immediate"), "guest": ((0,), "ready")}


def test_higher_priority_single_step_still_beats_a_waiting_multi_gpu_step() -> None:
    gpus = (gpu(0), gpu(1))
    pending = (pend("big", gpus=2, priority=5), pend("urgent", priority=50))
    d = run(pending, (prim("x", gpu=0),), gpus)
    assert grants(d)["urgent"] == ((1,), "immediate")


def test_lost_gpu_is_never_granted() -> None:
    gpus = (gpu(0, lost=True), gpu(1))
    d = run((pend("a"), pend("b"), pend("c", gpus=2)), gpus=gpus, guests_per_gpu=0)
    assert all(0 not in a.gpus for a in d.actions if isinstance(a, Grant | Reserve))
    assert "needs 2 GPUs, this node has 1 usable" in d.reasons[("r", "c")]


def test_fifo_mode_is_strict_arrival_order_without_guests_or_backfill() -> None:
    gpus = (gpu(0), gpu(1))
    pending = (
        pend("first", queued_at=0.0, priority=0),
        pend("big", queued_at=1.0, gpus=2, priority=99),
        pend("later", queued_at=2.0, priority=50),
    )
    d = run(pending, gpus=gpus, fifo=True)
    assert grants(d) == {"first": ((0,), "immediate")}
    assert "fifo" in d.reasons[("r", "big")]


def test_cpu_steps_fill_cpu_slots_by_rank() -> None:
    pending = tuple(pend(f"c{i}", type="cpu", priority=i) for i in range(4))
    running = (Running(("r", "busy"), type="cpu", role="cpu"),)
    d = run(pending, running, cpu_slots=3)
    assert [a.key[1] for a in d.actions if isinstance(a, StartCpu)] == ["c3", "c2"]
    assert "3 of 3 CPU slots busy" not in d.reasons[("r", "c0")]
    assert "1 of 3 CPU slots busy" in d.reasons[("r", "c0")]


def test_background_work_takes_only_gpus_nobody_above_wants() -> None:
    gpus = (gpu(0), gpu(1))
    pending = (pend("light", type="gpu_light"), pend("sweep", priority=-5), pend("md"))
    d = run(pending, gpus=gpus, guests_per_gpu=0)
    assert grants(d) == {"md": ((0,), "immediate"), "light": ((1,), "background")}
    assert "background" in d.reasons[("r", "sweep")]


def test_background_primary_is_demoted_to_a_paused_guest_for_gpu_work() -> None:
    running = (Running(("r", "sweep"), role="primary", tier="background", gpus=(0,),
                       gpu_memory=4 * G, priority=-5),)  # fmt: skip
    d = run((pend("md", priority=10),), running)
    assert d.actions[:2] == (Demote(("r", "sweep"), 0), Grant(("r", "md"), (0,), "immediate"))


def test_every_waiting_step_has_a_reason_naming_what_blocks_it() -> None:
    pending = tuple(pend(f"s{i}", priority=i, gpu_memory=12 * G) for i in range(5))
    d = run(pending, (prim("md", priority=50, gpu_memory=8 * G),))
    started = {a.key for a in d.actions if isinstance(a, Grant | StartCpu)}
    assert set(d.reasons) == {p.key for p in pending} - started
    assert all("GPU 0 primary r/md" in text for text in d.reasons.values())
    assert d.why(("r", "s4")).startswith("waiting: rank 1 of 5")


def test_decisions_do_not_depend_on_input_order() -> None:
    pending = [
        pend(f"s{i}", priority=i % 3, owner=f"o{i % 2}", queued_at=float(i % 4)) for i in range(12)
    ]
    gpus = tuple(gpu(i) for i in range(3))
    first = run(tuple(pending), gpus=gpus, now=100.0)
    rng = random.Random(7)
    for _ in range(5):
        rng.shuffle(pending)
        again = run(tuple(pending), gpus=gpus, now=100.0)
        assert again.actions == first.actions
        assert again.reasons == first.reasons


# --- invariants over random nodes -------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@st.composite
def node_inputs(draw: st.DrawFn) -> PolicyInput:
    n = draw(st.integers(1, 4))
    views, running = [], []
    for i in range(n):
        total = draw(st.integers(8, 32)) * G
        views.append(GpuView(i, total, lost=draw(st.booleans()) and i > 0))
        if draw(st.booleans()):
            used = draw(st.integers(1, total // G)) * G
            tier = draw(st.sampled_from(["immediate", "background"]))
            running.append(Running(("p", str(i)), role="primary", tier=tier, gpus=(i,),
                                   gpu_memory=used, io_waiting=draw(st.booleans())))  # fmt: skip
            if tier == "immediate" and used < total and draw(st.booleans()):
                running.append(guest(f"g{i}", gpu=i, gpu_memory=total - used))
        elif draw(st.booleans()):
            running.append(guest(f"orphan{i}", gpu=i, gpu_memory=G))
    pending = tuple(
        Pending(
            ("q", str(j)),
            type=draw(st.sampled_from(["cpu", "gpu", "gpu", "gpu_light"])),
            priority=draw(st.integers(-10, 30)),
            owner=draw(st.sampled_from(["a", "b", "c"])),
            gpus=draw(st.integers(1, 3)),
            gpu_memory=draw(st.integers(0, 20)) * G,
            queued_at=float(draw(st.integers(0, 100))),
        )
        for j in range(draw(st.integers(0, 8)))
    )
    cfg = PolicyConfig(
        guests_per_gpu=draw(st.integers(0, 2)),
        memory_overprovision=draw(st.sampled_from([1.0, 1.2, 1.5])),
        fifo=draw(st.booleans()),
        cpu_slots=draw(st.integers(0, 2)),
    )
    return PolicyInput(pending, tuple(running), tuple(views), 200.0, cfg)


@settings(max_examples=300, deadline=None)
@given(node_inputs())
def test_invariants_hold_on_any_node(inp: PolicyInput) -> None:
    d = decide(inp)
    cfg = inp.config
    views = {v.index: v for v in inp.gpus}
    primary: dict[int, tuple[str, str]] = {}
    guests: dict[int, dict[tuple[str, str], int]] = {v.index: {} for v in inp.gpus}
    for r in inp.running:
        for g in r.gpus:
            if r.role == "primary":
                primary[g] = r.key
            elif r.role == "guest":
                guests[g][r.key] = r.gpu_memory
    memory = {p.key: p.gpu_memory for p in inp.pending} | {r.key: r.gpu_memory for r in inp.running}
    added: set[int] = set()
    for a in d.actions:
        if isinstance(a, Promote):
            assert a.gpu not in primary
            primary[a.gpu] = a.key
            del guests[a.gpu][a.key]
        elif isinstance(a, Demote):
            assert primary.pop(a.gpu) == a.key
            guests[a.gpu][a.key] = memory[a.key]
        elif isinstance(a, Grant):
            assert not any(views[g].lost for g in a.gpus)
            for g in a.gpus:
                if a.tier == "ready" or (a.tier == "background" and g in primary):
                    guests[g][a.key] = memory[a.key]
                    added.add(g)
                else:
                    assert g not in primary, "two primaries on one GPU"
                    primary[g] = a.key
    for g in added:
        assert not cfg.fifo
        assert len(guests[g]) <= cfg.guests_per_gpu
        if g in primary:
            resident = sum(guests[g].values()) + memory[primary[g]]
        else:  # a GPU held free for a reservation: the guest waits (and computes) there
            assert any(isinstance(a, Reserve) and g in a.gpus for a in d.actions)
            resident = sum(guests[g].values())
        assert resident <= views[g].memory_total * cfg.memory_overprovision
    started = {a.key for a in d.actions if isinstance(a, Grant | StartCpu)}
    assert set(d.reasons) == {p.key for p in inp.pending} - started
    resumed = [a.gpu for a in d.actions if isinstance(a, ResumeGuest)]
    assert len(resumed) == len(set(resumed)), "at most one guest computes per GPU"
