"""`m27 run --resume` says which succeeded step the file now gives another command (a
resume does not run it again, so a fix made to it was silently left out) and which it runs
again because its outputs are gone."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from m27 import events as ev
from m27.cli.commands import run as run_cmd
from m27.events.state import fold
from m27.store.sqlite import SqliteEventStore

FIRST, SECOND = "20261204-100000-aaaa", "20261204-110000-bbbb"


def _log(home: Path) -> None:
    """FIRST ran `a` (succeeded) and failed `b`; SECOND resumed it and ran `b`, then `c`
    failed. Each run recorded the commands its file gave."""
    store = SqliteEventStore(home / "events.db")
    steps = ("a", "b", "c")
    store.append(
        [
            ev.RunSubmitted(
                1.0, FIRST, "p", "p.yaml", steps, step_commands=("touch a.out", "false", "true")
            ),
            ev.StepSucceeded(1.1, FIRST, "a", 1, 0.1),
            ev.StepFailed(1.2, FIRST, "b", 1, 0.1, "exit code 1", exit_code=1),
            ev.RunFailed(1.3, FIRST, 0.3, ("b",), "step b failed"),
            ev.RunSubmitted(
                2.0,
                SECOND,
                "p",
                "p.yaml",
                steps,
                resume_of=FIRST,
                step_commands=("touch a.out", "echo fixed", "false"),
            ),
            ev.StepSkipped(2.1, SECOND, "a", ev.StepSkipped.DONE_BEFORE),
            ev.StepSucceeded(2.2, SECOND, "b", 1, 0.1),
            ev.StepFailed(2.3, SECOND, "c", 1, 0.1, "exit code 1", exit_code=1),
            ev.RunFailed(2.4, SECOND, 0.4, ("c",), "step c failed"),
        ]
    )
    store.close()


def _spec(folder: Path, *steps: str) -> Path:
    """A pipeline `p` of `steps`, each a YAML flow mapping."""
    spec = folder / "p.yaml"
    spec.write_text("name: p\npipeline:\n" + "".join(f"  - {{{s}}}\n" for s in steps))
    return spec


def _resume(path: Path, run_id: str) -> None:
    args = argparse.Namespace(sets=[], resume=run_id, file=str(path))
    run_cmd._prepare(args)


def test_each_changed_succeeded_step_is_named_with_the_run_and_both_commands(
    m27_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _log(m27_home)
    spec = _spec(
        tmp_path,
        "name: a, type: cpu, command: touch a.out other.out",
        "name: b, type: cpu, command: echo 'fixed again'",
        "name: c, type: cpu, command: echo c",  # failed there: it runs again anyway
    )
    _resume(spec, SECOND)
    assert capsys.readouterr().err.splitlines() == [
        f"m27 run: note: step a succeeded in run {FIRST} as `touch a.out`; the file now says "
        "`touch a.out other.out`, and a resume does not run it again (a new run, without "
        "--resume, runs every step as the file is)",
        f"m27 run: note: step b succeeded in run {SECOND} as `echo fixed`; the file now says "
        "`echo 'fixed again'`, and a resume does not run it again (a new run, without "
        "--resume, runs every step as the file is)",
    ]


def test_unchanged_steps_and_logs_without_commands_say_nothing(
    m27_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _log(m27_home)
    store = SqliteEventStore(m27_home / "events.db")
    old = "20261204-090000-cccc"  # written before commands were recorded
    store.append(
        [
            ev.RunSubmitted(0.5, old, "p", "p.yaml", ("a",)),
            ev.StepSucceeded(0.6, old, "a", 1, 0.1),
            ev.RunSucceeded(0.7, old, 0.2),
        ]
    )
    assert fold(store.read_runs((FIRST,))).runs[FIRST].steps["b"].command == "false"
    store.close()
    spec = _spec(
        tmp_path,
        "name: a, type: cpu, command: touch a.out",
        "name: b, type: cpu, command: echo fixed",
        "name: c, type: cpu, command: echo c",
    )
    _resume(spec, SECOND)
    _resume(spec, old)
    assert capsys.readouterr().err == ""


def test_a_step_whose_output_is_gone_is_said_to_run_again_not_to_be_left_out(
    m27_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _log(m27_home)
    spec = _spec(
        tmp_path,
        "name: a, type: cpu, command: touch a.out other.out, output: a.out",
        "name: b, type: cpu, command: echo fixed",
        "name: c, type: cpu, command: cat a.out, depends_on: [a]",
    )
    _resume(spec, SECOND)
    assert capsys.readouterr().err.splitlines() == [
        f"m27 run: note: step a succeeded in run {FIRST}, but its output a.out is gone and a "
        "step that runs now needs it: it runs again, from the start"
    ]
    (tmp_path / "a.out").write_text("back")  # there again: skipped, its new command noted
    _resume(spec, SECOND)
    assert "the file now says `touch a.out other.out`" in capsys.readouterr().err
