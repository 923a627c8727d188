"""run_slurm_step against a scripted fake Slurm on a FakeClock: requeues, end states,
lost controllers, cancellation and the events they leave."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from m27.clock import FakeClock
from m27.events import (
    Event,
    RunSubmitted,
    SlurmJobStateChanged,
    SlurmJobSubmitted,
    StepCancelled,
    StepFailed,
    StepStarted,
    StepSucceeded,
)
from m27.events.state import fold
from m27.executors.local import StepLaunch, StepResult
from m27.executors.slurm import run_slurm_step
from m27.executors.slurm._follow import LOST_AFTER_S
from m27.executors.slurm._jobs import JobInfo, SlurmError
from m27.store.memory import MemoryEventStore

Poll = JobInfo | SlurmError | None


class FakeSlurm:
    """Answers each `show` with the next scripted poll (the last one repeats); `starts`
    and `output` are written into the job's directory when the job is submitted."""

    def __init__(
        self,
        polls: list[Poll],
        starts: tuple[str, ...] = ("0\tnode1\t0\t",),
        output: str = "hello\n",
        submit_error: SlurmError | None = None,
    ) -> None:
        self.polls, self.starts, self.output = polls, starts, output
        self.submit_error = submit_error
        self.submitted: list[tuple[Path, dict[str, str]]] = []
        self.cancelled: list[str] = []
        self.i = 0

    def submit(self, script: Path, env: Mapping[str, str]) -> str:
        if self.submit_error is not None:
            raise self.submit_error
        self.submitted.append((script, dict(env)))
        (script.parent / "starts").write_text("".join(s + "\n" for s in self.starts))
        (script.parent / "stdout").write_text(self.output)
        self.i = 0
        return str(100 + len(self.submitted))

    def show(self, job_id: str) -> JobInfo | None:
        poll = self.polls[min(self.i, len(self.polls) - 1)]
        self.i += 1
        if isinstance(poll, SlurmError):
            raise poll
        return None if poll is None else JobInfo(**{**poll.__dict__, "job_id": job_id})

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)
        self.polls = [JobInfo(job_id, "CANCELLED", exit_code=None, signal=15)]
        self.i = 0


def job(state: str, **kw: Any) -> JobInfo:
    return JobInfo("?", state, **kw)


def run(
    tmp_path: Path,
    fake: FakeSlurm,
    options: Mapping[str, Any] | None = None,
    cancel: threading.Event | None = None,
    **launch_kw: Any,
) -> tuple[StepResult, MemoryEventStore]:
    store = MemoryEventStore()
    store.append([RunSubmitted(0.0, "r1", "p", "p.yaml", ("s1",))])
    launch = StepLaunch(
        "r1", "s1", ("python3", "step.py"), log_path=tmp_path / "s1.log", **launch_kw
    )
    result = run_slurm_step(
        launch,
        store,
        options=options or {},
        clock=FakeClock(),
        cli=fake,
        site={},
        cancel=cancel,
        python="/usr/bin/python3",
    )
    return result, store


def of(store: MemoryEventStore, kind: type[Event]) -> list[Any]:
    return [r.event for r in store.read() if isinstance(r.event, kind)]


def test_requeued_job_is_followed_through_its_restart_to_success(tmp_path: Path) -> None:
    fake = FakeSlurm(
        [
            job("PENDING"),
            job("RUNNING", node="node1"),
            job("PENDING", reason="BeginTime", restarts=1),
            job("RUNNING", restarts=1),
            job("COMPLETED", exit_code=0, restarts=1),
        ],
        starts=("0\tnode1\t0\t", "1\tnode2\t1\t/ck/000002.json"),
    )
    result, store = run(tmp_path, fake)
    assert result.ok and result.attempts == 1
    assert len(of(store, StepSucceeded)) == 1
    assert [e.state for e in of(store, SlurmJobStateChanged)] == [
        "PENDING",
        "RUNNING",
        "PENDING",
        "RUNNING",
        "COMPLETED",
    ]
    assert of(store, SlurmJobStateChanged)[2].reason == "requeued (restart 1): BeginTime"
    starts = of(store, StepStarted)
    assert [(s.host, s.gpus, s.resume_from, s.pid) for s in starts] == [
        ("node1", (0,), None, 0),
        ("node2", (1,), "/ck/000002.json", 0),
    ]
    log = (tmp_path / "s1.log").read_text()
    assert "restarted (1) on node2, resuming from /ck/000002.json" in log and "hello" in log
    step = fold(store.read()).runs["r1"].steps["s1"]
    assert (step.status, step.slurm_job_id, step.slurm_state) == ("succeeded", "101", "COMPLETED")


@pytest.mark.parametrize(
    ("final", "reason"),
    [
        (job("TIMEOUT", signal=15), "Slurm TIMEOUT: reached its time limit (5 min)"),
        (
            job("OUT_OF_MEMORY", signal=9),
            "Slurm OUT_OF_MEMORY: went over its memory limit (1G), killed by SIGKILL",
        ),
        (job("FAILED", exit_code=137), "Slurm FAILED: killed by SIGKILL"),
        (job("NODE_FAIL", node="n3"), "Slurm NODE_FAIL: its node n3 failed, no exit code"),
    ],
)
def test_end_states_are_reported_with_slurms_name(
    tmp_path: Path, final: JobInfo, reason: str
) -> None:
    result, store = run(tmp_path, FakeSlurm([job("RUNNING"), final]), {"time": 5, "mem": "1G"})
    assert not result.ok and result.reason == reason
    assert of(store, StepFailed)[0].reason == reason


def test_preempted_state_that_turns_into_a_requeue_is_not_an_end(tmp_path: Path) -> None:
    fake = FakeSlurm(
        [
            job("RUNNING"),
            job("PREEMPTED"),
            job("PENDING", restarts=1),
            job("COMPLETED", exit_code=0),
        ]
    )
    result, _ = run(tmp_path, fake)
    assert result.ok


def test_preempted_state_that_lasts_ends_the_attempt(tmp_path: Path) -> None:
    result, _ = run(tmp_path, FakeSlurm([job("RUNNING"), job("PREEMPTED", signal=15)]))
    assert result.reason.startswith("Slurm PREEMPTED")


def test_a_short_controller_outage_is_ridden_out(tmp_path: Path) -> None:
    down = SlurmError("scontrol: Unable to contact slurm controller", transient=True)
    result, _ = run(
        tmp_path, FakeSlurm([job("RUNNING"), down, down, job("COMPLETED", exit_code=0)])
    )
    assert result.ok


def test_a_job_lost_for_too_long_fails_the_attempt_and_is_retried(tmp_path: Path) -> None:
    down = SlurmError("scontrol: Unable to contact slurm controller", transient=True)
    fake = FakeSlurm([job("RUNNING"), down], output="")
    result, store = run(tmp_path, fake, {"poll": "10s"}, retries=1)
    assert not result.ok and result.attempts == 2
    assert f"for {LOST_AFTER_S:.0f}s" in result.reason and "controller" in result.reason
    assert [f.will_retry for f in of(store, StepFailed)] == [True, False]


def test_cancel_scancels_the_job_and_records_step_cancelled(tmp_path: Path) -> None:
    cancel = threading.Event()

    class CancelledWhileRunning(FakeSlurm):
        def show(self, job_id: str) -> JobInfo | None:
            cancel.set()  # `m27 cancel` arrives while the job runs
            return super().show(job_id)

    fake = CancelledWhileRunning([job("RUNNING")])
    result, store = run(tmp_path, fake, cancel=cancel)
    assert result.cancelled and fake.cancelled == ["101"]
    assert len(of(store, StepCancelled)) == 1
    assert of(store, SlurmJobStateChanged)[-1].state == "CANCELLED"
    assert "m27: scancel 101" in (tmp_path / "s1.log").read_text()


def test_sbatch_rejection_fails_without_retry(tmp_path: Path) -> None:
    fake = FakeSlurm([], submit_error=SlurmError("sbatch: error: invalid partition specified: x"))
    result, store = run(tmp_path, fake, retries=3)
    assert not result.ok and result.attempts == 1
    assert result.reason == "sbatch: error: invalid partition specified: x"
    assert of(store, SlurmJobSubmitted) == []


def test_bad_options_fail_the_step_before_anything_is_submitted(tmp_path: Path) -> None:
    fake = FakeSlurm([])
    result, store = run(tmp_path, fake, {"gpu": 2})
    assert not result.ok and "unknown key 'gpu'" in result.reason
    assert fake.submitted == [] and len(of(store, StepFailed)) == 1


def test_job_cancelled_outside_m27_is_a_failure_not_retried(tmp_path: Path) -> None:
    result, _ = run(tmp_path, FakeSlurm([job("RUNNING"), job("CANCELLED", signal=15)]), retries=2)
    assert not result.ok and not result.cancelled and result.attempts == 1
    assert result.reason == "Slurm CANCELLED: cancelled outside m27 (scancel)"


def test_missing_declared_output_fails_a_completed_job(tmp_path: Path) -> None:
    fake = FakeSlurm([job("COMPLETED", exit_code=0)])
    result, _ = run(tmp_path, fake, workdir=tmp_path, outputs=("result.csv",))
    assert result.reason == "declared output missing: result.csv"


def test_the_job_gets_the_m27_environment_and_a_script_next_to_its_output(tmp_path: Path) -> None:
    fake = FakeSlurm([job("COMPLETED", exit_code=0)])
    result, _ = run(tmp_path, fake, {"gpus": 1}, checkpoint_dir=tmp_path / "ck", env={"A": "1"})
    assert result.ok
    script, env = fake.submitted[0]
    assert script == tmp_path / "s1.slurm" / "attempt-1" / "job.sh"
    assert "#SBATCH --gres=gpu:1" in script.read_text()
    assert env["M27_RUN_ID"] == "r1" and env["M27_ATTEMPT"] == "1" and env["A"] == "1"
    assert env["M27_CHECKPOINT_DIR"] == str(tmp_path / "ck")
    assert "CUDA_VISIBLE_DEVICES" not in env
