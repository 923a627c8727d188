"""`m27 checkpoints gc --done`: the checkpoints of steps that succeeded go (nothing
restores them: a resume skips such a step, `--rerun` starts it over); those a resume may
still need stay: a step that did not succeed, a run still running, a folder the event log
does not know."""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import numpy as np
import pytest

from m27 import events as ev
from m27 import liveness
from m27.checkpoint import Checkpointer
from m27.cli.main import main
from m27.store.sqlite import open_store
from m27.units import format_size

ENDED, LIVE = "20261205-100000-aaaa", "20261205-110000-bbbb"


def _save(home: Path, run_id: str, step: str) -> int:
    """Two checkpoints of a 64 KiB state in `step`'s folder of `run_id`; its bytes."""
    folder = home / "checkpoints" / run_id / step
    with Checkpointer(folder, keep_last=3) as ck:
        ck.save({"x": np.arange(16384, dtype=np.float32)}, step=1)
        ck.save({"x": np.arange(16384, dtype=np.float32) + 1}, step=2)
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.fixture
def node(m27_home: Path) -> dict[str, int]:
    """ENDED (failed): `md` succeeded, `em` failed; LIVE (its process is this one):
    `prep` succeeded; and a folder no run of the log has."""
    sizes = {
        "md": _save(m27_home, ENDED, "md"),
        "em": _save(m27_home, ENDED, "em"),
        "prep": _save(m27_home, LIVE, "prep"),
        "own": _save(m27_home, "not-a-run", "own"),
    }
    (m27_home / "checkpoints" / ENDED / "files-only").mkdir()  # a step that never started
    live = {"pid": os.getpid(), "host": socket.gethostname()}
    store = open_store(m27_home)
    store.append(
        [
            ev.RunSubmitted(1.0, ENDED, "p", "p.yaml", ("md", "em")),
            ev.StepSucceeded(1.1, ENDED, "md", 1, 0.1),
            ev.StepFailed(1.2, ENDED, "em", 1, 0.1, "exited with code 1", exit_code=1),
            ev.RunFailed(1.3, ENDED, 0.3, ("em",), "step em failed"),
            ev.RunSubmitted(2.0, LIVE, "p", "p.yaml", ("prep", "md"), **live,
                            pid_started=liveness.own_start_time()),
            ev.StepSucceeded(2.1, LIVE, "prep", 1, 0.1),
        ]
    )  # fmt: skip
    store.close()
    return sizes


def _left(home: Path) -> set[str]:
    root = home / "checkpoints"
    return {f"{p.parent.name}/{p.name}" for p in root.glob("*/*") if p.is_dir()}


ALL = {f"{ENDED}/md", f"{ENDED}/em", f"{ENDED}/files-only", f"{LIVE}/prep", "not-a-run/own"}


def test_only_the_checkpoints_of_succeeded_steps_of_ended_runs_go(
    node: dict[str, int], m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["checkpoints", "gc", "--done", "--dry-run"]) == 0
    assert _left(m27_home) == ALL  # a dry run deletes nothing
    said = capsys.readouterr().out
    assert f"would remove  {m27_home}/checkpoints/{ENDED}" in said
    assert main(["checkpoints", "gc", "--done"]) == 0
    assert _left(m27_home) == ALL - {f"{ENDED}/md"}
    size = node["md"]
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"removed  {m27_home}/checkpoints/{ENDED}  ")
    assert out[0].endswith(": 1 succeeded step (md)")
    assert out[1] == f"removed 1 step folder of 1 run: {format_size(size)} freed"
    assert out[2:] == [
        "kept 2 step folders of steps that have not succeeded (a resume restores them)",
        "kept 1 step folder of runs still running",
        "kept 1 step folder of runs the event log does not know",
    ]
    # restored from: em's checkpoints are whole, what a resume of ENDED reads
    assert main(["checkpoints", "verify", ENDED, "em"]) == 0


def test_json_names_each_folder_with_its_bytes_and_a_run_limits_it(
    node: dict[str, int], m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["checkpoints", "gc", "--done", LIVE, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "removed": [],
        "kept": {"not succeeded": 0, "running": 1, "not in the event log": 0},
    }
    assert main(["checkpoints", "gc", ENDED[:12], "--done", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == [
        {
            "run_id": ENDED,
            "step": "md",
            "path": str(m27_home / "checkpoints" / ENDED / "md"),
            "bytes": node["md"],
            "succeeded_in": ENDED,
        }
    ]


def test_a_step_that_succeeded_since_in_a_resume_of_its_run_is_done(
    node: dict[str, int], m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ENDED's `em` failed; a resume of a resume of ENDED ran it to the end (restored from
    its checkpoint there): nothing needs ENDED's `em` checkpoints any more."""
    first, second = "20261205-120000-cccc", "20261205-130000-dddd"
    store = open_store(m27_home)
    store.append(
        [
            ev.RunSubmitted(3.0, first, "p", "p.yaml", ("md", "em"), resume_of=ENDED),
            ev.StepFailed(3.1, first, "em", 1, 0.1, "exited with code 1", exit_code=1),
            ev.RunFailed(3.2, first, 0.2, ("em",), "step em failed"),
        ]
    )
    store.close()
    assert main(["checkpoints", "gc", "--done", ENDED, "--json"]) == 0
    assert [r["step"] for r in json.loads(capsys.readouterr().out)["removed"]] == ["md"]
    store = open_store(m27_home)
    store.append(
        [
            ev.RunSubmitted(4.0, second, "p", "p.yaml", ("md", "em"), resume_of=first),
            ev.StepSucceeded(4.1, second, "em", 1, 0.1),
            ev.RunSucceeded(4.2, second, 0.2),
        ]
    )
    store.close()
    assert main(["checkpoints", "gc", "--done", ENDED]) == 0
    assert (
        capsys.readouterr().out.splitlines()[0].endswith(f": 1 succeeded step (em in run {second})")
    )
    assert _left(m27_home) == ALL - {f"{ENDED}/md", f"{ENDED}/em"}


def test_a_folder_that_cannot_be_removed_is_said_and_not_counted_as_freed(
    node: dict[str, int],
    m27_home: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(path: Path) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(shutil, "rmtree", refuse)
    assert main(["checkpoints", "gc", "--done"]) == 1
    out, err = capsys.readouterr()
    assert "removed 0 step folders of 0 runs: 0B freed" in out
    assert err == (
        f"m27 checkpoints: could not remove {m27_home}/checkpoints/{ENDED}/md: Permission denied\n"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["checkpoints", "verify", "--done"],
        ["checkpoints", "gc", "--done", "--keep", "2"],
        ["checkpoints", "gc", "--dry-run", ENDED],
        ["checkpoints", "gc", "--done", ENDED, "md"],
        # without `gc` (a listing with a stray option) it deleted every finished step's
        ["checkpoints", "--done", ENDED],
        ["checkpoints", "--done"],
        ["checkpoints", ENDED, "--done"],
    ],
    ids=["verify", "keep", "dry-run-alone", "a-step", "no-gc", "no-gc-no-run", "no-gc-run-first"],
)
def test_done_goes_with_gc_alone(
    node: dict[str, int], m27_home: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "m27 checkpoints: --done and --dry-run go with gc alone: m27 checkpoints gc --done "
        "[--dry-run] [RUN]\n"
    )
    assert _left(m27_home) == ALL


@pytest.mark.parametrize("action", [[], ["verify"]], ids=["list", "verify"])
def test_keep_goes_with_gc_alone(
    node: dict[str, int], m27_home: Path, capsys: pytest.CaptureFixture[str], action: list[str]
) -> None:
    # a listing with --keep 2 said nothing of it, as if the checkpoints had been kept to 2
    assert main(["checkpoints", *action, ENDED, "em", "--keep", "2"]) == 2
    assert capsys.readouterr().err == (
        f"m27 checkpoints: --keep goes with gc: m27 checkpoints gc {ENDED} em --keep 2\n"
    )
    assert _left(m27_home) == ALL


def test_a_file_where_the_checkpoints_folder_should_be_is_named(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (m27_home / "checkpoints").write_text("not a folder")
    assert main(["checkpoints", "last"]) == 2
    assert capsys.readouterr().err == (
        f"m27 checkpoints: {m27_home}/checkpoints is not a folder: m27 keeps every run's "
        "checkpoints in it; move it aside\n"
    )


def test_a_file_where_a_steps_checkpoint_folder_should_be_is_named(
    node: dict[str, int], m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both said `no checkpoints` (for the step: `run R has no checkpoints for step 'em'`),
    as if the step had never saved one."""
    step_dir = m27_home / "checkpoints" / ENDED / "em"
    shutil.rmtree(step_dir)
    step_dir.write_text("not a folder")
    assert main(["checkpoints", ENDED, "em"]) == 2
    why = f"{step_dir} is not a folder: m27 keeps step em's checkpoints in it; move it aside"
    assert capsys.readouterr().err == f"m27 checkpoints: {why}\n"
    assert main(["checkpoints", "--json", ENDED]) == 0
    out, err = capsys.readouterr()
    assert err == f"m27 checkpoints: {why}\n"
    assert {r["step"] for r in json.loads(out)} == {"md"}  # the other step still listed


def test_options_may_come_before_the_run(
    node: dict[str, int], m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gc --keep 1 RUN STEP` failed `unrecognized arguments: RUN STEP`: argparse took
    `gc` as every positional there was."""
    assert main(["checkpoints", "gc", "--keep", "1", ENDED, "em"]) == 0
    assert len(list((m27_home / "checkpoints" / ENDED / "em").glob("ckpt-*.json"))) == 1
    capsys.readouterr()
    assert main(["checkpoints", "--json", ENDED, "em"]) == 0
    assert [r["seq"] for r in json.loads(capsys.readouterr().out)] == [2]
