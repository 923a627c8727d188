"""`m27 status` of a run as it goes and after it crashed: how long it and its steps have run,
what a running step printed last, and what the node service did about a crash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from m27 import events as ev
from m27.cli.main import main
from m27.store.sqlite import SqliteEventStore

RUN = "20261203-100000-aaaa"


def test_a_running_run_and_step_show_how_long_they_have_run(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both showed only `(-)` and `...` until they ended."""
    import os
    import re
    import time

    now = time.time()
    store = SqliteEventStore(m27_home / "events.db")
    store.append(
        [
            ev.RunSubmitted(now - 90, RUN, "p", "p.yaml", ("sim",), pid=os.getpid()),
            ev.StepStarted(now - 80, RUN, "sim", 1, os.getpid(), os.getpid(), ("x",)),
        ]
    )
    store.close()
    assert main(["status", RUN]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    run_for = re.search(r"running  \(for (\d+)m(\d+)", header)
    assert run_for and 90 <= int(run_for[1]) * 60 + int(run_for[2]) < 3600, header
    row = next(line for line in out.splitlines() if line.split()[:1] == ["sim"])
    step_for = re.search(r"running +1 +(\d+)m(\d+)", row)
    assert step_for and 80 <= int(step_for[1]) * 60 + int(step_for[2]) < 3600, row


def test_a_running_step_shows_its_last_line_of_output_and_how_old_it_is(
    m27_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A detached mdrun of days: how far it got (`step 55900, will finish ...`) and whether
    it still prints, without `m27 logs`. An ended step, and one with no output yet, show
    none; a log longer than the tail read still gives its last line."""
    import os
    import time

    now = time.time()
    log, quiet, done = tmp_path / "md.log", tmp_path / "quiet.log", tmp_path / "prep.log"
    log.write_text(
        "=== attempt 1: gmx mdrun -deffnm md -v ===\n"
        + "x" * 20000
        + "\nstep 48500, will finish Mon Dec  7 23:38:52 2026\n"
        + "step 55900, will finish Mon Dec  7 23:38:48 2026   \n\n"
    )
    os.utime(log, (now - 125, now - 125))
    quiet.write_text("=== attempt 1: sleep 100 ===\n")
    done.write_text("prepared\n=== attempt 1 succeeded ===\n")
    pid = os.getpid()
    store = SqliteEventStore(m27_home / "events.db")
    store.append(
        [
            ev.RunSubmitted(now - 300, RUN, "p", "p.yaml", ("prep", "md", "quiet"), pid=pid),
            ev.StepStarted(now - 290, RUN, "prep", 1, pid, pid, ("x",), log_path=str(done)),
            ev.StepSucceeded(now - 280, RUN, "prep", 1, 10.0),
            ev.StepStarted(now - 200, RUN, "md", 1, pid, pid, ("x",), (0,), log_path=str(log)),
            ev.StepStarted(now - 200, RUN, "quiet", 1, pid, pid, ("x",), log_path=str(quiet)),
        ]
    )
    store.close()
    assert main(["status", RUN]) == 0
    said = [x for x in capsys.readouterr().out.splitlines() if " said " in x]
    assert len(said) == 1, said
    assert said[0].startswith("  md said 2m0") and said[0].endswith(
        " ago: step 55900, will finish Mon Dec  7 23:38:48 2026"
    ), said

    assert main(["status", RUN, "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)["steps"]
    assert steps["md"]["last_output"] == "step 55900, will finish Mon Dec  7 23:38:48 2026   "
    assert steps["md"]["last_output_at"] == pytest.approx(now - 125, abs=1)
    assert steps["quiet"]["last_output"] is None  # its header is no output
    assert steps["prep"]["last_output"] is None  # ended: its row says how


def test_a_crashed_run_says_what_the_node_service_did_about_it(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`on_crash: resume`: the run that resumes it, or why the service did not."""
    store = SqliteEventStore(m27_home / "events.db")
    store.append(
        [
            ev.RunSubmitted(1.0, "a", "p", "p.yaml", ("s",), pid=1, on_crash="resume"),
            ev.RunCrashed(2.0, "a", "its process is gone"),
            ev.AutoResumeStarted(2.5, "a", "node-service:9"),
            ev.RunSubmitted(3.0, "b", "p", "p.yaml", ("s",), pid=1, on_crash="resume"),
            ev.RunCrashed(4.0, "b", "its process is gone"),
            ev.AutoResumeSkipped(4.5, "b", "it crashed before this node service started"),
        ]
    )
    assert main(["status", "a"]) == 0
    assert "  resumed by: the node service is starting it (on_crash: resume)" in (
        capsys.readouterr().out
    )
    store.append([ev.RunSubmitted(5.0, "c", "p", "p.yaml", ("s",), resume_of="a")])
    store.close()
    assert main(["status", "a"]) == 0
    assert "  resumed by: c\n" in capsys.readouterr().out
    assert main(["status", "b", "--json"]) == 0
    b = json.loads(capsys.readouterr().out)
    assert (b["on_crash"], b["auto_resume"]) == ("resume", "skipped")
    assert b["auto_resume_reason"] == "it crashed before this node service started"
    assert main(["status", "b"]) == 0
    assert (
        "  not resumed by the node service (on_crash: resume): it crashed before this node "
        "service started" in capsys.readouterr().out
    )
