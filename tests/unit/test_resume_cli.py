"""`m27 run --resume RUN` of a run that is still running is refused: its steps would run
twice at once (a run whose process died may be resumed: that is what resume is for)."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
from pathlib import Path

import pytest

from m27 import events as ev
from m27 import liveness
from m27.cli.main import main
from m27.store.sqlite import open_store


def _submitted(run_id: str, pid: int, spec: Path) -> ev.RunSubmitted:
    return ev.RunSubmitted(
        1.0,
        run_id,
        "p",
        str(spec),
        ("a",),
        pid=pid,
        host=socket.gethostname(),
        pid_started=liveness.start_time(pid),
    )


#: A one-step pipeline this node cannot run (9 GPUs): a resume that gets past its own
#: checks stops there, before any service starts.
NINE_GPUS = "name: p\npipeline:\n  - {name: a, type: gpu, gpus: 9, command: 'true'}\n"


def _dead_run(home: Path, run_id: str, spec: Path, **vars: str) -> None:
    """Record run `run_id` of `spec` whose flow process has exited."""
    dead = subprocess.Popen(["sleep", "60"])
    submitted = _submitted(run_id, dead.pid, spec)  # its start time: a reused pid is not it
    dead.kill()
    dead.wait()
    store = open_store(home)
    store.append([dataclasses.replace(submitted, vars=vars)])
    store.close()


def test_resuming_a_live_run_is_refused_and_a_dead_ones_is_not(
    m27_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "p.yaml"
    spec.write_text(NINE_GPUS)
    store = open_store(m27_home)
    store.append([_submitted("live", os.getpid(), spec)])
    store.close()
    _dead_run(m27_home, "dead", spec)

    with pytest.raises(SystemExit) as refused:
        main(["run", "--resume", "live", "--plain"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert f"run live is still running (pid {os.getpid()})" in err
    assert "m27 cancel live" in err
    # the dead one gets past that check, to the next: this node has no 9 GPUs
    assert main(["run", "--resume", "dead", "--plain"]) == 2
    assert "needs 9 GPUs" in capsys.readouterr().err


def test_resuming_a_run_whose_file_is_gone_says_how_to_give_its_new_path(
    m27_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "p.yaml"
    _dead_run(m27_home, "gone", spec)
    with pytest.raises(SystemExit) as refused:
        main(["run", "--resume", "gone", "--plain"])
    assert refused.value.code == 2
    assert capsys.readouterr().err.strip() == (
        f"m27 run: {spec}, the pipeline file of run gone, is gone; "
        "if it moved, give its new path: m27 run --resume gone FILE"
    )
    moved = tmp_path / "moved.yaml"
    moved.write_text(NINE_GPUS)
    assert main(["run", "--resume", "gone", str(moved), "--plain"]) == 2
    assert f"{moved}:3:32: pipeline[0].gpus: step 'a' needs 9 GPUs" in capsys.readouterr().err


def test_a_new_value_on_resume_is_noted_with_the_old_one(
    m27_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "p.yaml"
    spec.write_text(NINE_GPUS)
    _dead_run(m27_home, "old", spec, X="custom", Y="same")
    assert main(["run", "--resume", "old", "--set", "X=other", "--set", "Y=same", "--plain"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        "m27 run: note: run old had X='custom'; the steps that succeeded there are not run "
        "again with the new value"
    )


def test_a_resume_with_nothing_left_to_run_says_so_and_starts_nothing(
    m27_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It recorded a new run that only skipped every step (through the node service and
    Prefect); a final output deleted since is named, as no step left to run needs it."""
    spec = tmp_path / "p.yaml"
    spec.write_text(NINE_GPUS.replace("command: 'true'}", "command: 'true', output: a.out}"))
    _dead_run(m27_home, "done", spec)
    store = open_store(m27_home)
    store.append([ev.StepSucceeded(2.0, "done", "a", 1, 1.0), ev.RunSucceeded(2.1, "done", 1.1)])
    store.close()
    with pytest.raises(SystemExit) as ended:
        main(["run", "--resume", "done", "--plain"])
    assert ended.value.code == 0
    out, err = capsys.readouterr()
    assert out == (
        "m27 run: every step of run done has succeeded (there or in a run it resumed): "
        f"nothing to resume. To run the pipeline again: m27 run {spec}; to run a step and "
        "those after it again: m27 run --resume done --rerun STEP\n"
    )
    assert err == (
        "m27 run: note: step a's output a.out is gone, and no step left to run needs it "
        "(--rerun a makes it again)\n"
    )
    store = open_store(m27_home)
    assert [r.event.run_id for r in store.read() if isinstance(r.event, ev.RunSubmitted)] == [
        "done"
    ]
    store.close()


def test_resuming_a_run_that_a_live_run_resumes_already_is_refused(
    m27_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The node service's `on_crash: resume` resumed the crashed run; a /resume from the
    phone (or a person at the node) of the same crashed run would run its steps twice."""
    from flows._params import resumed_run
    from m27.spec import SpecError, load_pipeline

    spec = tmp_path / "p.yaml"
    spec.write_text(NINE_GPUS)
    _dead_run(m27_home, "crashed", spec)
    store = open_store(m27_home)
    store.append([dataclasses.replace(_submitted("again", os.getpid(), spec), resume_of="crashed")])
    with pytest.raises(SystemExit) as refused:
        main(["run", "--resume", "crashed", "--plain"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert f"run again resumes crashed and is still running (pid {os.getpid()})" in err, err
    assert "m27 status again" in err
    # the flow (a deployment's run given resume_of) refuses it too
    with pytest.raises(SpecError, match="run again resumes crashed and is still running"):
        resumed_run(store, "crashed", load_pipeline(spec))
    store.close()
    # once that resume has ended (here: crashed too), the run may be resumed again
    store = open_store(m27_home)
    store.append([ev.RunCrashed(2.0, "again", "its process is gone")])
    store.close()
    assert main(["run", "--resume", "crashed", "--plain"]) == 2
    assert "needs 9 GPUs" in capsys.readouterr().err
