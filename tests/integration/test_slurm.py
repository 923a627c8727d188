"""Steps run as jobs on a real single-node Slurm (two fake GPUs), through run_slurm_step.

What is real and what is simulated here: the time-limit test uses a real 2-minute limit;
Slurm itself sends the pre-timeout USR1 (``--signal=B:USR1@55``), the step checkpoints,
the batch script requeues the job and the restart resumes. A step that opts out of
requeueing reaches the real limit and is reported as ``Slurm TIMEOUT``. Preemption is
simulated with ``scontrol requeue`` (what PreemptMode=REQUEUE does: TERM, then requeue).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from m27.events import (
    CheckpointRestored,
    CheckpointWritten,
    Event,
    RunCancelled,
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
from m27.store import EventStore
from m27.store.memory import MemoryEventStore
from m27.store.sqlite import open_store
from tests.integration.slurm_fixture import (  # noqa: F401
    CKPT_STEP,
    job_state,
    scontrol,
    slurm_cluster,
)
from tests.waiting import wait_until

pytestmark = [pytest.mark.service, pytest.mark.usefixtures("slurm_cluster")]

PY = sys.executable
FAST = {"poll": 0.2}


def of(store: EventStore, kind: type[Event]) -> list[Any]:
    return [r.event for r in store.read() if isinstance(r.event, kind)]


def in_thread(fn: Callable[[], StepResult]) -> tuple[threading.Thread, list[StepResult]]:
    box: list[StepResult] = []
    t = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    t.start()
    return t, box


def test_pipeline_of_cpu_and_gpu_steps_gets_gpus_from_slurm(tmp_path: Path) -> None:
    store = MemoryEventStore()
    report = "import os; print('gpus=' + repr(os.environ.get('CUDA_VISIBLE_DEVICES')))"
    lines: list[tuple[str, str]] = []
    prep = StepLaunch(
        "r1",
        "prep",
        (PY, "-c", report + "; open('data.txt','w').write('7')"),
        workdir=tmp_path,
        outputs=("data.txt",),
    )
    train = StepLaunch(
        "r1",
        "train",
        (PY, "-c", report + "; print(open('data.txt').read())"),
        workdir=tmp_path,
        log_path=tmp_path / "train.log",
    )
    r1 = run_slurm_step(prep, store, options={"cpus": 1, **FAST}, site={})
    r2 = run_slurm_step(
        train,
        store,
        options={"gpus": 2, "mem": "100M", **FAST},
        site={},
        on_lines=lambda s, batch: lines.extend((s, line) for line in batch),
    )
    assert r1.ok and r2.ok, (r1.reason, r2.reason)
    assert r1.log_tail == "gpus=''"  # a CPU step sees no GPU
    assert lines == [("stdout", "gpus='0,1'"), ("stdout", "7")]
    assert "gpus='0,1'" in (tmp_path / "train.log").read_text()
    started = of(store, StepStarted)
    assert [(s.step, s.gpus, s.host != "") for s in started] == [
        ("prep", (), True),
        ("train", (0, 1), True),
    ]
    jobs = of(store, SlurmJobSubmitted)
    assert len({j.job_id for j in jobs}) == 2
    final = [e.state for e in of(store, SlurmJobStateChanged)][-1]
    assert final == "COMPLETED"
    assert len(of(store, StepSucceeded)) == 2


def test_a_step_in_a_folder_with_blanks_hash_and_percent_runs(tmp_path: Path) -> None:
    """sbatch ends an #SBATCH value at a blank and a comment at `#`: a pipeline in
    `~/My Project` got `Invalid directive found in batch script: Project`. The folder is
    the job's --chdir and holds its --output/--error (where `%` is Slurm's pattern)."""
    folder = tmp_path / 'my project #1 (100%) "q"'
    folder.mkdir()
    store = MemoryEventStore()
    launch = StepLaunch(
        "r1", "here", (PY, "-c", "import os; print(os.getcwd())"), workdir=folder
    )  # fmt: skip
    result = run_slurm_step(launch, store, options=FAST, site={})
    assert result.ok, result.reason
    assert result.log_tail == str(folder)
    assert [e.state for e in of(store, SlurmJobStateChanged)][-1] == "COMPLETED"


def test_failing_job_reports_exit_code_slurm_state_and_output(tmp_path: Path) -> None:
    store = MemoryEventStore()
    launch = StepLaunch("r1", "bad", ("sh", "-c", "echo broken >&2; exit 3"), retries=1)
    starts_before_line: list[int] = []  # each attempt's output comes after its start
    result = run_slurm_step(
        launch,
        store,
        options=FAST,
        site={},
        on_lines=lambda s, batch: starts_before_line.extend(
            len(of(store, StepStarted)) for _ in batch
        ),
    )
    assert starts_before_line == [1, 2]
    assert not result.ok and result.attempts == 2
    assert result.exit_code == 3
    assert result.reason == "Slurm FAILED: exited with code 3"
    failed = of(store, StepFailed)
    assert [f.will_retry for f in failed] == [True, False]
    assert failed[-1].log_tail == "broken"
    assert len({j.job_id for j in of(store, SlurmJobSubmitted)}) == 2


def test_a_job_slurm_refuses_fails_once_in_slurms_words_named_once(tmp_path: Path) -> None:
    store = MemoryEventStore()
    launch = StepLaunch("r1", "lost", ("true",), retries=2, workdir=tmp_path)
    result = run_slurm_step(launch, store, options={"partition": "nosuch", **FAST}, site={})
    assert not result.ok and result.attempts == 1  # not retried: it cannot succeed
    # sbatch prints two "sbatch: error: ..." lines: one reason, one line, sbatch named once
    assert result.reason.startswith("sbatch: ") and result.reason.count("sbatch") == 1
    assert "\n" not in result.reason and "error:" not in result.reason
    assert "Invalid partition name specified" in result.reason
    assert of(store, SlurmJobSubmitted) == []


def test_m27_cancel_scancels_the_running_job(tmp_path: Path, m27_home: Path) -> None:
    store = open_store(m27_home)
    store.append(
        [
            RunSubmitted(
                time.time(),
                "c1",
                "p",
                "p.yaml",
                ("long",),
                pid=os.getpid(),
                host=os.uname().nodename,
            )
        ]
    )
    cancel = threading.Event()
    launch = StepLaunch("c1", "long", ("sleep", "300"))
    t, box = in_thread(lambda: run_slurm_step(launch, store, options=FAST, site={}, cancel=cancel))

    def watch() -> None:  # what the flow does: a CancelRequested sets the run's cancel flag
        after = 0
        while not cancel.is_set():
            for rec in store.follow(after, timeout=0.5):
                after = rec.seq
                if type(rec.event).__name__ == "CancelRequested":
                    cancel.set()

    threading.Thread(target=watch, daemon=True).start()
    wait_until(lambda: bool(of(store, StepStarted)), 30, 0.1, "the job never started")
    job_id = of(store, SlurmJobSubmitted)[0].job_id
    cli = subprocess.Popen(
        [PY, "-m", "m27.cli", "cancel", "c1", "--wait", "30"],
        stdout=subprocess.PIPE,
        text=True,
    )
    t.join(60)
    assert box and box[0].cancelled and box[0].reason == "cancelled"
    store.append([RunCancelled(time.time(), "c1", "cancel requested")])
    assert cli.wait(30) == 0
    assert job_state(job_id) == "CANCELLED"
    assert of(store, StepCancelled)[0].step == "long"
    assert of(store, SlurmJobStateChanged)[-1].state == "CANCELLED"
    assert fold(store.read()).runs["c1"].steps["long"].slurm_job_id == job_id


def _ckpt_launch(tmp_path: Path, step: str, home: Path) -> StepLaunch:
    script = tmp_path / "ckpt_step.py"
    script.write_text(CKPT_STEP)
    return StepLaunch(
        "t1",
        step,
        (PY, str(script), str(tmp_path / f"{step}.json")),
        workdir=tmp_path,
        checkpoint_dir=home / "checkpoints" / "t1" / step,
        log_path=tmp_path / f"{step}.log",
    )


def _check_resumed(store: EventStore, tmp_path: Path, step: str, result: StepResult) -> None:
    assert result.ok, result.reason
    out = json.loads((tmp_path / f"{step}.json").read_text())
    written = [e for e in of(store, CheckpointWritten) if e.step == step]
    restored = [e for e in of(store, CheckpointRestored) if e.step == step]
    assert len(written) == 1 and len(restored) == 1
    saved_at = written[0].sim_step
    # State continued: it restarted from the checkpoint, not from zero.
    assert out["start"] == saved_at > 0
    assert out["end"] == saved_at + 20 and out["x"] == float(saved_at + 20)
    assert out["resume"] == written[0].path == restored[0].path
    assert out["restart"] == "1"
    starts = [e for e in of(store, StepStarted) if e.step == step]
    assert [s.resume_from for s in starts] == [None, written[0].path]
    assert len({j.job_id for j in of(store, SlurmJobSubmitted) if j.step == step}) == 1


def test_preempted_job_checkpoints_is_requeued_and_resumes(tmp_path: Path, m27_home: Path) -> None:
    store = open_store(m27_home)
    launch = _ckpt_launch(tmp_path, "pre", m27_home)
    t, box = in_thread(lambda: run_slurm_step(launch, store, options=FAST, site={}))
    wait_until(lambda: "start at 0" in _read(launch.log_path), 30, 0.1, "the step never started")
    job_id = of(store, SlurmJobSubmitted)[0].job_id
    # Requeue only once the follower has recorded the first RUNNING (asserted below).
    wait_until(
        lambda: any(e.state == "RUNNING" for e in of(store, SlurmJobStateChanged)),
        60,
        0.1,
        "the job's RUNNING state in the log",
    )
    scontrol("requeue", job_id)  # what PreemptMode=REQUEUE does: TERM, then requeue
    t.join(90)
    assert box, "the step did not end"
    _check_resumed(store, tmp_path, "pre", box[0])
    states = [e.state for e in of(store, SlurmJobStateChanged)]
    assert states[0] in ("PENDING", "RUNNING") and states[-1] == "COMPLETED"
    assert states.count("RUNNING") == 2


@pytest.mark.slow
def test_time_limit_signal_checkpoints_requeues_and_resumes_and_without_requeue_times_out(
    tmp_path: Path, m27_home: Path
) -> None:
    store = open_store(m27_home)
    launch = _ckpt_launch(tmp_path, "sim", m27_home)
    limited = StepLaunch("t1", "stuck", ("sleep", "600"), log_path=tmp_path / "stuck.log")
    # Both run at once: Slurm checks time limits about every 30 s, so each needs 1-2 min.
    # A 2-minute limit with USR1 55 s before it: the signal comes 35-95 s in, while the
    # step runs (with a 1-minute limit it may come before the step has even started).
    t1, box1 = in_thread(
        lambda: run_slurm_step(
            launch, store, options={"time": 2, "signal_before": 55, **FAST}, site={}
        )
    )
    t2, box2 = in_thread(
        lambda: run_slurm_step(
            limited, store, options={"time": "1m", "requeue": False, **FAST}, site={}
        )
    )
    t1.join(200)
    t2.join(60)
    assert box1 and box2, "a step did not end"
    _check_resumed(store, tmp_path, "sim", box1[0])
    log = _read(launch.log_path)
    assert "requeueing job" in log and "restarted (1)" in log
    assert "DUE TO TIME LIMIT" not in log  # the signal came before the limit, not at it
    timed_out = box2[0]
    assert not timed_out.ok and timed_out.reason.startswith("Slurm TIMEOUT")
    stuck_states = [e.state for e in of(store, SlurmJobStateChanged) if e.step == "stuck"]
    assert stuck_states[-1] == "TIMEOUT"


def _read(path: Path | None) -> str:
    assert path is not None
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def test_a_job_whose_mdrun_stopped_at_maxh_failed_though_it_completed(tmp_path: Path) -> None:
    """`gmx mdrun -maxh 23.5`, a job script's habit, ends the job COMPLETED with exit 0
    before the simulation's last step: it counted as a success. A stop on a signal does
    not count here: the batch script sends the checkpoint signal itself, and requeues."""
    maxh = "Step 15325: Run time exceeded 0.002 hours, will terminate the run within 25 steps"
    stopped = run_slurm_step(
        StepLaunch("r1", "md", ("sh", "-c", f"echo '{maxh}'; echo 'Performance: 1'"),
                   retries=3),
        MemoryEventStore(), options=FAST, site={},
    )  # fmt: skip
    assert not stopped.ok and stopped.exit_code == 0
    assert stopped.attempts == 1  # without a checkpoint, the next job would stop the same way
    assert stopped.reason == (
        "mdrun stopped at -maxh, its run time limit, at step 15325, before its last step; "
        "another attempt would start over and stop the same way: the step has no `checkpoint:`"
    )
    signalled = "Received the TERM signal, stopping within 100 steps"
    requeued = run_slurm_step(
        StepLaunch("r2", "md", ("sh", "-c", f"echo '{signalled}'")),
        MemoryEventStore(), options=FAST, site={},
    )  # fmt: skip
    assert requeued.ok
