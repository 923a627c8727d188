"""`m27 wait RUN...`: until every run has ended, a line as each does; 0 only if all
succeeded. Detached runs (`m27 run -d`) need it in scripts that go on afterwards."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from m27 import events as ev
from m27 import liveness
from m27.cli.main import main
from m27.store.sqlite import open_store
from tests.waiting import wait_until

DONE, LIVE, DEAD = "20261205-100000-aaaa", "20261205-110000-bbbb", "20261205-120000-cccc"


def _dead_pid() -> int:
    """A pid that ran and is gone (reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def node(m27_home: Path) -> Path:
    """DONE succeeded; LIVE runs in this process; DEAD's process died without its end."""
    here = {"host": socket.gethostname()}
    store = open_store(m27_home)
    store.append(
        [
            ev.RunSubmitted(1.0, DONE, "p", "p.yaml", ("a",)),
            ev.RunSucceeded(3.0, DONE, 2.0),
            ev.RunSubmitted(4.0, LIVE, "p", "p.yaml", ("a",), pid=os.getpid(), **here,
                            pid_started=liveness.own_start_time()),
            ev.RunSubmitted(5.0, DEAD, "p", "p.yaml", ("a",), pid=_dead_pid(), **here),
        ]
    )  # fmt: skip
    store.close()
    return m27_home


def test_ended_runs_are_said_at_once_and_a_dead_one_counts_as_crashed(
    node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["wait", DONE]) == 0
    assert capsys.readouterr().out == f"run {DONE} succeeded in 2.0s\n"
    assert main(["wait", DONE, DEAD[:12]]) == 1  # (a prefix, as everywhere)
    assert capsys.readouterr().out.splitlines() == [
        f"run {DONE} succeeded in 2.0s",
        f"run {DEAD} crashed",
    ]


def test_a_run_that_goes_on_is_waited_for_until_it_ends(
    node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    codes: list[int] = []
    waiter = threading.Thread(target=lambda: codes.append(main(["wait", DONE, LIVE])))
    waiter.start()
    said: list[str] = []
    try:  # LIVE ends once the wait has said DONE's end and waits for LIVE's
        wait_until(
            lambda: said.append(capsys.readouterr().out) or "".join(said) != "",
            timeout=60,
            what="the wait saying DONE's end",
        )
        store = open_store(node)
        store.append([ev.RunFailed(9.0, LIVE, 5.0, ("a",), "step a failed")])
        store.close()
    finally:
        waiter.join(timeout=60)
    assert not waiter.is_alive() and codes == [1]
    assert ("".join(said) + capsys.readouterr().out).splitlines() == [
        f"run {DONE} succeeded in 2.0s",
        f"run {LIVE} failed in 5.0s: step a failed",
    ]


def test_without_a_run_it_waits_for_every_run_in_progress(
    node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["wait", "--timeout", "10ms"]) == 124  # LIVE (DEAD has crashed: not waited)
    assert capsys.readouterr().err == f"m27 wait: still running after 10ms: {LIVE}\n"
    store = open_store(node)
    store.append([ev.RunSucceeded(9.0, LIVE, 5.0)])
    store.close()
    assert main(["wait"]) == 0
    assert capsys.readouterr().out == "no runs in progress\n"


def test_timeout_names_what_still_runs_and_a_bad_id_is_bad_input(
    node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["wait", LIVE, "--timeout", "10ms"]) == 124
    assert capsys.readouterr().err == f"m27 wait: still running after 10ms: {LIVE}\n"
    assert main(["wait", "nosuchrun"]) == 2
    assert "no run matches 'nosuchrun'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as bad:
        main(["wait", LIVE, "--timeout", "0"])
    assert bad.value.code == 2


def test_a_crashed_run_the_node_resumes_is_followed_to_its_resume(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`on_crash: resume`: a script's `m27 wait R` went on at R's crash, while the node
    service resumed R and the work went on in R2; it waits for R2 now. A crash the service
    decided not to resume ends the wait at once."""
    here = {"host": socket.gethostname(), "on_crash": "resume"}
    crashed, skipped, again = "20261205-130000-dddd", "20261205-140000-eeee", "r2"
    store = open_store(m27_home)
    store.append(
        [
            ev.RunSubmitted(1.0, crashed, "p", "p.yaml", ("a",), pid=_dead_pid(), **here),
            ev.RunCrashed(2.0, crashed, "its process is gone"),
            ev.AutoResumeStarted(2.5, crashed, "node-service:1"),
            ev.RunSubmitted(3.0, skipped, "p", "p.yaml", ("a",), pid=_dead_pid(), **here),
            ev.RunCrashed(4.0, skipped, "its process is gone"),
            ev.AutoResumeSkipped(4.5, skipped, "it is bo's run and this service runs as m27"),
        ]
    )
    store.close()
    assert main(["wait", skipped]) == 1
    assert capsys.readouterr().out == f"run {skipped} crashed in 1.0s: its process is gone\n"

    codes: list[int] = []
    waiter = threading.Thread(target=lambda: codes.append(main(["wait", crashed])))
    waiter.start()
    said: list[str] = []
    try:  # the resume's run appears once the wait waits on the one it starts
        store = open_store(m27_home)
        store.append(
            [ev.RunSubmitted(5.0, again, "p", "p.yaml", ("a",), resume_of=crashed,
                             pid=os.getpid(), pid_started=liveness.own_start_time(), **here)]
        )  # fmt: skip
        wait_until(
            lambda: said.append(capsys.readouterr().out) or "resumes it" in "".join(said),
            timeout=60,
            what="the wait following the resume",
        )
        store.append([ev.RunSucceeded(9.0, again, 4.0)])
        store.close()
    finally:
        waiter.join(timeout=60)
    assert not waiter.is_alive() and codes == [0]
    assert ("".join(said) + capsys.readouterr().out).splitlines() == [
        f"run {crashed} crashed; run {again} resumes it (on_crash: resume)",
        f"run {again} succeeded in 4.0s",
    ]
