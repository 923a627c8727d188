"""`group_alive`: whether a step's process group still has a running process."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from m27.executors._proc import group_alive
from tests.waiting import wait_until


def _zombie(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2 :].split()[0] == "Z"


def test_a_running_group_is_alive_and_a_reaped_one_is_not() -> None:
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        assert group_alive(proc.pid)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert not group_alive(proc.pid)


def test_a_group_of_only_a_zombie_is_not_alive() -> None:
    """Where nothing reaps an ended process (a container's PID 1), killpg still finds the
    group: the zombie must not count as a running step."""
    proc = subprocess.Popen(["true"], start_new_session=True)
    try:
        wait_until(lambda: _zombie(proc.pid), timeout=30)  # ended, not reaped (by us)
        os.killpg(proc.pid, 0)  # the group is still there for the kernel
        assert not group_alive(proc.pid)
    finally:
        proc.wait(timeout=30)
