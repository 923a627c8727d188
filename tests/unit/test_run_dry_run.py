"""`m27 run --dry-run`: what a run would do with each step, and nothing started. For a
resume that is the question before hours of compute: which steps are skipped as done,
which run again and why, and from which checkpoint a step goes on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from m27 import events as ev
from m27.checkpoint import Checkpointer
from m27.cli.main import main
from m27.store.sqlite import open_store

RUN = "20261205-080000-aaaa"
SPEC = """\
name: md
pipeline:
  - {name: prep, type: cpu, command: 'true', output: in.txt}
  - {name: md, type: gpu, command: 'true', depends_on: [prep], checkpoint: 5m}
  - {name: analysis, type: cpu, command: 'true', depends_on: [md]}
"""


@pytest.fixture
def spec(tmp_path: Path, m27_home: Path) -> Path:
    """RUN ran prep (in.txt there) and failed md after its checkpoint at step 2."""
    path = tmp_path / "md.yaml"
    path.write_text(SPEC)
    (tmp_path / "in.txt").write_text("prepared")
    with Checkpointer(m27_home / "checkpoints" / RUN / "md") as ck:
        ck.save({"x": np.zeros(8)}, step=2)
    store = open_store(m27_home)
    store.append(
        [
            ev.RunSubmitted(1.0, RUN, "md", str(path), ("prep", "md", "analysis")),
            ev.StepSucceeded(1.1, RUN, "prep", 1, 0.1),
            ev.StepFailed(1.2, RUN, "md", 1, 0.1, "exited with code 1", exit_code=1),
            ev.RunFailed(1.3, RUN, 0.3, ("md",), "step md failed"),
        ]
    )
    store.close()
    return path


def _will(out: str) -> dict[str, str]:
    rows = [line.split(None, 2) for line in out.splitlines()[2:] if line.startswith("  ")]
    return {name: will for name, _type, will in rows}


def _runs(home: Path) -> int:
    store = open_store(home)
    try:
        return sum(isinstance(r.event, ev.RunSubmitted) for r in store.read())
    finally:
        store.close()


def test_a_new_run_lists_every_step_and_starts_nothing(
    spec: Path, m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", str(spec), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "m27 run --dry-run: md (a new run); nothing is started"
    assert _will(out) == {"prep": "run", "md": "run", "analysis": "run"}
    assert _runs(m27_home) == 1 and not (m27_home / "service.json").exists()


def test_a_resume_says_what_is_skipped_and_where_each_step_goes_on_from(
    spec: Path, m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--resume", RUN, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert (
        out.splitlines()[0] == f"m27 run --dry-run: md (a resume of run {RUN}); nothing is started"
    )
    assert _will(out) == {
        "prep": f"skip: succeeded in run {RUN}",
        "md": f"run, from run {RUN}'s checkpoint at step 2",
        "analysis": "run, from the start",
    }
    assert main(["run", "--resume", RUN, "--rerun", "md", "--dry-run"]) == 0
    assert _will(capsys.readouterr().out) == {
        "prep": f"skip: succeeded in run {RUN}",
        "md": "run, from the start (--rerun)",
        "analysis": "run, from the start (it waits on a step --rerun runs)",
    }
    (spec.parent / "in.txt").unlink()  # md needs it: prep runs again
    assert main(["run", "--resume", RUN, "--dry-run"]) == 0
    assert _will(capsys.readouterr().out)["prep"] == "run again, from the start: in.txt gone"
    assert _runs(m27_home) == 1 and not (m27_home / "service.json").exists()


def test_a_resume_with_nothing_left_shows_its_plan_and_says_so(
    spec: Path, m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = open_store(m27_home)
    done = "20261205-090000-bbbb"
    store.append(
        [
            ev.RunSubmitted(2.0, done, "md", str(spec), ("prep", "md", "analysis"), resume_of=RUN),
            ev.StepSkipped(2.1, done, "prep", ev.StepSkipped.done_in(RUN)),
            ev.StepSucceeded(2.2, done, "md", 1, 0.1),
            ev.StepSucceeded(2.3, done, "analysis", 1, 0.1),
            ev.RunSucceeded(2.4, done, 0.4),
        ]
    )
    store.close()
    assert main(["run", "--resume", done, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert set(_will(out).values()) == {
        f"skip: succeeded in run {RUN}",
        f"skip: succeeded in run {done}",
    }
    assert out.splitlines()[-1] == (
        "nothing would run: every step succeeded (--rerun STEP runs one again)"
    )


def test_a_program_s_own_checkpoint_is_named_with_the_step_it_holds(
    spec: Path, m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GROMACS-like step: the runner captured its .cpt (the MD step read from the file);
    the resume restores that capture, and the dry run says which."""
    from m27.checkpoint.files import FileGuard, capture_dir

    work = spec.parent / "work"
    work.mkdir()
    (work / "state.cpt").write_bytes(b"state at 5120")
    folder = m27_home / "checkpoints" / RUN / "analysis"
    guard = FileGuard(
        capture_dir(folder), work, ["*.cpt"], store=None, run_id=RUN, step="analysis",
        read_step=lambda name, data: 5120,
    )  # fmt: skip
    guard.stop()  # the program has exited: its last file is captured
    assert main(["run", "--resume", RUN, "--dry-run"]) == 0
    assert _will(capsys.readouterr().out)["analysis"] == (
        f"run, from run {RUN}'s checkpoint at step 5120"
    )


def test_a_newer_complete_file_in_the_workdir_is_named_over_the_capture(
    tmp_path: Path,
    m27_home: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CP2K wrote its restart at step 12 after m27's last capture (step 10), then m27 was
    killed: the resume goes on from the file in the workdir (the runner says so when it
    starts), and the dry run must name that, not the older capture."""
    import os

    from m27.checkpoint.files import FileGuard, capture_dir
    from m27.executors.engines import recipe_named

    bin_dir = tmp_path / "bin"  # the plan reads the command, not the program: a stand-in
    bin_dir.mkdir()
    (bin_dir / "cp2k").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "cp2k").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    spec = tmp_path / "qm.yaml"
    spec.write_text(
        "name: qm\npipeline:\n"
        "  - {name: md, type: cpu, command: cp2k -i water.inp, checkpoint: 60s}\n"
    )
    (tmp_path / "water.inp").write_text(
        "&GLOBAL\n  PROJECT water\n  RUN_TYPE MD\n&END GLOBAL\n"
        "&MOTION\n  &MD\n    STEPS 40\n  &END MD\n&END MOTION\n"
    )
    restart = (Path(__file__).parent / "data" / "cp2k-water-1.restart").read_text()
    (tmp_path / "water-1.restart").write_text(restart)  # at step 10
    recipe = recipe_named("cp2k")
    assert recipe is not None
    guard = FileGuard(
        capture_dir(m27_home / "checkpoints" / RUN / "md"), tmp_path, ["*-1.restart"],
        store=None, run_id=RUN, step="md", validate=recipe.valid_file,
        read_step=recipe.recorded_step,
    )  # fmt: skip
    guard.stop()  # captured at step 10
    store = open_store(m27_home)
    store.append(
        [
            ev.RunSubmitted(1.0, RUN, "qm", str(spec), ("md",)),
            ev.RunCrashed(1.2, RUN, "process 4242 died"),
        ]
    )
    store.close()
    assert main(["run", "--resume", RUN, "--dry-run"]) == 0
    assert _will(capsys.readouterr().out)["md"] == f"run, from run {RUN}'s checkpoint at step 10"
    newer = restart.replace("STEP_START_VAL  10", "STEP_START_VAL  12")
    (tmp_path / "water-1.restart").write_text(newer)
    captured = max(p.stat().st_mtime_ns for p in (m27_home / "checkpoints").rglob("*"))
    os.utime(tmp_path / "water-1.restart", ns=(captured + 10**9, captured + 10**9))
    assert main(["run", "--resume", RUN, "--dry-run"]) == 0
    assert _will(capsys.readouterr().out)["md"] == (
        f"run, from water-1.restart in the workdir at step 12 (complete, newer than run {RUN}'s "
        "checkpoint at step 10)"
    )
    (tmp_path / "water-1.restart").write_text(newer[: len(newer) // 2])  # torn: not used
    assert main(["run", "--resume", RUN, "--dry-run"]) == 0
    assert _will(capsys.readouterr().out)["md"] == f"run, from run {RUN}'s checkpoint at step 10"
