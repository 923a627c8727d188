"""`m27 run --resume` says which succeeded step the file now gives another command (a
resume does not run it again, so a fix made to it was silently left out) and which it runs
again because its outputs are gone."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from m27 import events as ev
from m27.cli.commands._prepare import prepare
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


def _resume(path: Path, run_id: str | None, *rerun: str) -> None:
    args = argparse.Namespace(
        sets=[], resume=run_id, file=str(path), rerun=list(rerun), dry_run=False
    )
    prepare(args)


def _changed(step: str, run_id: str, was: str, now: str) -> str:
    """The note of a succeeded step whose command the file has changed since."""
    return (
        f"m27 run: note: step {step} succeeded in run {run_id} as `{was}`; the file now says "
        f"`{now}`, and a resume does not run it again unless asked to (--rerun {step} runs "
        "it and the steps after it)"
    )


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
        _changed("a", FIRST, "touch a.out", "touch a.out other.out"),
        _changed("b", SECOND, "echo fixed", "echo 'fixed again'"),
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


def test_rerun_names_the_step_and_those_after_it_instead_of_the_changed_command(
    m27_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--rerun a runs a (its command changed) and c, which waits on it; b, changed too
    but not asked for, is still noted as left out."""
    _log(m27_home)
    spec = _spec(
        tmp_path,
        "name: a, type: cpu, command: touch a.out other.out",
        "name: b, type: cpu, command: echo 'fixed again'",
        "name: c, type: cpu, command: echo c, depends_on: [a]",
    )
    _resume(spec, SECOND, "a")
    assert capsys.readouterr().err.splitlines() == [
        "m27 run: note: --rerun a: it runs again from the start (no checkpoint of an earlier "
        "run is restored), and so does the step waiting on it: c",
        _changed("b", SECOND, "echo fixed", "echo 'fixed again'"),
    ]


def test_rerun_of_a_run_where_every_step_succeeded_runs_them_rather_than_nothing(
    m27_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --rerun, such a resume exits 0 at once and says how to rerun a step."""
    _log(m27_home)
    spec = _spec(
        tmp_path,
        "name: a, type: cpu, command: touch a.out",
        "name: b, type: cpu, command: echo fixed",
    )
    with pytest.raises(SystemExit) as ended:
        _resume(spec, SECOND)
    assert ended.value.code == 0
    assert f"m27 run --resume {SECOND} --rerun STEP" in capsys.readouterr().out
    _resume(spec, SECOND, "b", "a", "b")  # returns: there is something to run
    assert capsys.readouterr().err == (
        "m27 run: note: --rerun b, a: they run again from the start (no checkpoint of an "
        "earlier run is restored)\n"
    )


@pytest.mark.parametrize(
    ("resume", "rerun", "message"),
    [
        (SECOND, "bb", "m27 run: --rerun: pipeline 'p' has no step 'bb' (did you mean 'b'? "
         "its steps: a, b, c)"),
        (SECOND, "zzz", "m27 run: --rerun: pipeline 'p' has no step 'zzz' (its steps: a, b, c)"),
        (None, "b", "m27 run: --rerun needs --resume RUN_ID (a new run runs every step): "
         "m27 run --resume last --rerun b"),
    ],
    ids=["typo", "unknown", "no-resume"],
)  # fmt: skip
def test_a_rerun_that_cannot_be_done_exits_2_in_one_line(
    m27_home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    resume: str | None,
    rerun: str,
    message: str,
) -> None:
    _log(m27_home)
    spec = _spec(
        tmp_path,
        "name: a, type: cpu, command: touch a.out",
        "name: b, type: cpu, command: echo fixed",
        "name: c, type: cpu, command: echo c",
    )
    with pytest.raises(SystemExit) as ended:
        _resume(spec, resume, rerun)
    assert ended.value.code == 2
    assert capsys.readouterr().err == message + "\n"
