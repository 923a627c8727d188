"""`m27 validate` and `m27 run` note what a valid file will fail at when a step starts,
which may be hours into a run: a program on no folder of its PATH (a typo, `gmxx`, or an
environment not activated), and a GPU named by an index the step will not see (m27 sets
CUDA_VISIBLE_DEVICES to the step's leased GPUs, seen inside as 0, 1, ..., so a job
written by hand for the second GPU, `--device cuda:1` or mdrun's `-gpu_id 1`, fails
`invalid device ordinal`). Notes, not problems: an earlier step may install the program."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from m27.cli.commands import validate

MISSING = "m27-no-such-program"


def _validate(path: Path, *flags: str) -> int:
    parser = argparse.ArgumentParser(prog="m27")
    validate.register(parser.add_subparsers())
    args = parser.parse_args(["validate", str(path), *flags])
    code: int = args.func(args)
    return code


def _pipeline(tmp_path: Path, steps: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text("name: p\nsteps:\n" + steps)
    return path


def test_a_program_on_no_folder_of_path_is_noted_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = _pipeline(
        tmp_path,
        "  - {name: prep, type: cpu, command: 'true'}\n"
        f"  - name: md\n    type: cpu\n    depends_on: [prep]\n    command: {MISSING} -v\n",
    )
    assert _validate(path) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK: pipeline 'p' (2 steps)\n")
    assert out.splitlines()[-1] == (
        f"note: p.yaml:4: step md: '{MISSING}' is not on PATH here; the step fails "
        f"`command not found: {MISSING}` when it starts, unless an earlier step installs it"
    )
    assert _validate(path, "--json") == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ok"] is True
    assert [n.split(": ", 2)[1] for n in result["notes"]] == ["step md"]


def test_the_steps_own_path_is_where_its_program_is_looked_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / MISSING).write_text("#!/bin/sh\n")
    (tools / MISSING).chmod(0o755)
    path = _pipeline(
        tmp_path,
        f"  - name: a\n    type: cpu\n    command: {MISSING}\n    env:\n      PATH: {tools}\n"
        f"  - name: b\n    type: cpu\n    command: ls\n    env:\n      PATH: {tmp_path}\n",
    )
    assert _validate(path) == 0
    (note,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert ": step b: 'ls' is not on its env's PATH here;" in note


def test_what_cannot_be_looked_up_here_is_not_noted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A path (an earlier step may build it), a shell command, a Slurm step (another
    node's PATH) and `python` (m27's own interpreter) are not looked up."""
    path = _pipeline(
        tmp_path,
        "  - {name: built, type: cpu, command: ./build/sim}\n"
        f"  - {{name: sh, type: cpu, shell: true, command: '{MISSING} | wc -l'}}\n"
        f"  - {{name: hpc, type: cpu, executor: slurm, command: {MISSING}}}\n"
        "  - {name: py, type: cpu, command: python -c pass}\n",
    )
    assert _validate(path) == 0
    assert "note:" not in capsys.readouterr().out


def test_many_steps_of_one_missing_program_make_one_note_and_many_programs_a_few(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 5,000-step sweep of one misspelt program printed 5,000 notes."""
    monkeypatch.chdir(tmp_path)
    steps = "".join(f"  - {{name: s{i}, type: cpu, command: '{MISSING} {i}'}}\n" for i in range(50))
    path = _pipeline(tmp_path, steps)
    assert _validate(path) == 0
    (note,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert note == (
        f"note: p.yaml:3: steps s0, s1, s2 and 47 more: '{MISSING}' is not on PATH here; they "
        f"fail `command not found: {MISSING}` when they start, unless an earlier step installs it"
    )
    steps = "".join(f"  - {{name: s{i}, type: cpu, command: '{MISSING}-{i}'}}\n" for i in range(50))
    path = _pipeline(tmp_path, steps)
    assert _validate(path) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert len(notes) == 11
    assert notes[-1] == "note: ... and 40 more (`m27 validate --json` lists all)"
    assert _validate(path, "--json") == 0
    assert len(json.loads(capsys.readouterr().out)["notes"]) == 50


def test_gpu_indexes_the_step_will_not_see_are_noted_each_with_its_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "p.yaml"
    path.write_text(
        "name: p\nsteps:\n"
        "  - {name: md, type: gpu, command: python -m gmx mdrun -gpu_id 01}\n"
        "  - {name: tr, type: gpu, gpus: 2, command: 'python t.py --device=cuda:2 --b cuda:1'}\n"
        "  - name: pre\n    type: cpu\n    command: python p.py --device cuda:0\n"
        "    env: {CUDA_VISIBLE_DEVICES: '1'}\n"
        "  - {name: fine, type: gpu, gpus: 2, command: 'python x.py cuda:1 -gpu_id 0,1 xcuda:9'}\n"
    )
    assert _validate(path) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    sees = "(m27 sets CUDA_VISIBLE_DEVICES), so GPU"
    assert notes == [
        f"note: p.yaml:3: step md: -gpu_id 01: the step sees its 1 leased GPU as GPU 0 {sees} 1 "
        "is not there when it starts; write 0, or ask for more with gpus: N",
        "note: p.yaml:4: step tr: cuda:2: the step sees its 2 leased GPUs as GPUs 0 and 1 "
        f"{sees} 2 is not there when it starts; write one of those, or ask for more with gpus: N",
        "note: p.yaml:5: step pre: cuda:0: a cpu step sees no GPU (m27 sets "
        "CUDA_VISIBLE_DEVICES empty), so GPU 0 is not there when it starts; make it type: gpu",
        "note: p.yaml:5: step pre: env CUDA_VISIBLE_DEVICES is replaced by the GPUs m27 leases "
        "the step (a cpu step: none)",
    ]
    assert _validate(path, "--json") == 0
    assert len(json.loads(capsys.readouterr().out)["notes"]) == 4


def test_a_program_path_that_cannot_be_started_is_noted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each validated OK and failed when its step started: `permission denied: ./x.sh`,
    # `Exec format error` (a shell runs a script without #! with /bin/sh; a step does not).
    monkeypatch.chdir(tmp_path)
    (tmp_path / "noexec.sh").write_text("#!/bin/sh\necho hi\n")
    (tmp_path / "bare.sh").write_text("echo hi\n")
    (tmp_path / "bare.sh").chmod(0o755)
    (tmp_path / "ok.sh").write_text("#!/bin/sh\necho hi\n")
    (tmp_path / "ok.sh").chmod(0o755)
    path = _pipeline(
        tmp_path,
        "  - {name: perm, type: cpu, command: ./noexec.sh}\n"
        "  - {name: bare, type: cpu, command: ./bare.sh}\n"
        f"  - {{name: dir, type: cpu, command: {tmp_path}}}\n"
        "  - {name: wd, type: cpu, workdir: later, command: 'true'}\n"
        "  - {name: good, type: cpu, command: ./ok.sh}\n"
        "  - {name: built, type: cpu, command: ./made-by-an-earlier-step}\n"
        "  - {name: sh, type: cpu, command: sh ./bare.sh}\n",
    )
    assert _validate(path) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert notes == [
        "note: p.yaml:3: step perm: ./noexec.sh: it is not executable (`chmod +x ./noexec.sh`,"
        " or run it with its interpreter); the step fails when it starts, unless an earlier"
        " step replaces it",
        "note: p.yaml:4: step bare: ./bare.sh: it has no #! line, so it cannot be started as a"
        " program (a shell would run it with /bin/sh): put `#!/bin/sh` (or its interpreter)"
        " first, or write `sh ./bare.sh`; the step fails when it starts, unless an earlier"
        " step replaces it",
        f"note: p.yaml:5: step dir: {tmp_path}: it is a folder, not a program; the step fails"
        " when it starts, unless an earlier step replaces it",
    ]  # (wd's workdir is made when it starts: no note)


def test_a_bare_name_of_a_script_in_the_workdir_is_noted_with_its_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # `command: prep.sh` meant `./prep.sh`: as in a shell, a bare name is looked up on PATH
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m27-prep.sh").write_text("#!/bin/sh\n")
    (tmp_path / "m27-prep.sh").chmod(0o755)
    path = _pipeline(tmp_path, "  - {name: prep, type: cpu, command: m27-prep.sh}\n")
    assert _validate(path) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "note: p.yaml:3: step prep: 'm27-prep.sh' is not on PATH here; the step fails "
        "`command not found: m27-prep.sh` when it starts, unless an earlier step installs it"
        " (the workdir has it: write ./m27-prep.sh)"
    )


def test_slurm_steps_on_a_node_without_sbatch_are_noted_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A login node without Slurm's client tools, or its module not loaded: each such
    step failed `sbatch not found` when it started, after the steps before it."""
    monkeypatch.chdir(tmp_path)
    path = _pipeline(
        tmp_path,
        "  - {name: prep, type: cpu, command: 'true'}\n"
        + "".join(
            f"  - {{name: md{i}, type: cpu, executor: slurm, command: 'true'}}\n" for i in range(5)
        ),
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    assert _validate(path) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "note: p.yaml:4: steps md0, md1, md2 and 2 more: executor: slurm, but `sbatch` is not "
        "on PATH here; submitting fails `sbatch not found: is Slurm installed here?` (load "
        "Slurm's module, or run m27 on a node with Slurm's client tools)"
    )
    sbatch = bin_dir / "sbatch"
    sbatch.write_text("#!/bin/sh\n")
    sbatch.chmod(0o755)
    assert _validate(path) == 0
    assert "sbatch" not in capsys.readouterr().out


def test_a_command_naming_another_step_s_output_without_waiting_for_it_is_noted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gmx mdrun -s topol.tpr` without `depends_on: [grompp]`: both started at once, and
    mdrun failed `No such file` (or ran last time's topol.tpr)."""
    monkeypatch.chdir(tmp_path)
    path = _pipeline(
        tmp_path,
        "  - {name: grompp, type: cpu, command: 'true -o topol.tpr', output: topol.tpr}\n"
        "  - {name: md, type: cpu, command: 'true -s topol.tpr', output: [run/sim.xtc]}\n"
        "  - {name: ana, type: cpu, shell: true, depends_on: [md],\n"
        "     command: 'cat ./topol.tpr run/sim.xtc > ana.txt'}\n"
        "  - {name: plot, type: cpu, command: 'true --in=run/sim.xtc --out=ana.txt'}\n"
        "  - {name: frames, type: cpu, command: 'true frames/f1.png', output: 'frames/*.png'}\n"
        "  - {name: late, type: cpu, command: 'true frames/f1.png', depends_on: [plot]}\n",
    )
    assert _validate(path) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert notes == [
        "note: p.yaml:4: step md: its command names topol.tpr, which step grompp writes "
        "(output:), but it does not wait for grompp: both may start at once; add "
        "depends_on: [grompp]",
        # through md, which does not wait for grompp either; run/sim.xtc: md, waited for
        "note: p.yaml:5: step ana: its command names ./topol.tpr, which step grompp writes "
        "(output:), but it does not wait for grompp: both may start at once; add "
        "depends_on: [grompp]",
        "note: p.yaml:7: step plot: its command names run/sim.xtc, which step md writes "
        "(output:), but it does not wait for md: both may start at once; add "
        "depends_on: [md]",
        # ana.txt is no step's output; a pattern names no one file
    ]
    fixed = path.read_text().replace(
        "output: [run/sim.xtc]}", "output: [run/sim.xtc], depends_on: [grompp]}"
    )
    path.write_text(fixed.replace("--out=ana.txt'}", "--out=ana.txt', depends_on: [ana]}"))
    assert _validate(path) == 0
    assert "does not wait" not in capsys.readouterr().out  # through ana and md: waits


def test_a_shell_commands_python_that_is_not_m27s_is_noted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a shell `python3` is m27's interpreter; `shell: true` (added for a `>`) let
    the shell pick another, and the step lost m27's environment's packages."""
    other = tmp_path / "bin"
    other.mkdir()
    (other / "python3").write_text("#!/bin/sh\n")
    (other / "python3").chmod(0o755)
    monkeypatch.setenv("PATH", f"{other}:/usr/bin:/bin")
    conda = tmp_path / "conda"  # a folder the step's own PATH puts first: its Python runs
    conda.mkdir()
    (conda / "python3").write_text("#!/bin/sh\n")
    (conda / "python3").chmod(0o755)
    monkeypatch.chdir(tmp_path)
    mine = Path(sys.executable).parent
    path = _pipeline(
        tmp_path,
        "  - {name: a, type: cpu, shell: true, command: 'python3 a.py > a.txt'}\n"
        "  - {name: b, type: cpu, shell: true, command: 'python3 -c 1 | cat'}\n"
        "  - {name: plain, type: cpu, command: 'python3 -c 1'}\n"  # m27's own: no note
        "  - {name: mine, type: cpu, shell: true, command: 'python3 x.py > y',\n"
        f"     env: {{PATH: '{mine}:/usr/bin'}}}}\n"  # the shell finds m27's: no note
        "  - {name: gone, type: cpu, shell: true, command: 'python x.py > y',\n"
        f"     env: {{PATH: '{tmp_path / 'empty'}'}}}}\n"
        "  - {name: conda, type: cpu, shell: true, command: 'python3 x.py > y',\n"
        f"     env: {{PATH: '{conda}:{other}:/usr/bin:/bin'}}}}\n",  # chosen: no note
    )
    assert _validate(path) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "shell: true" in line]
    assert notes == [
        f"note: p.yaml:3: steps a, b: with shell: true, `python3` runs {other}/python3, not "
        f"the Python m27 runs in ({sys.executable}) that a command without a shell gets; "
        f"write {sys.executable} if the step needs what m27's environment has",
        f"note: p.yaml:8: step gone: with shell: true, `python` finds no such program on "
        f"PATH, not the Python m27 runs in ({sys.executable}) that a command without a "
        f"shell gets; write {sys.executable} if the step needs what m27's environment has",
    ]
