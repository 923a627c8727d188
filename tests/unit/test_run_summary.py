"""The run summary artifact and the plot links: what a user finds in Prefect's Artifacts tab
after a run (keys as README says; steps with status, GPUs, attempts, time, checkpoints;
outputs as absolute paths; a link only to plots that exist)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows import _logging
from flows.summary import plot_key, plots, summary_key, summary_markdown
from m27.events import (
    CheckpointWritten,
    RunFailed,
    RunSubmitted,
    StepFailed,
    StepSkipped,
    StepStarted,
    StepSucceeded,
)
from m27.events.state import NodeState, fold

ROOT = str(Path(__file__).resolve().parents[2])


def _state(tmp_path: Path) -> NodeState:
    plot = tmp_path / "out" / "analysis.png"
    plot.parent.mkdir()
    plot.write_bytes(b"\x89PNG")
    run = "20261201-120000-abcd"
    return fold(
        [
            RunSubmitted(
                at=1.0,
                run_id=run,
                pipeline="MD_example",
                spec_path="p.yaml",
                steps=("md", "fit", "plot"),
            ),
            StepStarted(
                at=2.0, run_id=run, step="md", attempt=1, pid=5, pgid=5, command=("x",), gpus=(1,)
            ),
            CheckpointWritten(
                at=3.0,
                run_id=run,
                step="md",
                path="/c/1.json",
                sim_step=200,
                bytes_written=10,
                bytes_total=10,
                duration_s=0.01,
            ),
            StepSucceeded(
                at=4.0,
                run_id=run,
                step="md",
                attempt=1,
                duration_s=2.0,
                outputs=(str(plot), "out/missing.png"),
            ),
            StepStarted(at=4.0, run_id=run, step="fit", attempt=1, pid=6, pgid=6, command=("y",)),
            StepFailed(
                at=5.0,
                run_id=run,
                step="fit",
                attempt=1,
                duration_s=1.0,
                reason="exited with code 1 | oops",
                exit_code=1,
            ),
            StepSkipped(
                at=5.0, run_id=run, step="plot", reason="upstream step fit did not succeed"
            ),
            RunFailed(at=6.0, run_id=run, duration_s=5.0, failed_steps=("fit",), reason="fit"),
        ]
    )


def test_the_summary_lists_every_step_and_the_outputs_as_absolute_paths(tmp_path: Path) -> None:
    state = _state(tmp_path)
    text = summary_markdown(state, "20261201-120000-abcd", workdir=tmp_path)
    assert text.startswith("### Run `20261201-120000-abcd` of `MD_example`: failed in 5.0s")
    rows = {
        line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| `")
    }
    assert set(rows) == {"`md`", "`fit`", "`plot`"}
    assert "| succeeded | 1 | 1 | 2.0s |" in rows["`md`"] and "1 (last at step 200)" in rows["`md`"]
    assert "failed: exited with code 1 / oops" in rows["`fit`"]  # a | cannot break the table
    assert "skipped: upstream step fit did not succeed" in rows["`plot`"]
    assert f"`{tmp_path / 'out' / 'missing.png'}`" in text  # relative outputs made absolute


def test_a_step_whose_captured_files_record_no_step_shows_its_count_alone(
    tmp_path: Path,
) -> None:
    state = _state(tmp_path)
    md = state.runs["20261201-120000-abcd"].steps["md"]
    md.checkpoint_step = None  # a capture of a `files:` set no engine recipe reads
    text = summary_markdown(state, "20261201-120000-abcd", workdir=tmp_path)
    row = next(line for line in text.splitlines() if line.startswith("| `md`"))
    assert "| 1 |" in row.split("2.0s", 1)[1] and "None" not in row


def test_a_resume_names_the_run_it_resumes_and_the_steps_asked_to_run_again(
    tmp_path: Path,
) -> None:
    state = _state(tmp_path)
    run = state.runs["20261201-120000-abcd"]
    run.resume_of = "20261130-080000-0000"
    text = summary_markdown(state, run.run_id, workdir=tmp_path)
    assert text.endswith("\nResumes run `20261130-080000-0000`.\n")
    run.rerun = ("md", "fit")
    text = summary_markdown(state, run.run_id, workdir=tmp_path)
    assert text.endswith(
        "\nResumes run `20261130-080000-0000`. Asked to run `md`, `fit` again (`--rerun`).\n"
    )


def test_plots_are_the_image_outputs_that_exist_with_keys_as_documented(tmp_path: Path) -> None:
    state = _state(tmp_path)
    run = state.runs["20261201-120000-abcd"]
    assert plots(run, tmp_path) == [("md", (tmp_path / "out" / "analysis.png").resolve())]
    assert summary_key("MD_example") == "m27-run-md-example"
    assert plot_key("MD_example", "md_simulation") == "m27-plot-md-example-md-simulation"


def test_a_failed_steps_prefect_error_line_has_no_empty_traceback() -> None:
    _logging.install()
    _logging.install()  # idempotent
    logger = logging.getLogger("prefect.task_runs")
    ours = [f for f in logger.filters if type(f).__module__ == "flows._logging"]
    assert len(ours) == 1
    record = logger.makeRecord(
        "prefect.task_runs",
        logging.ERROR,
        __file__,
        1,
        "Task run failed with state",
        (),
        (None, None, None),
    )
    assert logger.filter(record)  # the logger's filters run before any handler formats it
    assert record.exc_info is None
    assert "NoneType" not in logging.Formatter().format(record)


def test_a_failed_runs_engine_traceback_is_dropped_and_other_errors_kept() -> None:
    from prefect.exceptions import FailedRun

    _logging.install()
    logger = logging.getLogger("prefect.flow_runs")

    def record(msg: str, exc: BaseException) -> logging.LogRecord:
        return logger.makeRecord(
            "prefect.flow_runs", logging.ERROR, __file__, 1, msg, (), (type(exc), exc, None)
        )

    assert not logger.filter(record(_logging.ENGINE_ERROR, FailedRun("run r: step(s) a failed")))
    assert logger.filter(record(_logging.ENGINE_ERROR, RuntimeError("a real bug")))
    assert logger.filter(record("something else", FailedRun("x")))


def test_the_dropped_message_is_the_one_prefects_engine_logs() -> None:
    """After a Prefect upgrade that rewords it, the filter would silently stop matching."""
    import inspect

    from prefect import flow_engine

    assert f'"{_logging.ENGINE_ERROR}"' in inspect.getsource(flow_engine.run_flow)


def test_a_steps_prefect_log_says_where_it_runs_and_why_slurm_holds_it() -> None:
    from flows._run import _milestone
    from m27 import events as ev

    assert (
        _milestone(ev.StepStarted(1.0, "r", "sim", 2, 41, 41, ("x",), (0, 1), host="gpu3"))
        == "started (attempt 2, pid 41 on gpu3, GPU 0,1)"
    )
    assert (
        _milestone(ev.StepStarted(1.0, "r", "sim", 1, 0, 0, ("x",), (), host="node7"))
        == "started (attempt 1, in Slurm on node7, CPU)"
    )
    assert _milestone(ev.SlurmJobSubmitted(1.0, "r", "sim", "192", 1)) == (
        "submitted as Slurm job 192 (attempt 1)"
    )
    pending = ev.SlurmJobStateChanged(1.0, "r", "sim", "192", "PENDING", "Resources")
    assert _milestone(pending) == "Slurm job 192 pending: Resources"
    assert _milestone(ev.SlurmJobStateChanged(1.0, "r", "sim", "192", "RUNNING")) is None
    assert _milestone(ev.StepSucceeded(1.0, "r", "sim", 1, 2.0)) is None
    resumed = ev.StepStarted(1.0, "r", "sim", 1, 41, 41, ("x",), (0,), resume_from="/c/7.json")
    assert _milestone(resumed) == "started (attempt 1, pid 41, GPU 0, resuming from /c/7.json)"
    assert _milestone(ev.GuestStarted(1.0, "r", "sim", 1)) == (
        "a guest on GPU 1, beside the GPU's primary: it computes in the primary's I/O waits "
        "and is held while the primary computes"
    )
    assert _milestone(ev.Promoted(1.0, "r", "sim", 1)) == (
        "promoted to primary on GPU 1 (its primary is done)"
    )
    assert _milestone(ev.StepRequeued(1.0, "r", "sim", 1, "GPU 0 lost")) == (
        "stopped: GPU 0 lost; requeued: it starts again when a GPU is free, from its last "
        "checkpoint if it has one"
    )
    # a failed attempt another follows is said (the task's state says only the last end)
    retried = ev.StepFailed(1.0, "r", "sim", 1, 2.0, "exited with code 3", will_retry=True)
    assert _milestone(retried) == "failed (attempt 1): exited with code 3 - retrying"
    assert _milestone(retried, retry_delay=30.0) == (
        "failed (attempt 1): exited with code 3 - retrying in 30.0s"
    )
    assert _milestone(ev.StepFailed(1.0, "r", "sim", 2, 2.0, "exited with code 3")) is None


LOG_TO_A_DEAD_SERVER = """
import sys
if sys.argv[1] == "m27":
    from flows import _logging
    _logging.install()
from prefect.logging.handlers import APILogWorker
worker = APILogWorker.instance()
worker.send({"name": "m27", "level": 20, "message": "step output", "flow_run_id": None,
             "task_run_id": None, "timestamp": "2026-12-03T10:00:00Z"})
worker.drain()
print("drained")
"""


@pytest.mark.parametrize("process", ["plain", "m27"])
def test_logs_prefect_cannot_store_are_not_printed_into_the_runs_output(process: str) -> None:
    """A full disk under Prefect's server made its log worker print `--- Error logging to
    API ---` and the error, without a line break, into `m27 run`'s output once per batch.
    A plain Prefect process shows what that was; m27's flow process does not print it."""
    done = subprocess.run(
        [sys.executable, "-c", LOG_TO_A_DEAD_SERVER, process],
        env={**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api", "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "drained", done.stderr[-2000:]
    assert ("Error logging to API" in done.stderr) == (process == "plain"), done.stderr


def test_a_run_the_users_second_ctrl_c_stopped_ends_cancelled_others_failed() -> None:
    # It was `failed: m27 run stopped: KeyboardInterrupt: ` (the empty message after a colon),
    # a failure for what the user did, and notified as one.
    from m27 import events as ev
    from m27.cli.commands.run import ABORTED, _stopped

    aborted = _stopped("r", KeyboardInterrupt())
    assert isinstance(aborted, ev.RunCancelled) and aborted.reason == ABORTED
    failed = _stopped("r", SystemExit(3))
    assert isinstance(failed, ev.RunFailed) and failed.reason == "m27 run stopped: SystemExit: 3"
    bare = _stopped("r", MemoryError())
    assert isinstance(bare, ev.RunFailed) and bare.reason == "m27 run stopped: MemoryError"


def test_a_guest_steps_prefect_state_says_how_long_it_was_held() -> None:
    """`m27 run` said `succeeded in 6.0s (held 4.0s as a guest)`, Prefect's task state only
    `succeeded in 6.0s`: the time the task showed was mostly the primary's."""
    from types import SimpleNamespace
    from typing import cast

    from flows._run import _Run, _StepLog
    from flows.pipeline import _state_of
    from m27 import events as ev
    from m27.executors.local import StepResult
    from m27.store.memory import MemoryEventStore

    store = MemoryEventStore()
    steps = SimpleNamespace(step=lambda name: SimpleNamespace(retry_delay=0.0))
    run = cast(_Run, SimpleNamespace(store=store, run_id="r", pipeline=steps))
    said: list[str] = []
    logger = SimpleNamespace(info=lambda f, m: said.append(m), warning=lambda f, m: None)
    told = _StepLog(run, "ana", logger)
    store.append(
        [
            ev.GuestStarted(1.0, "r", "ana", 0),
            ev.StepStarted(1.0, "r", "ana", 1, 41, 41, ("x",), (0,)),
            ev.GuestPaused(2.0, "r", "ana", 0),
            ev.GuestResumed(4.5, "r", "ana", 0),
            ev.GuestPaused(5.0, "r", "ana", 0),
            ev.Promoted(6.5, "r", "ana", 0),
            ev.StepSucceeded(7.0, "r", "ana", 1, 6.0),
        ]
    )
    told.catch_up()
    assert told.hold.seconds() == 4.0
    result = StepResult(True, 1, 0, None, 6.0, "succeeded", "")
    state = _state_of(result, told.succeeded, told.hold.seconds())
    assert state.message == "succeeded in 6.0s (held 4.0s as a guest)"
    assert said[0].startswith("a guest on GPU 0") and said[-1].startswith("promoted to primary")
    # a short hold is not worth saying (as `m27 run`)
    assert _state_of(result, told.succeeded, 0.2).message == "succeeded in 6.0s"


def test_a_log_that_cannot_be_read_does_not_stop_a_steps_output() -> None:
    """Each batch of output first looks at the log for the step's news (a retry's start);
    a log that fails then must not cost the output its way to Prefect and the terminal."""
    from types import SimpleNamespace
    from typing import cast

    from flows._run import _Run, _StepLog
    from m27 import StoreError
    from m27.store.memory import MemoryEventStore

    class Failing(MemoryEventStore):
        def last_seq(self) -> int:
            raise StoreError("disk I/O error")

    run = cast(_Run, SimpleNamespace(store=MemoryEventStore(), run_id="r", pipeline=None))
    told = _StepLog(run, "a", SimpleNamespace(info=print, warning=print))
    run.store = Failing()  # type: ignore[misc]
    told.before_output()  # says nothing, raises nothing
