"""m27.liveness: a pid plus its start time names one process; zombies and strangers are gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from m27 import liveness
from tests.waiting import wait_until


def test_a_running_process_is_alive_and_has_a_start_time() -> None:
    me = os.getpid()
    assert liveness.alive(me)
    started = liveness.start_time(me)
    assert started is not None
    assert liveness.own_start_time() == started
    assert liveness.alive(me, started)


def test_a_pid_with_another_start_time_is_a_stranger() -> None:
    started = liveness.own_start_time()
    assert started is not None
    assert not liveness.alive(os.getpid(), started - 3600.0)
    assert liveness.status(os.getpid(), started + 3600.0) is None


def test_no_pid_and_a_bad_pid_are_gone() -> None:
    for pid in (None, 0, -1):
        assert not liveness.alive(pid)
        assert liveness.start_time(pid) is None
        assert liveness.status(pid) is None


def test_zombies_count_as_gone() -> None:
    proc = subprocess.Popen(["true"])
    try:
        wait_until(lambda: not liveness.alive(proc.pid), what="`true` to exit")
        assert liveness.status(proc.pid) is None  # exited, not reaped yet: a zombie
    finally:
        proc.wait()
    assert not liveness.alive(proc.pid)


def test_a_stopped_process_reports_stopped_and_stays_alive() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        wait_until(lambda: liveness.status(proc.pid) in liveness.STOPPED, what="SIGSTOP")
        assert liveness.alive(proc.pid, liveness.start_time(proc.pid))
        os.kill(proc.pid, signal.SIGCONT)
        wait_until(lambda: liveness.status(proc.pid) not in liveness.STOPPED, what="SIGCONT")
    finally:
        proc.kill()
        proc.wait()
    assert not liveness.alive(proc.pid)
