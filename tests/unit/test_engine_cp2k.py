"""The CP2K recipe: which commands it takes, when a restart file is whole, which step it
holds, how many steps the input asks for, what a resume runs, and what it cuts.

`data/cp2k-water-1.restart` is a restart file CP2K 2023.1 (Debian) wrote at step 10 of
`examples/cp2k/water.inp` run with 30 steps (`STEP_START_VAL 10`, `STEPS 30`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from m27.cli.commands import validate
from m27.executors.engines import error_said, plan_checkpoint
from m27.executors.engines.cp2k import (
    RESUME_INPUT,
    Cp2k,
    incomplete,
    input_steps,
    trim_outputs,
    with_steps,
)
from tests.commands import cli

DATA = Path(__file__).parent / "data"
RESTART = (DATA / "cp2k-water-1.restart").read_text()
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cp2k"


def test_a_cp2k_run_gets_the_recipe_and_its_input_as_the_last_option() -> None:
    plan = plan_checkpoint(("mpirun", "-np", "2", "cp2k.psmp", "in.inp", "-o", "x.out"), 60.0)
    assert plan.recipe == "cp2k"
    # a bare input becomes `-i in.inp`, so the `-i m27-resume.inp` a resume appends wins
    assert plan.argv == ("mpirun", "-np", "2", "cp2k.psmp", "-i", "in.inp", "-o", "x.out")
    assert plan.files == ("*-1.restart",)
    assert plan.resume == ("-i", RESUME_INPUT)
    for check in (("cp2k", "--check", "in.inp"), ("cp2k", "-e", "in.inp"), ("cp2k", "-v")):
        assert plan_checkpoint(check, 60.0).recipe is None, check
    assert plan_checkpoint(("cp2k", "-c", "-r", "in.inp"), 60.0).recipe == "cp2k"
    # `-o out` is a value, not the input
    assert plan_checkpoint(("cp2k", "-o", "x.out"), 60.0).argv == ("cp2k", "-o", "x.out")


def test_a_whole_restart_file_is_complete_and_a_torn_or_foreign_one_is_not() -> None:
    assert incomplete(RESTART) is None
    for cut in (len(RESTART) // 3, len(RESTART) - 20):
        assert "incomplete CP2K restart file" in str(incomplete(RESTART[:cut]))
    assert "not a CP2K restart file" in str(incomplete("&GLOBAL\n&END GLOBAL\n"))


def test_the_step_is_the_restart_files_step_start_val(tmp_path: Path) -> None:
    assert Cp2k().recorded_step("water-1.restart", RESTART.encode()) == 10
    assert Cp2k().recorded_step("x", b"no counters here") is None
    (tmp_path / "torn.restart").write_text(RESTART[:500])
    assert Cp2k().valid_file(tmp_path / "torn.restart") is not None
    assert Cp2k().valid_file(tmp_path / "missing") is not None


def test_the_inputs_steps_are_read_with_its_variables_and_includes(tmp_path: Path) -> None:
    (tmp_path / "md.inc").write_text("&MD\n  STEPS ${N}  ! from @SET\n&END MD\n")
    (tmp_path / "a.inp").write_text(
        "@SET N 500\n&GLOBAL\n&END GLOBAL\n&MOTION\n  @INCLUDE 'md.inc'\n&END MOTION\n"
    )
    assert input_steps(("cp2k", "-i", "a.inp"), tmp_path) == 500
    (tmp_path / "b.inp").write_text("&MOTION\n  &MD\n    steps $N\n  &END\n&END MOTION\n")
    assert input_steps(("cp2k", "b.inp", "--set", "N=70"), tmp_path) == 70
    assert input_steps(("cp2k", "b.inp"), tmp_path) is None  # no value: not claimed
    # STEPS outside &MOTION &MD is another thing (a geometry optimisation's, say)
    (tmp_path / "c.inp").write_text("&MOTION\n  &GEO_OPT\n    STEPS 9\n  &END\n&END\n")
    assert input_steps(("cp2k", "c.inp"), tmp_path) is None
    (tmp_path / "d.inp").write_text("@IF 1\n&MOTION\n&MD\nSTEPS 3\n&END\n&END\n@ENDIF\n")
    assert input_steps(("cp2k", "d.inp"), tmp_path) is None  # which branch: CP2K's to say
    assert input_steps(("cp2k", "gone.inp"), tmp_path) is None
    example = ("cp2k", "-i", "water.inp", "-o", "water.out", "-E", "STEPS=200")
    assert input_steps(example, EXAMPLE) == 200


def test_with_steps_sets_only_the_md_steps() -> None:
    changed = with_steps(RESTART, 20)
    diff = [
        (a, b) for a, b in zip(RESTART.splitlines(), changed.splitlines(), strict=True) if a != b
    ]
    assert diff == [("     STEPS  30", "     STEPS  20")]


def test_a_resume_runs_the_restored_file_for_the_steps_left(tmp_path: Path) -> None:
    (tmp_path / "in.inp").write_text("&MOTION\n &MD\n  STEPS 30\n &END MD\n&END MOTION\n")
    (tmp_path / "water-1.restart").write_text(RESTART)
    said: list[str] = []
    argv = ("cp2k", "-i", "in.inp")
    assert Cp2k().resume_args(argv, tmp_path, ("-i", RESUME_INPUT), said.append) == (
        "-i",
        RESUME_INPUT,
    )
    resume = (tmp_path / RESUME_INPUT).read_text()
    assert "     STEPS  20\n" in resume and "STEP_START_VAL  10" in resume
    assert said == ["water-1.restart is at step 10 of 30: m27-resume.inp runs 20 more"]
    # an input it cannot read: the restart file as it is, and said
    said.clear()
    Cp2k().resume_args(("cp2k", "-i", "gone.inp"), tmp_path, ("-i", RESUME_INPUT), said.append)
    assert (tmp_path / RESUME_INPUT).read_text() == RESTART
    assert "could not read how many MD steps the input asks for" in said[0]
    # not molecular dynamics: run as CP2K wrote it
    said.clear()
    geo = RESTART.replace("     STEPS  30\n", "")
    (tmp_path / "water-1.restart").write_text(geo)
    Cp2k().resume_args(argv, tmp_path, ("-i", RESUME_INPUT), said.append)
    assert (tmp_path / RESUME_INPUT).read_text() == geo
    assert said[0] == "water-1.restart holds no &MD STEPS: CP2K goes on from it as it wrote it"
    # a step's own `resume:` wins
    assert Cp2k().resume_args(argv, tmp_path, ("-x",), said.append) == ("-x",)


def test_an_md_run_that_exited_0_short_of_its_steps_is_unfinished(tmp_path: Path) -> None:
    """CP2K at its WALLTIME writes its restart file and exits 0 (measured: step 30 of
    200); at its end the restart file's STEP_START_VAL is STEPS."""
    md = "&GLOBAL\n RUN_TYPE MD\n&END GLOBAL\n&MOTION\n &MD\n  STEPS {n}\n &END MD\n&END MOTION\n"
    (tmp_path / "in.inp").write_text(md.format(n=30))
    (tmp_path / "water-1.restart").write_text(RESTART)  # at step 10
    argv = ("cp2k", "-i", "in.inp")
    assert Cp2k().unfinished(argv, tmp_path) == (
        "CP2K stopped after MD step 10 of 30 (its restart file is at step 10), before its "
        "last: its &GLOBAL WALLTIME, or a file named EXIT in its folder"
    )
    header = "#     Step Nr.          Time[fs]        Kin.[a.u.]\n"
    rows = "".join(f"{n:10d}   {n * 0.5:.6f}   0.0014\n" for n in range(14))
    (tmp_path / "water-1.ener").write_text(header + rows)  # 3 steps past its last restart
    assert Cp2k().unfinished(argv, tmp_path) == (
        "CP2K stopped after MD step 13 of 30 (its restart file is at step 10), before its "
        "last: its &GLOBAL WALLTIME, or a file named EXIT in its folder"
    )
    (tmp_path / "water-1.restart").unlink()  # stopped before its first restart file
    assert Cp2k().unfinished(argv, tmp_path) == (
        "CP2K stopped after MD step 13 of 30 (no restart file), before its last: its "
        "&GLOBAL WALLTIME, or a file named EXIT in its folder"
    )
    (tmp_path / "water-1.ener").unlink()
    (tmp_path / "water-1.restart").write_text(RESTART)
    (tmp_path / "in.inp").write_text(md.format(n=10))
    assert Cp2k().unfinished(argv, tmp_path) is None  # it got there
    (tmp_path / "in.inp").write_text(
        md.format(n=30).replace("MD\n&END GLOBAL", "GEO_OPT\n&END GLOBAL")
    )
    assert Cp2k().unfinished(argv, tmp_path) is None  # not MD: its steps mean something else
    (tmp_path / "in.inp").write_text(md.format(n=30))
    (tmp_path / "water-1.restart").unlink()
    assert Cp2k().unfinished(argv, tmp_path) is None  # nothing to say it by (no files)


def test_a_resume_cuts_what_the_killed_attempt_wrote_after_the_capture(tmp_path: Path) -> None:
    ener = "#     Step Nr.   Time[fs]  Kin.[a.u.]\n" + "".join(
        f"{s:>10}  {s * 0.5:10.3f}  0.00{s}\n" for s in range(13)
    )
    (tmp_path / "water-1.ener").write_text(ener)
    frames = "".join(
        f"       3\n i = {s:>8}, time = {s * 0.5:8.3f}, E = -17.2\n"
        + "  O 0 0 0\n  H 0.7 0.5 0\n  H -0.7 0.5 0\n"
        for s in range(13)
    )
    (tmp_path / "water-pos-1.xyz").write_text(frames)
    (tmp_path / "water-1.restart.bak-1").write_text("left alone")
    (tmp_path / "other-1.ener").write_text("    11  5.5\n")  # another project's
    assert trim_outputs(tmp_path, "water", 10) == ["water-1.ener", "water-pos-1.xyz"]
    kept = (tmp_path / "water-1.ener").read_text().splitlines()
    assert [int(x.split()[0]) for x in kept[1:]] == list(range(11))
    xyz = (tmp_path / "water-pos-1.xyz").read_text()
    assert xyz.count("i = ") == 11 and xyz.endswith("  H -0.7 0.5 0\n")
    assert " i =       10," in xyz and " i =       11," not in xyz
    assert (tmp_path / "other-1.ener").read_text() == "    11  5.5\n"
    assert trim_outputs(tmp_path, "water", 10) == []  # nothing past step 10 any more


def test_cp2ks_abort_box_is_the_failures_reason() -> None:
    box = [
        " *******************************************************************************",
        " *   ___                                                                       *",
        " *  /   \\                                                                      *",
        " * [ABORT]                                                                     *",
        " *  \\___/   The specified OLD file <nothere.inp> cannot be opened. It does not *",
        " *    |                 exist. Data directory path: /usr/share/cp2k            *",
        " *  O/|                                                                        *",
        " * /| |                                                                        *",
        " * / \\                                                  common/cp_files.F:143 *",
        " *******************************************************************************",
        "MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD",
    ]
    assert error_said(box) == (
        "The specified OLD file <nothere.inp> cannot be opened. It does not exist. "
        "Data directory path: /usr/share/cp2k"
    )


def test_validate_says_cp2k_saves_nothing_at_a_stop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "pipeline:\n"
        "  - {name: a, type: cpu, checkpoint: 1h, timeout: 30m, command: cp2k -i in.inp}\n"
    )
    assert cli(validate, ["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "a: checkpoint every 1h00m (cp2k recipe)" in out
    assert "signal: SIGTERM ends it at a stop (a cancel, timeout or preemption); cp2k " in out
    assert "warning: a: timeout: 30m00s stops each attempt before its first checkpoint" in out


def test_validate_warns_of_an_input_that_writes_no_restart_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "sp.inp").write_text("&GLOBAL\n  PROJECT sp\n  RUN_TYPE ENERGY\n&END GLOBAL\n")
    (tmp_path / "default.inp").write_text("&GLOBAL\n  PROJECT sp\n&END GLOBAL\n")
    (tmp_path / "off.inp").write_text(
        "&GLOBAL\n RUN_TYPE md\n&END\n&MOTION\n &PRINT\n  &RESTART off\n  &END\n &END\n&END\n"
    )
    (tmp_path / "branch.inp").write_text("@IF 1\n&GLOBAL\n RUN_TYPE ENERGY\n&END\n@ENDIF\n")
    path = tmp_path / "p.yaml"
    path.write_text(
        "pipeline:\n"
        "  - {name: sp, type: cpu, checkpoint: 1m, command: cp2k -i sp.inp}\n"
        "  - {name: default, type: cpu, checkpoint: 1m, command: cp2k default.inp}\n"
        "  - {name: off, type: cpu, checkpoint: 1m, command: cp2k -i off.inp}\n"
        "  - {name: branch, type: cpu, checkpoint: 1m, command: cp2k -i branch.inp}\n"
        f"  - {{name: water, type: cpu, checkpoint: 1m, command: cp2k -i {EXAMPLE}/water.inp}}\n"
    )
    assert cli(validate, ["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        "warning: sp: checkpoint: has no effect: sp.inp is a single-point calculation "
        "(RUN_TYPE ENERGY), which writes no restart file to resume from"
    ) in out
    assert "warning: default: checkpoint: has no effect: default.inp is a single-point" in out
    assert "warning: off: checkpoint: has no effect: off.inp turns the restart file off" in out
    for fine in ("branch", "water"):  # an @IF: not claimed; the example: MD, restart on
        assert f"warning: {fine}:" not in out


def test_a_requeued_slurm_job_resumes_through_the_recipe(tmp_path: Path) -> None:
    """Under Slurm a requeued job restarts on a compute node, where no m27 process wrote
    `m27-resume.inp`: the batch script asks the recipe there, from the restart file CP2K
    wrote before the time limit."""
    import os
    import subprocess
    import sys

    from m27.executors.slurm._script import ScriptInput, parse_options, render_script

    (tmp_path / "in.inp").write_text("&MOTION\n &MD\n  STEPS 30\n &END MD\n&END MOTION\n")
    (tmp_path / "water-1.restart").write_text(RESTART)
    fake = tmp_path / "bin" / "cp2k"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > args.txt\n')
    fake.chmod(0o755)
    plan = plan_checkpoint(("cp2k", "in.inp"), 60.0)
    script = tmp_path / "job.sh"
    script.write_text(
        render_script(
            ScriptInput(
                run_id="r1", step="aimd", attempt=1, argv=plan.argv, job_dir=tmp_path,
                workdir=tmp_path, python=sys.executable, options=parse_options({}, site={}),
                resume_args=plan.resume, recipe="cp2k", child_signal=plan.signal,
            )
        )
    )  # fmt: skip
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}

    def start(restarts: int) -> list[str]:
        done = subprocess.run(
            ["bash", str(script)],
            cwd=tmp_path,
            env={**env, "SLURM_RESTART_COUNT": str(restarts)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        said.append(done.stderr)
        return (tmp_path / "args.txt").read_text().split()

    said: list[str] = []

    assert start(0) == ["-i", "in.inp"]  # the first start: the input
    assert not (tmp_path / RESUME_INPUT).exists()
    assert start(1) == ["-i", "in.inp", "-i", RESUME_INPUT]
    assert "     STEPS  20\n" in (tmp_path / RESUME_INPUT).read_text()
    assert "m27: water-1.restart is at step 10 of 30: m27-resume.inp runs 20 more" in said[-1]
