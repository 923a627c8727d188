"""Node seats per tier, and which waiting flow runs a node takes (pure functions)."""

from __future__ import annotations

from m27 import events as ev
from m27.events.state import NodeState, fold
from m27.lab.capacity import Candidate, node_capacity, plan_admissions, queue_tier, tier_rank


def admitted(run_id: str, tier: str) -> ev.RunAdmitted:
    return ev.RunAdmitted(at=1.0, run_id=run_id, flow_run_id="f", tier=tier, host="h")


def submitted(run_id: str) -> ev.RunSubmitted:
    return ev.RunSubmitted(at=1.0, run_id=run_id, pipeline="p", spec_path="", steps=("s",))


def test_an_idle_node_has_a_seat_per_gpu_and_per_cpu_slot() -> None:
    room = node_capacity(NodeState(), gpu_count=2, cpu_slots=4)
    assert room == {"immediate": 2, "ready": 2, "background": 4}


def test_an_admitted_immediate_run_takes_a_gpu_and_opens_a_guest_seat() -> None:
    state = fold([admitted("r1", "immediate")])
    assert node_capacity(state, 1, 1) == {"immediate": 0, "ready": 1, "background": 1}


def test_a_run_holds_its_seat_until_it_ends() -> None:
    state = fold([admitted("r1", "background"), submitted("r1")])
    assert node_capacity(state, 1, 1)["background"] == 0
    state = fold([ev.RunSucceeded(at=2.0, run_id="r1", duration_s=1.0)], state)
    assert node_capacity(state, 1, 1)["background"] == 1


def test_a_crashed_run_frees_its_seat_even_before_it_was_submitted() -> None:
    state = fold([admitted("r1", "ready"), ev.RunCrashed(at=2.0, run_id="r1", reason="gone")])
    assert node_capacity(state, 1, 1)["ready"] == 1
    assert state.admitted == {}


def test_runs_started_by_hand_count_through_their_leases_and_requests() -> None:
    state = fold(
        [
            submitted("hand"),
            ev.LeaseGranted(at=1.0, run_id="hand", step="md", gpus=(0, 1), tier="immediate"),
            ev.LeaseGranted(at=1.0, run_id="hand", step="prep", gpus=(), tier="background"),
            ev.StepRequested(at=1.0, run_id="hand", step="more", type="gpu", gpus=1),
        ]
    )
    assert node_capacity(state, 4, 2) == {"immediate": 1, "ready": 3, "background": 1}


def test_guests_fill_guest_seats_before_free_gpus() -> None:
    state = fold([admitted("p", "immediate"), admitted("g1", "ready"), admitted("g2", "ready")])
    # one GPU with a primary and its guest; the second guest sits on the other GPU
    assert node_capacity(state, 2, 1) == {"immediate": 0, "ready": 0, "background": 1}


def test_lost_gpus_are_not_seats() -> None:
    state = fold([ev.GpuLost(at=1.0, gpu=1)])
    assert node_capacity(state, 2, 1)["immediate"] == 1


def test_starting_runs_count_before_the_log_shows_them() -> None:
    assert node_capacity(NodeState(), 1, 1, {"x": "immediate"})["immediate"] == 0


def test_plan_takes_the_highest_tier_first_then_earliest() -> None:
    cands = [
        Candidate("bg", "background", 1.0),
        Candidate("rd", "ready", 2.0),
        Candidate("im-late", "immediate", 9.0),
        Candidate("im", "immediate", 3.0),
    ]
    plan = plan_admissions(cands, NodeState(), gpu_count=2, cpu_slots=1)
    assert [c.run_id for c in plan] == ["im", "im-late", "rd", "bg"]


def test_a_waiting_higher_tier_blocks_lower_tiers_on_a_full_node() -> None:
    state = fold([admitted("p", "immediate"), admitted("g", "ready")])
    cands = [Candidate("im", "immediate"), Candidate("bg", "background")]
    assert plan_admissions(cands, state, gpu_count=1, cpu_slots=4) == []


def test_same_tier_runs_beyond_the_seats_wait() -> None:
    cands = [Candidate(f"r{i}", "immediate", float(i)) for i in range(3)]
    plan = plan_admissions(cands, NodeState(), gpu_count=2, cpu_slots=1)
    assert [c.run_id for c in plan] == ["r0", "r1"]


def test_unknown_tiers_are_never_taken() -> None:
    assert plan_admissions([Candidate("x", "urgent")], NodeState(), 1, 1) == []
    assert tier_rank("urgent") == 3


def test_a_flow_runs_tier_comes_from_its_queue_or_tag() -> None:
    assert queue_tier("immediate") == "immediate"
    assert queue_tier("default", ["m27", "tier:background"]) == "background"
    assert queue_tier(None) == "ready"
