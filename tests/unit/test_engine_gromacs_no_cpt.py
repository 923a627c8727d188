"""mdrun options under which mdrun writes no `<deffnm>.cpt`, though `m27 validate` said it
would and m27 watched for it (measured, GROMACS 2022): `-rerun traj.xtc` recomputes a
trajectory's frames and writes no checkpoint whatever its `-cpt`; `-cpnum` writes
`<deffnm>_stepN.cpt` files instead, so nothing was captured and a resume started over."""

from __future__ import annotations

from pathlib import Path

import pytest

from m27.cli.commands import validate
from m27.executors.engines import plan_checkpoint
from tests.commands import cli

RERUN = ("gmx", "mdrun", "-s", "md.tpr", "-rerun", "md.xtc", "-deffnm", "rerun")


def test_a_rerun_is_planned_without_a_checkpoint_file() -> None:
    plan = plan_checkpoint(RERUN, 60.0)
    assert plan.recipe == "gromacs"
    assert plan.argv == RERUN  # no -cpt added
    assert plan.files == () and plan.resume == ()
    assert plan.notes == (
        "-rerun: mdrun writes no checkpoint when it recomputes a trajectory's frames",
    )
    # an MD run of the same file is planned as ever
    assert plan_checkpoint(RERUN[:4] + RERUN[6:], 60.0).files == ("rerun.cpt",)


def test_validate_says_checkpoint_has_no_effect_on_a_rerun(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        f"pipeline:\n  - {{name: rerun, type: gpu, checkpoint: 1m, command: {' '.join(RERUN)}}}\n"
    )
    assert cli(validate, ["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        "warning: rerun: checkpoint: has no effect: `mdrun -rerun` writes no checkpoint when "
        "it recomputes a trajectory's frames, so a resume reruns the trajectory from its "
        "first frame"
    ) in out
    assert "-cpt" not in out and "no recipe knows" not in out


def test_validate_says_cpnum_leaves_nothing_to_capture(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "pipeline:\n  - {name: md, type: gpu, checkpoint: 1m, command: gmx mdrun -deffnm cn -cpnum}\n"
    )
    assert cli(validate, ["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "-cpt 1: mdrun writes cn_stepN.cpt every 1 min" in out
    assert (
        "warning: md: checkpoint: captures nothing: with -cpnum mdrun writes cn_stepN.cpt files "
        "and never cn.cpt (measured), so there is nothing to capture or resume from; remove "
        "-cpnum (m27 keeps its recent captures: `m27 checkpoints`)"
    ) in out
