"""`m27 validate` and `m27 run` name a step whose program is on no folder of its PATH:
a typo (`gmxx`) or an environment not activated validated OK and failed `command not
found` when the step started, which may be hours into a run. A note, not a problem: an
earlier step may install the program."""

from __future__ import annotations

import argparse
import json
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
