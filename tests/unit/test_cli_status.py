"""`m27 status RUN`: where each step runs, as the log tells it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from m27 import events as ev
from m27.cli.main import main
from m27.store.sqlite import SqliteEventStore

RUN = "20261203-100000-aaaa"


@pytest.fixture
def slurm_run(m27_home: Path) -> Path:
    """A run with a local CPU step, a Slurm step running on node7 and one waiting in Slurm's
    queue, and a step whose submission failed."""
    steps = ("prep", "sim", "wait", "bad")
    store = SqliteEventStore(m27_home / "events.db")
    store.append(
        [
            ev.RunSubmitted(1.0, RUN, "p", "p.yaml", steps, pid=0),
            ev.StepStarted(1.1, RUN, "prep", 1, 100, 100, ("true",)),
            ev.StepSucceeded(1.2, RUN, "prep", 1, 0.1),
            ev.StepQueued(1.3, RUN, "sim", "gpu"),
            ev.SlurmJobSubmitted(1.4, RUN, "sim", "42", 1),
            ev.SlurmJobStateChanged(1.5, RUN, "sim", "42", "RUNNING"),
            ev.StepStarted(1.5, RUN, "sim", 1, 0, 0, ("x",), (0, 1), host="node7"),
            ev.StepQueued(1.3, RUN, "wait", "gpu"),
            ev.SlurmJobSubmitted(1.4, RUN, "wait", "43", 1),
            ev.SlurmJobStateChanged(1.5, RUN, "wait", "43", "PENDING", "Resources"),
            ev.StepQueued(1.3, RUN, "bad", "gpu"),
            ev.StepFailed(1.4, RUN, "bad", 1, 0.0, "sbatch: Invalid partition name specified"),
        ]
    )
    store.close()
    return m27_home


def test_status_names_the_slurm_job_its_node_and_its_state_in_slurm(
    slurm_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", RUN]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[3:]}
    assert "job 42 on node7 GPU 0,1" in rows["sim"] and "Slurm RUNNING" in rows["sim"]
    assert "job 43" in rows["wait"] and "Slurm PENDING (Resources)" in rows["wait"]
    assert rows["prep"].split()[-1] == "cpu"
    # it never ran anywhere: no "cpu" for a GPU step whose sbatch failed
    assert "cpu" not in rows["bad"].split()

    assert main(["status", RUN, "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)["steps"]
    assert (steps["sim"]["slurm_job_id"], steps["sim"]["host"]) == ("42", "node7")
    assert steps["wait"]["slurm_state"] == "PENDING"


def _status_rows(
    m27_home: Path, capsys: pytest.CaptureFixture[str], run: str, *events: ev.Event
) -> dict[str, str]:
    """`m27 status RUN` after `events`: its step rows by step name."""
    store = SqliteEventStore(m27_home / "events.db")
    store.append(list(events))
    store.close()
    assert main(["status", run]) == 0
    return {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[3:]}


def test_a_step_that_never_queued_still_shows_its_type(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = "20261203-110000-bbbb"
    rows = _status_rows(
        m27_home,
        capsys,
        run,
        ev.RunSubmitted(1.0, run, "p", "p.yaml", ("a", "b"), step_types=("cpu", "gpu")),
        ev.StepFailed(1.5, run, "a", 1, 0.1, "exit code 1", exit_code=1),
        ev.RunFailed(1.6, run, 0.6, ("a",), "step a failed"),
    )
    assert rows["b"].split()[:2] == ["b", "gpu"]  # its TYPE, though it never reached the queue


def test_a_guest_says_beside_which_step_and_whether_it_is_held(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A guest showed `running` and nothing else, held or not; the queue knew, status not."""
    import os

    pid = os.getpid()
    other = "20261203-100000-cccc"
    store = SqliteEventStore(m27_home / "events.db")
    store.append(
        [
            ev.RunSubmitted(1.0, RUN, "p", "p.yaml", ("sim", "ana", "fit"), pid=pid),
            ev.RunSubmitted(1.0, other, "q", "q.yaml", ("big",), pid=pid),
            ev.LeaseGranted(2.0, RUN, "sim", (0,)),
            ev.StepStarted(2.1, RUN, "sim", 1, pid, pid, ("x",), (0,)),
            ev.LeaseGranted(2.0, other, "big", (1,)),
            ev.StepStarted(2.1, other, "big", 1, pid, pid, ("x",), (1,)),
            ev.LeaseGranted(3.0, RUN, "ana", (0,), tier="ready"),
            ev.GuestStarted(3.0, RUN, "ana", 0),
            ev.StepStarted(3.1, RUN, "ana", 1, pid, pid, ("x",), (0,)),
            ev.GuestPaused(3.2, RUN, "ana", 0),
            ev.LeaseGranted(3.0, RUN, "fit", (1,), tier="ready"),
            ev.GuestStarted(3.0, RUN, "fit", 1),
            ev.StepStarted(3.1, RUN, "fit", 1, pid, pid, ("x",), (1,)),
        ]
    )
    store.close()
    assert main(["status", RUN]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[3:]}
    assert rows["ana"].endswith("guest beside sim, paused while it computes")
    assert rows["fit"].endswith(f"guest beside {other}/big, running in its I/O wait")
    assert "guest" not in rows["sim"]
    assert main(["status", RUN, "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)["steps"]
    assert steps["ana"]["guest"] == {"gpu": 0, "paused": True, "primary": f"{RUN}/sim"}
    assert steps["fit"]["guest"] == {"gpu": 1, "paused": False, "primary": f"{other}/big"}
    assert steps["sim"]["guest"] is None


def test_a_gpu_step_shows_the_cores_its_gpus_share_gave_it(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """They were in its log, LeaseGranted and `m27 gpus`, not in `m27 status`."""
    import os

    pid = os.getpid()
    rows = _status_rows(
        m27_home,
        capsys,
        RUN,
        ev.RunSubmitted(1.0, RUN, "p", "p.yaml", ("md", "prep"), pid=pid),
        ev.LeaseGranted(2.0, RUN, "md", (1,), cpus=(4, 5, 6, 7)),
        ev.StepStarted(2.1, RUN, "md", 1, pid, pid, ("x",), (1,)),
        ev.LeaseGranted(2.0, RUN, "prep", ()),
        ev.StepStarted(2.1, RUN, "prep", 1, pid, pid, ("x",)),
    )
    assert rows["md"].rstrip().endswith(" 1 (cores 4-7)")
    assert rows["prep"].rstrip().endswith(" cpu")
    assert main(["status", RUN, "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)["steps"]
    assert (steps["md"]["cpus"], steps["prep"]["cpus"]) == ([4, 5, 6, 7], [])


def test_a_resume_says_which_steps_it_was_asked_to_run_again(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = "20261203-090000-aaaa"
    store = SqliteEventStore(m27_home / "events.db")
    store.append(
        [
            ev.RunSubmitted(1.0, first, "p", "p.yaml", ("a", "b")),
            ev.RunSucceeded(2.0, first, 1.0),
            ev.RunSubmitted(3.0, RUN, "p", "p.yaml", ("a", "b"), resume_of=first, rerun=("a",)),
            ev.RunSucceeded(4.0, RUN, 1.0),
        ]
    )
    store.close()
    assert main(["status", RUN]) == 0
    assert f"  resumes: {first} (--rerun a)\n" in capsys.readouterr().out
    assert main(["status", RUN, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["resume_of"], shown["rerun"]) == (first, ["a"])


def test_a_value_with_control_characters_is_shown_escaped_not_sent_to_the_terminal(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--set TITLE=...` may carry anything to a command; `m27 status` prints it, and an ESC
    printed as it is would retitle or clear the terminal of whoever looks."""
    store = SqliteEventStore(m27_home / "events.db")
    hostile = "x\x1b]0;owned\x07\x1b[2J"
    store.append(
        [
            ev.RunSubmitted(1.0, RUN, hostile, "p.yaml", ("a",), vars={"TITLE": hostile}),
            ev.RunSucceeded(2.0, RUN, 1.0),
        ]
    )
    store.close()
    assert main(["status", RUN]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert out.splitlines()[0].startswith(f"run {RUN}  pipeline x\\x1b]0;owned\\x07\\x1b[2J  ")
    assert "  vars: TITLE='x\\x1b]0;owned\\x07\\x1b[2J'\n" in out
    assert main(["status", RUN, "--json"]) == 0  # JSON carries the value as it is
    assert json.loads(capsys.readouterr().out)["vars"] == {"TITLE": hostile}


def test_a_cancelled_step_s_note_keeps_its_reason_apart_from_its_last_checkpoint(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = SqliteEventStore(m27_home / "events.db")
    store.append(
        [
            ev.RunSubmitted(1.0, RUN, "p", "p.yaml", ("md",)),
            ev.StepStarted(2.0, RUN, "md", 1, 10, 10, ("md",), gpus=(0,)),
            ev.CheckpointWritten(3.0, RUN, "md", "/ck/1", 985, 10, 10, 0.1),
            ev.StepCancelled(4.0, RUN, "md", reason="cancelled"),
            ev.RunCancelled(4.0, RUN, reason="cancel requested"),
        ]
    )
    store.close()
    assert main(["status", RUN]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "  md  " in line)
    assert row.endswith("cancelled; checkpoint@985")


def test_a_run_its_closed_terminal_cancelled_says_how_to_outlive_one(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = SqliteEventStore(m27_home / "events.db")
    store.append(
        [
            ev.RunSubmitted(1.0, RUN, "p", "p.yaml", ("a",)),
            ev.RunCancelled(2.0, RUN, reason="SIGHUP received"),
        ]
    )
    store.close()
    assert main(["status", RUN]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        f"run {RUN}  pipeline p  cancelled: SIGHUP received (its terminal closed; "
        "`m27 run --resume RUN -d` goes on after that)  (1.0s)"
    )


def test_a_detached_run_names_its_output_and_the_command_that_shows_it(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = SqliteEventStore(m27_home / "events.db")
    store.append([ev.RunSubmitted(1.0, RUN, "p", "p.yaml", ("a", "b"))])
    store.close()
    assert main(["status", RUN, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["output"] is None  # an attached run
    out = m27_home / "runs" / RUN / "run.out"
    out.parent.mkdir(parents=True)
    out.write_text("run output\n")
    assert main(["status", RUN]) == 0
    assert f"  output: {out} (m27 logs {RUN})\n" in capsys.readouterr().out
    assert main(["status", RUN, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["output"] == str(out)


def test_a_failed_step_says_once_how_it_failed(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """NOTE read `exit 3: exited with code 3`."""
    run = "20261203-110000-dddd"
    rows = _status_rows(
        m27_home,
        capsys,
        run,
        ev.RunSubmitted(1.0, run, "p", "p.yaml", ("a", "b")),
        ev.StepFailed(1.5, run, "a", 1, 0.1, "exited with code 3", exit_code=3),
        ev.StepFailed(1.5, run, "b", 1, 0.1, "command not found: gmx", exit_code=127),
        ev.RunFailed(1.6, run, 0.6, ("a", "b"), "step a failed"),
    )
    assert rows["a"].endswith("  exited with code 3")
    assert rows["b"].endswith("  command not found: gmx (exit 127)")


@pytest.mark.parametrize(
    ("end", "shown"),
    [
        (ev.RunCancelled(2.0, "R", "SIGTERM received"), "cancelled: SIGTERM received"),
        (ev.RunFailed(2.0, "R", 1.0, ("a",), "step a failed"), "failed: step a failed"),
        (ev.RunCrashed(2.0, "R", "flow run process 7 died"), "crashed: flow run process 7 died"),
        (ev.RunSucceeded(2.0, "R", 1.0), "succeeded"),
    ],
    ids=["cancelled", "failed", "crashed", "succeeded"],
)
def test_an_ended_run_says_how_it_ended(
    m27_home: Path, capsys: pytest.CaptureFixture[str], end: ev.Event, shown: str
) -> None:
    # `m27 status RUN` of a run stopped by SIGTERM said `cancelled`, not by what.
    run = "20261203-120000-cccc"
    end = type(end)(**{**end.__dict__, "run_id": run})
    store = SqliteEventStore(m27_home / "events.db")
    store.append([ev.RunSubmitted(1.0, run, "p", "p.yaml", ("a",), pid=0), end])
    store.close()
    assert main(["status", run]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"run {run}  pipeline p  {shown}  (")
    assert main(["status", run, "--json"]) == 0
    reason = json.loads(capsys.readouterr().out)["reason"]
    assert reason == ("" if shown == "succeeded" else shown.split(": ", 1)[1])


def test_a_step_the_agent_found_lost_in_a_crashed_run_shows_crashed(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After a power cut the node service's agent found the step (process and requester
    gone) before its crash watcher closed the run: `failed` beside `crashed`, for one end."""
    run = "20261203-130000-eeee"
    rows = _status_rows(
        m27_home,
        capsys,
        run,
        ev.RunSubmitted(1.0, run, "p", "p.yaml", ("s", "t"), pid=0),
        ev.StepStarted(1.1, run, "s", 1, 100, 100, ("sleep", "20")),
        ev.StepFailed(
            5.0, run, "s", 1, 3.9, "lost: its process and its requester (pid 9) are gone"
        ),
        ev.StepFailed(5.0, run, "t", 1, 0.1, "lost: the process that requested it (pid 9) is gone"),
        ev.RunCrashed(5.1, run, "flow run process 9 on vm died without recording an end"),
    )
    assert rows["s"].split()[1:3] == ["crashed", "1"], rows
    assert rows["s"].endswith("lost: its process and its requester (pid 9) are gone")
    assert rows["t"].split()[1] == "crashed", rows


def test_a_step_waiting_out_its_retry_delay_says_when_its_next_attempt_asks(
    m27_home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It showed `queued`, note `exited with code 3`, while `m27 queue` said `the queue is
    empty` and `m27 queue --why` knew no such step: nothing said it waited, or how long."""
    import os
    import re
    import time

    monkeypatch.setenv("M27_GPUS", "sim:1")
    now = time.time()
    store = SqliteEventStore(m27_home / "events.db")
    store.append(
        [
            ev.RunSubmitted(now - 20, RUN, "p", "p.yaml", ("md", "b"), pid=os.getpid()),
            ev.StepQueued(now - 19, RUN, "md", "gpu", gpus=1),
            ev.StepStarted(now - 18, RUN, "md", 1, os.getpid(), os.getpid(), ("x",), (0,)),
            ev.StepFailed(
                now - 10, RUN, "md", 1, 8.0, "exited with code 3", 3, will_retry=True,
                retry_delay=600.0,
            ),
            ev.StepQueued(now - 19, RUN, "b", "cpu"),
            # an earlier retry with no delay: it asks again at once, nothing to say
            ev.StepFailed(now - 10, RUN, "b", 1, 8.0, "exited with code 1", 1, will_retry=True),
        ]
    )  # fmt: skip
    store.close()
    assert main(["status", RUN]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[3:]}
    assert "queued" in rows["md"]
    # (the time left depends on when the test reads it: within the 600 s delay)
    left = r"\d+m\d+s"
    assert re.search(rf"exited with code 3; attempt 2 in {left} \(retry_delay\)$", rows["md"])
    assert "retry_delay" not in rows["b"]
    assert main(["status", RUN, "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)["steps"]
    assert steps["md"]["retry_at"] == pytest.approx(now + 590) and steps["b"]["retry_at"] is None

    assert main(["queue"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "the queue is empty"
    (said,) = out[1:]
    assert re.fullmatch(
        rf"{RUN}/md: waits out its retry_delay: attempt 2 asks for a GPU in {left} \(attempt "
        r"1: exited with code 3\)",
        said,
    ), said
    assert main(["queue", "--why", "md"]) == 0
    assert capsys.readouterr().out.startswith(f"{RUN}/md: waits out its retry_delay: attempt 2")


def test_queue_why_names_the_steps_a_name_shared_by_two_runs_could_mean(
    m27_home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs of one pipeline each have a step `md`: `m27 queue --why md` said `no
    waiting or running step matches 'md'`, as for a step that is nowhere."""
    import os
    import time

    monkeypatch.setenv("M27_GPUS", "sim:1")
    now, runs = time.time(), (RUN, "20261203-100000-bbbb")
    store = SqliteEventStore(m27_home / "events.db")
    for run in runs:
        store.append(
            [
                ev.RunSubmitted(now - 20, run, "p", "p.yaml", ("md",), pid=os.getpid()),
                ev.StepQueued(now - 19, run, "md", "gpu", gpus=1),
                ev.StepFailed(now - 10, run, "md", 1, 8.0, "exited with code 3", 3,
                              will_retry=True, retry_delay=600.0),
            ]
        )  # fmt: skip
    store.close()
    assert main(["queue", "--why", "md"]) == 2
    assert capsys.readouterr().err == (
        f"m27 queue: 'md' matches 2 steps ({runs[0]}/md, {runs[1]}/md): name one as RUN/STEP\n"
    )
    assert main(["queue", "--why", f"{runs[1]}/md"]) == 0
    assert capsys.readouterr().out.startswith(f"{runs[1]}/md: waits out its retry_delay")


def test_status_counts_each_matrix_s_steps_by_status_below_the_table(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    steps = (*(f"md.{i}" for i in range(30)), "summary")
    groups = ("md",) * 30 + ("",)
    store = SqliteEventStore(m27_home / "events.db")
    store.append(
        [
            ev.RunSubmitted(1.0, RUN, "p", "p.yaml", steps, pid=0, step_groups=groups),
            ev.StepFailed(1.3, RUN, "md.27", 1, 0.1, "exited with code 3", exit_code=3),
            ev.StepCancelled(1.3, RUN, "md.28", reason="cancelled"),
            *(
                ev.StepSucceeded(1.2, RUN, f"md.{i}", 1, 0.1, outputs=(f"out/{i}.xtc",))
                for i in range(27)
            ),
        ]
    )
    store.close()
    assert main(["status", RUN]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "  matrix md: 27 succeeded, 1 failed, 1 cancelled, 1 pending" in out
    assert not any(line.startswith("  matrix summary") for line in out)
    (outputs,) = [line for line in out if line.startswith("  outputs: ")]
    assert outputs.endswith(", out/19.xtc and 7 more")  # not 27 paths on one line
    assert main(["status", RUN, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["steps"]
    assert (got["md.3"]["matrix"], got["summary"]["matrix"]) == ("md", None)


def test_vars_are_shown_as_set_takes_them(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A list variable's values are one text with blanks: unquoted, `TEMPS=300 310` read
    as a variable and a stray word."""
    store = SqliteEventStore(m27_home / "events.db")
    store.append(
        [
            ev.RunSubmitted(1.0, RUN, "p", "p.yaml", ("a",),
                            vars={"TEMPS": "300 310", "OUT": "runs"}),
            ev.RunSucceeded(2.0, RUN, 1.0),
        ]
    )  # fmt: skip
    store.close()
    assert main(["status", RUN]) == 0
    assert "  vars: TEMPS='300 310' OUT=runs\n" in capsys.readouterr().out
