"""`m27 logs RUN STEP` for a step with no log says why: not started yet, never will be
(skipped, or its run ended first), or its log file is gone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from m27 import events as ev
from m27.cli.main import main
from m27.store.sqlite import open_store


def test_a_step_without_a_log_says_why(
    m27_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = tmp_path / "removed.log"
    store = open_store(m27_home)
    store.append(
        [
            ev.RunSubmitted(1.0, "done", "p", "p.yaml", ("a", "b", "c")),
            ev.StepStarted(2.0, "done", "a", 1, 9, 9, ("false",), log_path=str(gone)),
            ev.StepFailed(3.0, "done", "a", 1, 1.0, "exited with code 1", exit_code=1),
            ev.StepSkipped(3.0, "done", "b", "upstream step a did not succeed"),
            ev.RunCancelled(3.0, "done", 2.0),
            ev.RunSubmitted(4.0, "live", "p", "p.yaml", ("a",)),
        ]
    )
    store.close()
    expected = {
        ("done", "a"): f"(no log for a: {gone} is gone)",
        ("done", "b"): "(no log for b: it did not run (skipped: upstream step a did not succeed))",
        ("done", "c"): "(no log for c: it did not run (the run cancelled first))",
        ("live", "a"): "(no log yet for a: it has not started)",
    }
    for (run, step), said in expected.items():
        assert main(["logs", run, step]) == 0
        assert capsys.readouterr().err.strip() == said


def _one_step_run(m27_home: Path, log: Path, *more: ev.Event) -> None:
    """Run `one` of one step `only`, done, its log at `log`; then `more` events."""
    store = open_store(m27_home)
    store.append(
        [
            ev.RunSubmitted(1.0, "one", "p", "p.yaml", ("only",)),
            ev.StepStarted(2.0, "one", "only", 1, 9, 9, ("true",), log_path=str(log)),
            ev.StepSucceeded(3.0, "one", "only", 1, 1.0),
            ev.RunSucceeded(3.0, "one", 2.0),
            *more,
        ]
    )
    store.close()


def test_step_may_be_left_out_for_a_run_of_one_step(
    m27_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`m27 logs last` was an argparse error; for one step there is nothing to choose."""
    log = tmp_path / "only.log"
    log.write_text("hello from the only step\n")
    _one_step_run(m27_home, log, ev.RunSubmitted(4.0, "two", "p", "p.yaml", ("prep", "sim")))
    assert main(["logs", "one"]) == 0
    assert capsys.readouterr().out == "hello from the only step\n"
    assert main(["logs", "two"]) == 2
    err = capsys.readouterr().err
    assert "m27 logs: name a step of run two: prep, sim" in err
    assert "e.g. m27 logs two prep" in err


def test_a_wide_runs_step_names_are_cut_and_a_typo_gets_its_match(
    m27_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run of 201 steps listed every name, a screenful that hid the message."""
    names = (*(f"s{i}" for i in range(200)), "analyse")
    _one_step_run(m27_home, tmp_path / "x.log", ev.RunSubmitted(4.0, "wide", "p", "p.yaml", names))
    assert main(["logs", "wide", "analyze"]) == 2
    assert capsys.readouterr().err == (
        "m27 logs: run wide has no step 'analyze' (did you mean 'analyse'? its steps: "
        f"{', '.join(names[:20])} and 181 more)\n"
    )
    assert main(["logs", "wide"]) == 2
    assert f"name a step of run wide: {', '.join(names[:20])} and 181 more\n" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("text", "n", "shown"),
    [
        ("a\nb\nc\n", "2", "b\nc\n"),
        ("a\nb\nc", "2", "b\nc"),  # a last line without its newline is a line
        ("a\nb\nc\n", "5", "a\nb\nc\n"),
        ("a\nb\nc\n", "0", ""),
        ("", "3", ""),
        ("\n\n\n", "2", "\n\n"),
        ("é\nü\n", "1", "ü\n"),
    ],
)
def test_tail_prints_the_last_n_lines(
    m27_home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    text: str,
    n: str,
    shown: str,
) -> None:
    log = tmp_path / "only.log"
    log.write_text(text, encoding="utf-8")
    _one_step_run(m27_home, log)
    assert main(["logs", "one", "-n", n]) == 0
    assert capsys.readouterr().out == shown


def test_tail_reads_a_long_log_in_blocks_and_keeps_characters_whole(
    m27_home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Blocks of 7 bytes split the 2-byte characters; lines span several blocks."""
    from m27.cli.commands import logs

    monkeypatch.setattr(logs, "_BLOCK", 7)
    lines = [f"line {i} ñandú" for i in range(40)]
    log = tmp_path / "only.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    _one_step_run(m27_home, log)
    assert main(["logs", "one"]) == 0
    assert capsys.readouterr().out.splitlines() == lines
    assert main(["logs", "one", "--tail", "13"]) == 0
    assert capsys.readouterr().out.splitlines() == lines[-13:]


@pytest.mark.parametrize("bad", ["-1", "x", "1.5"])
def test_tail_refuses_what_is_not_a_count(
    m27_home: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["logs", "one", "-n", bad])
    assert exited.value.code == 2
    assert f"argument -n/--tail: {bad!r} is not a number of lines (0 or more)" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("argv", [[], ["-n", "3"], ["-f"]])
@pytest.mark.parametrize("kind", ["a folder", "a pipe"])
def test_a_log_path_that_is_not_a_file_is_named_not_waited_on(
    m27_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, argv: list[str]
) -> None:
    # A pipe put in the log's place made `m27 logs` wait for a writer forever; a folder ended
    # in the last-resort message, which told the user to change M27_HOME.
    log = tmp_path / "only.log"
    if kind == "a folder":
        log.mkdir()
    else:
        os.mkfifo(log)
    _one_step_run(m27_home, log)
    assert main(["logs", *argv, "one", "only"]) == 1
    err = capsys.readouterr().err
    assert err == f"m27 logs: cannot read the log of only: {log} is {kind}, not a file\n"


@pytest.mark.parametrize(
    ("ended", "said"),
    [
        (  # the crash watcher closed the run: the step is `crashed`
            [ev.RunCrashed(5.0, "one", "flow run process 9 on vm died without recording an end")],
            "crashed: flow run process 9 on vm died without recording an end",
        ),
        (  # and stopped the step, recording why
            [
                ev.StepFailed(5.0, "one", "only", 1, 3.0, "run crashed: flow run process 9 died"),
                ev.RunCrashed(5.0, "one", "flow run process 9 died"),
            ],
            "run crashed: flow run process 9 died",
        ),
        (  # the agent found the step and its requester gone
            [
                ev.StepFailed(
                    5.0, "one", "only", 1, 3.0, "lost: its process and its requester are gone"
                )
            ],
            "lost: its process and its requester are gone",
        ),
    ],
)
@pytest.mark.parametrize("follow", [[], ["-f"]])
def test_a_log_cut_off_by_a_crash_says_why_it_has_no_end(
    m27_home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    ended: list[ev.Event],
    said: str,
    follow: list[str],
) -> None:
    """`m27 logs` of a crashed step printed the log's first line and nothing else, as it
    does for a step that still runs; with -f it then ended without a word."""
    log = tmp_path / "only.log"
    log.write_text("=== attempt 1: sleep 20 ===\nstep 100\n")
    store = open_store(m27_home)
    store.append(
        [
            ev.RunSubmitted(1.0, "one", "p", "p.yaml", ("only",)),
            ev.StepStarted(2.0, "one", "only", 1, 9, 9, ("sleep", "20"), log_path=str(log)),
            *ended,
        ]
    )
    store.close()
    assert main(["logs", "one", *follow]) == 0
    out = capsys.readouterr()
    assert out.out == "=== attempt 1: sleep 20 ===\nstep 100\n"
    assert out.err == f"(the log ends without attempt 1's end: {said})\n"


def test_a_log_with_its_end_says_nothing_more(
    m27_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "only.log"
    log.write_text("=== attempt 1: true ===\n=== attempt 1 succeeded ===\n")
    _one_step_run(m27_home, log)
    assert main(["logs", "one"]) == 0 and main(["logs", "one", "-f"]) == 0
    assert capsys.readouterr().err == ""
