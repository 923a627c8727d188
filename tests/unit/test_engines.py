"""`checkpoint:` for programs that checkpoint themselves: the field, the recipes, validate."""

from __future__ import annotations

import argparse
import os
import struct
from pathlib import Path

import pytest

from m27.cli.commands import validate
from m27.executors.engines import plan_checkpoint, saves_at_stop, uses_checkpointer
from m27.executors.engines.gromacs import Gromacs, cpt_step, parse_outputs
from m27.executors.engines.lammps import Lammps, restart_step
from m27.spec import SpecError, parse_pipeline
from tests.seed import SEED
from tests.unit.engine_files import (
    GMX_2022_HEAD,
    LAMMPS_2021_HEAD,
    LAMMPS_MAGIC,
    cpt_header,
    lammps_restart,
)


def _validate(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    parser = argparse.ArgumentParser(prog="m27")
    validate.register(parser.add_subparsers())
    sets = ["--set", "INPUT_FILE=x.pdb"] if "{{INPUT_FILE}}" in path.read_text() else []
    args = parser.parse_args(["validate", str(path), *sets])  # an unused --set is an error
    assert args.func(args) == 0
    return capsys.readouterr().out


def test_validate_explains_the_seed_checkpoint_as_cpt_and_cpi(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "seed.yaml"
    path.write_text(SEED)
    out = _validate(path, capsys)
    assert "md_simulation: checkpoint every 5m00s (gromacs recipe)" in out
    assert "command: gmx mdrun -cpt 5 -deffnm simulation -v" in out
    assert "resume: -cpi simulation.cpt" in out
    assert "files: simulation.cpt" in out
    assert "signal: SIGTERM" in out
    assert "warning" not in out


def test_validate_warns_when_checkpoint_can_mean_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "uses.py").write_text("from m27 import Checkpointer\n")
    (tmp_path / "plain.py").write_text("print('hi')\n")
    path = tmp_path / "p.yaml"
    path.write_text(
        "pipeline:\n"
        "  - {name: a, type: cpu, checkpoint: 10s, command: python plain.py}\n"
        "  - {name: b, type: cpu, checkpoint: 10s, command: python uses.py}\n"
        "  - {name: c, type: cpu, checkpoint: {every: 1m, files: [out/*.chk]}, command: prog}\n"
    )
    out = _validate(path, capsys)
    assert "warning: a: checkpoint: has no effect" in out
    assert "warning: b:" not in out and "warning: c:" not in out
    assert "files: out/*.chk" in out


def test_files_without_an_interval_are_said_to_be_captured_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "pipeline:\n  - {name: a, type: cpu, checkpoint: {files: ['*.chk']}, command: prog}\n"
    )
    out = _validate(path, capsys)
    # was "checkpoint every no interval (no recipe)"
    assert "a: checkpoint when the program writes its files (no recipe)" in out
    assert "files: *.chk (captured into the checkpoint store when they change" in out


def test_validate_warns_when_a_timeout_comes_before_the_first_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`timeout: 30m` with `checkpoint: 1h`: each attempt was stopped before it saved, so
    every retry started over, and nothing said so."""
    (tmp_path / "uses.py").write_text("from m27 import Checkpointer\n")
    (tmp_path / "stops.py").write_text("import m27\nm27.Checkpointer(); m27.watch_stop()\n")
    path = tmp_path / "p.yaml"
    path.write_text(
        "pipeline:\n"
        "  - {name: a, type: cpu, checkpoint: 1h, timeout: 30m, retries: 3, command: python uses.py}\n"
        "  - {name: b, type: cpu, checkpoint: 1h, timeout: 30m, command: python stops.py}\n"
        "  - {name: c, type: cpu, checkpoint: 10m, timeout: 30m, command: python uses.py}\n"
        "  - {name: d, type: cpu, checkpoint: 1h, timeout: 1h, command: gmx mdrun}\n"
    )
    out = _validate(path, capsys)
    assert (
        "warning: a: timeout: 30m00s stops each attempt before its first checkpoint (every "
        "1h00m), and it does not save at the stop: every attempt starts over\n"
    ) in out
    for fine in "bcd":  # saves at the stop, saves before the timeout, mdrun saves on TERM
        assert f"warning: {fine}:" not in out


def test_validate_says_whether_a_python_step_saves_at_a_stop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("M27_CHECKPOINT_GRACE", "90s")
    (tmp_path / "periodic.py").write_text("import m27\nck = m27.Checkpointer()\n")
    (tmp_path / "stops.py").write_text(
        "import m27\nck = m27.Checkpointer()\nstop = m27.watch_stop()\n"
    )
    path = tmp_path / "p.yaml"
    path.write_text(
        "pipeline:\n"
        "  - {name: a, type: cpu, checkpoint: 10s, command: python periodic.py}\n"
        "  - {name: b, type: cpu, checkpoint: 10s, command: python stops.py}\n"
    )
    out = _validate(path, capsys).split("b: checkpoint every")
    assert "stop: SIGTERM (a cancel, timeout or preemption) ends it unsaved" in out[0]
    assert "it calls m27.watch_stop, so it can save at SIGTERM" in out[1]
    assert "SIGKILL 1m30s later" in out[1]


def test_stop_heuristic_reads_python_c_scripts_and_modules(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text("from m27.executors.slurm import watch_preemption\n")
    assert saves_at_stop(["python", "-m", "pkg.train"], tmp_path)
    assert saves_at_stop(["python", "-c", "import m27; m27.watch_stop()"], tmp_path)
    assert not saves_at_stop(["python", "-c", "import m27; m27.Checkpointer()"], tmp_path)
    assert not saves_at_stop(["python", "missing.py"], tmp_path)


def test_checkpoint_mapping_is_read_with_its_fields() -> None:
    p = parse_pipeline(
        "pipeline:\n"
        "  - name: md\n"
        "    type: cpu\n"
        "    command: prog --go\n"
        "    checkpoint:\n"
        "      every: 5m\n"
        "      files: [state.chk, 'restart/*.bin']\n"
        "      resume: --restart state.chk\n"
        "      signal: SIGUSR1\n",
        "p.yaml",
    )
    step = p.steps[0]
    assert step.checkpoint == 300.0
    assert step.checkpoint_files == ("state.chk", "restart/*.bin")
    assert step.checkpoint_resume == ("--restart", "state.chk")
    assert step.checkpoint_signal == "USR1"


def test_bad_checkpoint_fields_point_at_line_and_column() -> None:
    with pytest.raises(SpecError) as err:
        parse_pipeline(
            "pipeline:\n"
            "  - name: md\n"
            "    type: cpu\n"
            "    command: prog\n"
            "    checkpoint:\n"
            "      every: soon\n"
            "      files: [/abs/x.cpt, ../up.cpt]\n"
            "      signal: HUP\n"
            "      resumes: [-x]\n",
            "p.yaml",
        )
    text = str(err.value)
    assert "p.yaml:6:14: pipeline[0].checkpoint.every:" in text
    assert "p.yaml:7:15: pipeline[0].checkpoint.files[0]: '/abs/x.cpt' must be relative" in text
    assert "pipeline[0].checkpoint.files[1]: '../up.cpt' must stay inside" in text
    assert "p.yaml:8:15: pipeline[0].checkpoint.signal: unknown signal 'HUP'" in text
    assert "p.yaml:9:7: pipeline[0].checkpoint.resumes: unknown key 'resumes'" in text


def test_gromacs_recipe_minutes_deffnm_cpo_and_user_options() -> None:
    p = plan_checkpoint(["gmx", "mdrun", "-deffnm", "sim"], 3.0)
    assert p.argv == ("gmx", "mdrun", "-cpt", "0.05", "-deffnm", "sim")
    assert (p.files, p.resume, p.signal) == (("sim.cpt",), ("-cpi", "sim.cpt"), "TERM")
    assert plan_checkpoint(["gmx", "mdrun"], 90.0).files == ("state.cpt",)
    cpo = plan_checkpoint(["mpirun", "-np", "2", "gmx_mpi", "mdrun", "-cpo", "a.cpt"], 60.0)
    assert cpo.argv[:7] == ("mpirun", "-np", "2", "gmx_mpi", "mdrun", "-cpt", "1")
    assert cpo.resume == ("-cpi", "a.cpt")
    kept = plan_checkpoint(["gmx", "mdrun", "-cpt", "2", "-deffnm", "s"], 300.0)
    assert kept.argv == ("gmx", "mdrun", "-cpt", "2", "-deffnm", "s")
    explicit = plan_checkpoint(["gmx", "mdrun"], 60.0, files=["x.cpt"], resume=["-cpi", "x.cpt"])
    assert (explicit.files, explicit.resume) == (("x.cpt",), ("-cpi", "x.cpt"))
    assert plan_checkpoint(["gmx", "grompp"], 60.0).recipe is None
    assert plan_checkpoint(["gmx", "-quiet", "grompp"], 60.0).recipe is None
    # gmx's own flags before mdrun: it was not taken for mdrun (no -cpt, no capture)
    quiet = plan_checkpoint(["gmx", "-quiet", "mdrun", "-deffnm", "s"], 60.0)
    assert quiet.argv == ("gmx", "-quiet", "mdrun", "-cpt", "1", "-deffnm", "s")
    assert quiet.files == ("s.cpt",)
    assert plan_checkpoint(["/bin/sh", "-c", "gmx mdrun"], 60.0, shell=True).recipe is None


@pytest.mark.parametrize(
    ("cpt", "every", "note"),
    [
        ("5", 300.0, "kept, mdrun writes s.cpt every 5 min"),
        ("0.166667", 10.0, "kept, mdrun writes s.cpt every 0.166667 min"),
        ("60", 300.0, "kept, mdrun writes s.cpt every 60 min, not every 5m00s as checkpoint: says"),
        ("60", None, "kept, mdrun writes s.cpt every 60 min"),
        (
            "-1",
            300.0,
            "mdrun writes no s.cpt while it runs, so a crash loses the run; "
            "remove it and m27 sets -cpt 5",
        ),
        ("inf", None, "mdrun writes no s.cpt while it runs, so a crash loses the run"),
        ("0", 300.0, "mdrun writes s.cpt at every step it can, which slows a large system"),
        ("x", 300.0, "not a number of minutes, so mdrun stops at once with an error"),
    ],
)
def test_the_commands_own_cpt_is_kept_and_said_for_what_mdrun_does_with_it(
    cpt: str, every: float | None, note: str
) -> None:
    """`-cpt -1` (mdrun then writes no checkpoint) and `-cpt 60` beside `checkpoint: 300s`
    were both noted as just "kept": the step's declared interval promised what mdrun would
    not do. (GROMACS's CheckpointHandler handles nothing when the period is negative.)"""
    plan = plan_checkpoint(["gmx", "mdrun", "-deffnm", "s", "-cpt", cpt], every)
    assert plan.argv == ("gmx", "mdrun", "-deffnm", "s", "-cpt", cpt)
    assert f"-cpt {cpt} is in the command: {note}" in plan.notes


def test_lammps_recipe_uses_var_convention() -> None:
    p = plan_checkpoint(["lmp_serial", "-in", "in.md"], 600.0)
    assert p.recipe == "lammps"
    assert p.argv == ("lmp_serial", "-var", "m27_restart", "m27.restart", "-var", "m27_every_s",
                      "600", "-in", "in.md")  # fmt: skip
    assert (p.files, p.resume) == (("m27.restart",), ("-var", "m27_resume", "1"))


MELT = Path(__file__).resolve().parents[2] / "examples" / "lammps" / "melt.in"


def test_a_lammps_script_without_the_restart_convention_is_warned_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`lmp -in plain.in` with `checkpoint: 60s` validated OK and never checkpointed: the
    `-var m27_restart` reached a script that never wrote it."""
    (tmp_path / "plain.in").write_text(
        'units lj\n# run 10 every 1 "write_restart ${m27_restart}"\nrun 1000\n'
    )
    (tmp_path / "half.in").write_text('run 1000 every 10 "write_restart ${m27_restart}" # resume\n')
    (tmp_path / "inc.in").write_text("units lj\ninclude conv.in\n")
    (tmp_path / "conv.in").write_text(MELT.read_text())
    path = tmp_path / "p.yaml"
    path.write_text(
        "pipeline:\n"
        "  - {name: a, type: cpu, checkpoint: 60s, command: lmp -in plain.in}\n"
        "  - {name: b, type: cpu, checkpoint: 60s, command: lmp -i half.in}\n"
        f"  - {{name: c, type: cpu, checkpoint: 60s, command: lmp -in {MELT}}}\n"
        "  - {name: d, type: cpu, checkpoint: 60s, command: lmp -in inc.in}\n"
        "  - {name: e, type: cpu, checkpoint: 60s, command: lmp -in written-by-a-step.in}\n"
        "  - {name: f, type: cpu, checkpoint: {every: 60s, files: [x.rst]}, command: lmp -in plain.in}\n"
    )
    out = _validate(path, capsys)
    assert (
        "warning: a: checkpoint: has no effect: plain.in never uses ${m27_restart}; it must run "
        '`run N upto every M "write_restart ${m27_restart}"` for m27 to capture anything '
        "(docs/engines.md, LAMMPS)\n"
    ) in out
    assert (
        "warning: b: half.in never reads ${m27_resume}: a resume starts the run over; it must "
        '`if "${m27_resume} == 1" then "read_restart ${m27_restart}"` (docs/engines.md, LAMMPS)\n'
    ) in out
    for quiet in "cdef":  # follows it, includes it, cannot be read yet, names its own files
        assert f"warning: {quiet}:" not in out


def test_a_lammps_include_that_cannot_be_read_claims_nothing(tmp_path: Path) -> None:
    (tmp_path / "vars.in").write_text("units lj\ninclude ${setup}.in\n")
    assert Lammps().warnings(("lmp", "-in", "vars.in"), tmp_path) == ()
    (tmp_path / "loop.in").write_text("include loop.in\n")  # includes itself: bounded
    assert Lammps().warnings(("lmp", "-in", "loop.in"), tmp_path) == ()
    assert Lammps().warnings(("lmp", "-in", str(tmp_path)), tmp_path) == ()  # a folder


def test_the_timestep_is_read_from_a_real_lammps_restart_header() -> None:
    assert restart_step(LAMMPS_2021_HEAD) == 20_000
    assert Lammps().recorded_step("m27.restart", LAMMPS_2021_HEAD) == 20_000


@pytest.mark.parametrize("order", ["<", ">"])
def test_the_timestep_of_a_restart_file_of_either_byte_order_is_found(order: str) -> None:
    assert restart_step(lammps_restart(3 * 10**10, order=order)) == 3 * 10**10  # a bigint


def test_a_file_that_is_no_lammps_restart_file_has_no_timestep() -> None:
    assert restart_step(b"") is None
    assert restart_step(LAMMPS_2021_HEAD[:90]) is None  # cut before the step
    assert restart_step(GMX_2022_HEAD) is None
    assert restart_step(LAMMPS_MAGIC + struct.pack("<2i", 7, 2) + bytes(64)) is None  # endian?
    odd = LAMMPS_MAGIC + struct.pack("<3i", 1, 2, 99) + bytes(64)  # an unknown header entry
    assert restart_step(odd) is None


def test_lammps_restart_validity_needs_the_closing_magic_string(tmp_path: Path) -> None:
    """write_restart rewrites the file in place: a copy taken mid-write starts right and
    stops short; since format revision 1 a whole file ends with the magic string."""
    whole = tmp_path / "m27.restart"
    data = lammps_restart(4000)
    whole.write_bytes(data)
    assert Lammps().valid_file(whole) is None
    whole.write_bytes(data[: len(data) // 2])
    assert "incomplete" in (Lammps().valid_file(whole) or "")
    whole.write_bytes(b"not lammps" * 10)
    assert "bad magic" in (Lammps().valid_file(whole) or "")
    old = lammps_restart(4000, revision=0)  # before the closing magic string existed
    whole.write_bytes(old[:-100])
    assert Lammps().valid_file(whole) is None


def test_gromacs_checkpoint_validity_needs_header_and_footer(tmp_path: Path) -> None:
    good = tmp_path / "s.cpt"
    body = (171817).to_bytes(4, "big") + b"x" * 100 + (171819).to_bytes(4, "big")
    good.write_bytes(body)
    assert Gromacs().valid_file(good) is None
    torn = tmp_path / "t.cpt"
    torn.write_bytes(body[:60])
    assert "incomplete" in (Gromacs().valid_file(torn) or "")


def test_the_md_step_is_read_from_a_real_gromacs_checkpoint_header() -> None:
    assert cpt_step(GMX_2022_HEAD) == 10_000
    assert Gromacs().recorded_step("run/simulation.cpt", GMX_2022_HEAD) == 10_000
    assert Gromacs().recorded_step("simulation.edr", GMX_2022_HEAD) is None  # not a .cpt


@pytest.mark.parametrize("version", [4, 5, 10, 11, 12, 13, 14, 17, 22])
def test_the_md_step_of_every_header_version_is_found(version: int) -> None:
    step = 3 * 10**9 if version >= 5 else 123_456  # past 2**31: an int64 since version 5
    assert cpt_step(cpt_header(version, step)) == step


def test_a_file_that_is_no_gromacs_checkpoint_has_no_md_step() -> None:
    assert cpt_step(b"") is None
    assert cpt_step(GMX_2022_HEAD[:120]) is None  # cut inside the header
    assert cpt_step(b"LammpS RestartT" + bytes(200)) is None  # another engine's file
    bad_string = struct.pack(">2i", 171817, 1 << 20) + bytes(64)  # a 1 MiB "version"
    assert cpt_step(bad_string) is None


def test_gromacs_dump_output_list_is_parsed() -> None:
    dump = (
        "number of output files = 2\n"
        "output filename = simulation.log\nfile_offset_high = 0\nfile_offset_low = 19187\n"
        "file_checksum_size = 19187\nfile_checksum = ab3b\n"
        "output filename = simulation.edr\nfile_offset_high = 1\nfile_offset_low = -2\n"
        "file_checksum_size = 1048576\nfile_checksum = 1552\n"
    )
    log, edr = parse_outputs(dump)
    assert (log.name, log.offset, log.checksum) == ("simulation.log", 19187, "ab3b")
    assert edr.offset == (1 << 32) + (1 << 32) - 2


def test_checkpointer_heuristic_reads_python_c_and_scripts(tmp_path: Path) -> None:
    assert uses_checkpointer(["python", "-c", "import m27; m27.Checkpointer()"], tmp_path)
    assert not uses_checkpointer(["python", "missing.py"], tmp_path)
    (tmp_path / "train.py").write_text("import m27\nm27.Checkpointer()\nm27.watch_stop()\n")
    assert uses_checkpointer(["python", "train.py"], tmp_path)
    assert saves_at_stop(["python", "-u", str(tmp_path / "train.py")], tmp_path)


def test_a_script_that_is_a_pipe_is_not_read(tmp_path: Path) -> None:
    # opening a pipe waits for a writer: `m27 validate` of `python feed.py` hung forever
    os.mkfifo(tmp_path / "feed.py")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__main__.py").mkdir()
    argv = ["python", "feed.py", "-m", "pkg"]
    assert not uses_checkpointer(argv, tmp_path) and not saves_at_stop(argv, tmp_path)


def test_slurm_script_of_a_gromacs_step_passes_term_requeues_and_resumes(tmp_path: Path) -> None:
    import subprocess

    from m27.executors.slurm._script import ScriptInput, parse_options, render_script

    plan = plan_checkpoint(["gmx", "mdrun", "-deffnm", "simulation"], 300.0)
    text = render_script(
        ScriptInput(
            run_id="r1", step="md", attempt=1, argv=plan.argv, job_dir=tmp_path,
            workdir=tmp_path, python="/usr/bin/python3",
            options=parse_options({"time": 2}, site={}), resume_args=plan.resume,
            child_signal=plan.signal, requeue_on_clean_exit=True,
        )
    )  # fmt: skip
    assert "trap 'm27_usr1=1; m27_pass TERM' USR1" in text
    assert "then m27_extra=(-cpi simulation.cpt); fi" in text
    assert 'gmx mdrun -cpt 5 -deffnm simulation ${m27_extra[@]+"${m27_extra[@]}"} &' in text
    assert 'if [ "$m27_usr1" = 1 ] && [ "${SLURM_RESTART_COUNT:-0}" -lt 20 ]' in text
    script = tmp_path / "job.sh"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0


def _resume_step(resume: str) -> str:
    return (
        "vars: {STATE: x}\n"
        "pipeline:\n"
        "  - name: md\n"
        "    type: cpu\n"
        "    command: prog --go\n"
        "    checkpoint:\n"
        "      files: [state.chk]\n"
        f"      resume: {resume}\n"
    )


def test_a_resume_string_splits_like_a_command_a_value_staying_one_argument() -> None:
    text = _resume_step("--restart {{STATE}} --tag 'a b'")
    step = parse_pipeline(text, "p.yaml", {"STATE": "my state.chk"}).steps[0]
    assert step.checkpoint_resume == ("--restart", "my state.chk", "--tag", "a b")


def test_shell_syntax_in_a_resume_string_is_refused_where_it_stands() -> None:
    with pytest.raises(SpecError) as err:
        parse_pipeline(_resume_step("'-cpi state.cpt > log'"), "p.yaml")
    (problem,) = err.value.problems
    assert (problem.line, problem.column) == (8, 31)
    assert problem.field == "pipeline[0].checkpoint.resume"
    assert "'>' is shell syntax (an operator)" in problem.message


def test_a_nul_byte_from_a_value_in_a_resume_string_is_refused() -> None:
    text = _resume_step("--restart {{STATE}}").replace("{STATE: x}", '{STATE: "a\\0b"}')
    with pytest.raises(SpecError) as err:
        parse_pipeline(text, "p.yaml")
    (problem,) = err.value.problems
    assert "NUL byte" in problem.message and problem.field == "pipeline[0].checkpoint.resume"


GROMACS_FATAL = """\
Back Off! I just backed up md.log to ./#md.log.1#

-------------------------------------------------------
Program:     gmx grompp, version 2022.5-Debian_2022.5_2
Source file: src/gromacs/gmxpreprocess/grompp.cpp (line 699)

Fatal error:
number of coordinates in coordinate file (water.gro, 1530)
             does not match topology (topol.top, 1533)

For more information and tips for troubleshooting, please check the GROMACS
website at http://www.gromacs.org/Documentation/Errors
-------------------------------------------------------"""


def test_an_engines_error_block_or_line_is_said_on_one_line() -> None:
    from m27.executors.engines import ERROR_SAID_MAX, error_said

    assert error_said(GROMACS_FATAL.splitlines()) == (
        "number of coordinates in coordinate file (water.gro, 1530): does not match"
        " topology (topol.top, 1533)"
    )
    lammps = [
        "LAMMPS (29 Sep 2021)",
        "ERROR on proc 0: Cannot open file data.lj (src/read_data.cpp:331)",
    ]
    assert error_said(lammps) == "ERROR on proc 0: Cannot open file data.lj"
    assert error_said(["Traceback (most recent call last):", "ValueError: x"]) is None
    long = ["Fatal error:", "x" * 1000]
    said = error_said(long)
    assert said is not None and len(said) == ERROR_SAID_MAX and said.endswith("...")
