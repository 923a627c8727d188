"""The projection: real event sequences folded into NodeState."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from m27 import events as ev
from m27.events import EVENT_TYPES, Event, Recorded
from m27.events.state import (
    NodeState,
    apply,
    fold,
    handled_kinds,
    live_runs,
    orphaned_steps,
)
from m27.store.memory import MemoryEventStore
from tests.unit.event_samples import sample_event

T0 = 1_700_000_000.0


def submitted(
    run: str = "r1", steps: tuple[str, ...] = ("prep", "md", "analysis"), **kw: Any
) -> ev.RunSubmitted:
    return ev.RunSubmitted(
        at=T0,
        run_id=run,
        pipeline="md",
        spec_path="/lab/md.yaml",
        steps=steps,
        vars={"INPUT_FILE": "x.pdb"},
        owner="ana",
        **kw,
    )


def started(
    step: str, attempt: int = 1, at: float = T0 + 10, pid: int = 4242, run: str = "r1"
) -> ev.StepStarted:
    return ev.StepStarted(
        at=at,
        run_id=run,
        step=step,
        attempt=attempt,
        pid=pid,
        pgid=pid,
        command=("python", f"{step}.py"),
        gpus=(0,),
        log_path=f"/m27/runs/{run}/{step}.log",
    )


def records(*events: Event) -> list[Recorded]:
    return [Recorded(i, e) for i, e in enumerate(events, start=1)]


def test_every_event_kind_has_a_handler() -> None:
    assert set(EVENT_TYPES) - handled_kinds() == set()


@pytest.mark.parametrize("cls", sorted(EVENT_TYPES.values(), key=lambda c: c.__name__))
def test_every_event_kind_applies_without_a_known_run(cls: type[Event]) -> None:
    state = apply(NodeState(), Recorded(5, sample_event(cls)))
    assert state.last_seq == 5
    assert state.unhandled_kinds == set()


def test_run_submitted_creates_pending_steps_in_pipeline_order() -> None:
    state = fold(records(submitted()))
    run = state.runs["r1"]
    assert run.status == "running"
    assert list(run.steps) == ["prep", "md", "analysis"]
    assert {s.status for s in run.steps.values()} == {"pending"}
    assert run.steps["md"].run_id == "r1"
    assert run.vars == {"INPUT_FILE": "x.pdb"}
    assert run.owner == "ana"
    assert run.duration_s is None
    assert state.last_seq == 1


def test_a_successful_run_from_queue_to_end() -> None:
    state = fold(
        records(
            submitted(steps=("prep",)),
            ev.StepQueued(
                at=T0 + 1, run_id="r1", step="prep", type="cpu", priority=3, depends_on=()
            ),
            started("prep"),
            ev.StepSucceeded(
                at=T0 + 20, run_id="r1", step="prep", attempt=1, duration_s=10.0, outputs=("o",)
            ),
            ev.RunSucceeded(at=T0 + 21, run_id="r1", duration_s=21.0),
        )
    )
    run = state.runs["r1"]
    step = run.steps["prep"]
    assert (step.status, step.type, step.priority, step.attempts) == ("succeeded", "cpu", 3, 1)
    assert (step.started_at, step.ended_at, step.exit_code) == (T0 + 10, T0 + 20, 0)
    assert step.outputs == ("o",)
    assert step.log_path == "/m27/runs/r1/prep.log"
    assert run.status == "succeeded"
    assert run.duration_s == 21.0
    assert live_runs(state) == []


def test_failed_attempt_with_retry_requeues_then_second_attempt_succeeds() -> None:
    state = fold(
        records(
            submitted(),
            started("md", attempt=1, pid=100),
            ev.StepFailed(
                at=T0 + 30,
                run_id="r1",
                step="md",
                attempt=1,
                duration_s=20.0,
                reason="exit code 1",
                exit_code=1,
                log_tail="CUDA error",
                will_retry=True,
            ),
        )
    )
    md = state.runs["r1"].steps["md"]
    assert (md.status, md.attempts, md.exit_code, md.log_tail) == ("queued", 1, 1, "CUDA error")
    apply(state, Recorded(4, started("md", attempt=2, at=T0 + 40, pid=200)))
    assert (md.status, md.attempts, md.pid, md.exit_code, md.reason) == (
        "running",
        2,
        200,
        None,
        "",
    )
    apply(
        state,
        Recorded(
            5, ev.StepSucceeded(at=T0 + 50, run_id="r1", step="md", attempt=2, duration_s=10.0)
        ),
    )
    assert (md.status, md.attempts) == ("succeeded", 2)
    assert state.last_seq == 5


def test_a_step_requeued_on_a_lost_gpu_waits_again_it_is_not_cancelled() -> None:
    state = fold(
        records(
            submitted(),
            started("md", attempt=1, pid=100),
            ev.StepRequeued(at=T0 + 30, run_id="r1", step="md", attempt=1, reason="GPU 0 lost"),
        )
    )
    md = state.runs["r1"].steps["md"]
    assert (md.status, md.attempts, md.reason) == ("queued", 1, "GPU 0 lost: requeued")
    assert not md.done and state.runs["r1"].status == "running"
    apply(state, Recorded(4, started("md", attempt=1, at=T0 + 40, pid=200)))
    assert (md.status, md.pid, md.reason) == ("running", 200, "")


def test_final_failure_marks_the_step_and_run_failed_with_signal() -> None:
    state = fold(
        records(
            submitted(),
            started("md"),
            ev.StepFailed(
                at=T0 + 30,
                run_id="r1",
                step="md",
                attempt=1,
                duration_s=20.0,
                reason="killed by SIGKILL",
                signal=9,
                will_retry=False,
            ),
            ev.StepSkipped(at=T0 + 31, run_id="r1", step="analysis", reason="md failed"),
            ev.RunFailed(
                at=T0 + 32, run_id="r1", duration_s=32.0, failed_steps=("md",), reason="md failed"
            ),
        )
    )
    run = state.runs["r1"]
    assert (run.steps["md"].status, run.steps["md"].signal) == ("failed", 9)
    assert (run.steps["analysis"].status, run.steps["analysis"].reason) == ("skipped", "md failed")
    assert run.steps["prep"].status == "pending"
    assert (run.status, run.failed_steps, run.reason) == ("failed", ("md",), "md failed")


def test_cancel_request_then_cancelled_steps_and_run() -> None:
    state = fold(
        records(
            submitted(),
            started("prep"),
            ev.CancelRequested(at=T0 + 11, run_id="r1", by="m27 cancel"),
        )
    )
    run = state.runs["r1"]
    assert run.cancel_requested and run.cancel_requested_by == "m27 cancel"
    assert run.status == "running"
    fold(
        [
            Recorded(4, ev.StepCancelled(at=T0 + 12, run_id="r1", step="prep", reason="cancel")),
            Recorded(5, ev.RunCancelled(at=T0 + 13, run_id="r1", reason="cancel")),
        ],
        state,
    )
    assert run.steps["prep"].status == "cancelled"
    assert run.status == "cancelled"
    assert run.ended_at == T0 + 13


def test_a_cancel_of_one_step_marks_that_step_and_leaves_the_run_going() -> None:
    state = fold(
        records(
            submitted(),
            started("prep"),
            ev.CancelRequested(at=T0 + 11, run_id="r1", by="cli:7", step="analysis"),
            ev.CancelRequested(at=T0 + 12, run_id="r1", by="bot", step="analysis"),
            ev.CancelRequested(at=T0 + 13, run_id="r1", by="cli:8", step="prep"),
        )
    )
    run = state.runs["r1"]
    assert not run.cancel_requested and run.status == "running"
    # the first asker is kept; a step that waits shows it before the run reaches it
    assert (run.steps["analysis"].status, run.steps["analysis"].cancel_requested_by) == (
        "pending",
        "cli:7",
    )
    assert run.steps["prep"].cancel_requested_by == "cli:8"
    assert run.steps["md"].cancel_requested_by == ""
    # a step that already ended keeps no request (a late cancel changes nothing)
    apply(state, Recorded(6, ev.StepSucceeded(T0 + 14, "r1", "md", attempt=1, duration_s=1.0)))
    apply(state, Recorded(7, ev.CancelRequested(at=T0 + 15, run_id="r1", by="x", step="md")))
    assert run.steps["md"].cancel_requested_by == ""


def test_resumed_run_links_to_the_original_and_skips_done_steps() -> None:
    state = fold(
        records(
            submitted("r1"),
            ev.RunFailed(at=T0 + 5, run_id="r1", duration_s=5.0, failed_steps=("md",)),
            submitted("r2", resume_of="r1"),
            ev.StepSkipped(at=T0 + 7, run_id="r2", step="prep", reason="succeeded in r1"),
        )
    )
    assert state.runs["r2"].resume_of == "r1"
    assert state.runs["r2"].steps["prep"].status == "skipped"
    assert [r.run_id for r in live_runs(state)] == ["r2"]


def test_checkpoints_count_and_remember_the_last_one() -> None:
    def written(n: int) -> ev.CheckpointWritten:
        return ev.CheckpointWritten(
            at=T0 + n,
            run_id="r1",
            step="md",
            path=f"/ck/{n}",
            sim_step=n * 1000,
            bytes_written=10,
            bytes_total=100,
            duration_s=0.01,
        )

    state = fold(records(submitted(), started("md"), written(1), written(2)))
    md = state.runs["r1"].steps["md"]
    assert (md.last_checkpoint, md.checkpoint_step, md.checkpoints) == ("/ck/2", 2000, 2)
    apply(
        state, ev.CheckpointRestored(at=T0 + 9, run_id="r1", step="md", path="/ck/2", sim_step=2000)
    )
    assert md.restored_from == "/ck/2"
    # a capture of GROMACS's .cpt: sim_step counts captures, the MD step is the program's
    capture = dataclasses.replace(written(3), source="files", files=("s.cpt",), sim_step=3)
    apply(state, dataclasses.replace(capture, engine_step=45_000))
    assert (md.checkpoint_step, md.checkpoints) == (45_000, 3)
    apply(state, capture)  # an engine whose step m27 cannot read: none, not the count
    assert md.checkpoint_step is None


def test_requests_become_leases_and_leases_are_released() -> None:
    state = fold(
        records(
            submitted(),
            ev.StepRequested(at=T0 + 1, run_id="r1", step="md", type="gpu", gpus=1, pid=9),
            ev.StepRequested(at=T0 + 1, run_id="r1", step="analysis", type="gpu_light", gpus=1),
        )
    )
    assert set(state.requests) == {("r1", "md"), ("r1", "analysis")}
    apply(state, ev.LeaseGranted(at=T0 + 2, run_id="r1", step="md", gpus=(1,), tier="immediate"))
    assert state.leases == {("r1", "md"): (1,)}
    assert set(state.requests) == {("r1", "analysis")}
    assert state.runs["r1"].steps["md"].tier == "immediate"
    apply(state, ev.LeaseReleased(at=T0 + 3, run_id="r1", step="md", gpus=(1,)))
    assert state.leases == {}
    assert state.runs["r1"].steps["md"].tier is None


def test_guest_lifecycle_pause_resume_promote() -> None:
    state = fold(
        records(
            submitted(),
            ev.LeaseGranted(at=T0 + 1, run_id="r1", step="analysis", gpus=(0,), tier="ready"),
            ev.GuestStarted(at=T0 + 2, run_id="r1", step="analysis", gpu=0),
            ev.GuestPaused(at=T0 + 3, run_id="r1", step="analysis", gpu=0, how="sigstop"),
        )
    )
    step = state.runs["r1"].steps["analysis"]
    assert (step.tier, step.guest_gpu, step.paused) == ("guest", 0, True)
    assert state.guests == {("r1", "analysis"): 0}
    apply(state, ev.GuestResumed(at=T0 + 4, run_id="r1", step="analysis", gpu=0))
    assert not step.paused
    apply(state, ev.Promoted(at=T0 + 5, run_id="r1", step="analysis", gpu=0))
    assert (step.tier, step.guest_gpu) == ("immediate", None)
    assert state.guests == {}
    assert state.lease_tiers[("r1", "analysis")] == "immediate"


def test_node_facts_priority_energy_lost_gpus_and_agent() -> None:
    state = fold(
        records(
            ev.AgentStarted(at=T0, pid=77, host="gpu1", gpus=4, backend="sim"),
            submitted(priority=2),
            ev.PriorityBumped(at=T0 + 1, run_id="r1", step="md", delta=5),
            ev.StepEnergyMeasured(at=T0 + 2, run_id="r1", step="md", gpu=0, joules=100.0),
            ev.StepEnergyMeasured(at=T0 + 3, run_id="r1", step="md", gpu=0, joules=50.0),
            ev.GpuLost(at=T0 + 4, gpu=3, reason="Xid 79"),
            ev.GpuOverheated(at=T0 + 5, gpu=1, temperature_c=91.0, threshold_c=85.0),
            ev.GpuThrottled(at=T0 + 6, gpu=2, reasons=("thermal", "power")),
        )
    )
    md = state.runs["r1"].steps["md"]
    assert md.priority == 7
    assert md.energy_j == 150.0
    assert state.lost_gpus == {3}
    assert state.overheated == {1: 91.0}
    assert state.throttled == {2: ("thermal", "power")}
    assert state.agent is not None and (state.agent.pid, state.agent.gpus) == (77, 4)


def test_orphaned_steps_are_running_steps_whose_process_is_gone() -> None:
    state = fold(
        records(
            submitted("r1"),
            submitted("r2"),
            started("prep", pid=100, run="r1"),
            started("md", pid=200, run="r1"),
            started("prep", pid=300, run="r2"),
            ev.StepSucceeded(at=T0 + 20, run_id="r2", step="prep", attempt=1, duration_s=1.0),
        )
    )
    alive = {100}
    orphans = orphaned_steps(state, lambda pid, _started: pid in alive)
    assert [(s.run_id, s.name, s.pid) for s in orphans] == [("r1", "md", 200)]


def test_events_for_an_unknown_run_are_counted_not_invented() -> None:
    state = fold(records(started("md", run="ghost")))
    assert state.runs == {}
    assert state.unknown_run_events == 1


def test_fold_of_a_store_replay_equals_incremental_apply() -> None:
    store = MemoryEventStore()
    store.append([submitted(), started("prep")])
    store.append(
        [ev.StepSucceeded(at=T0 + 20, run_id="r1", step="prep", attempt=1, duration_s=1.0)]
    )
    incremental = NodeState()
    for rec in store.read():
        apply(incremental, rec)
    replayed = fold(store.read())
    assert replayed == incremental
    assert replayed.last_seq == 3
    assert replayed.last_at == T0 + 20
