"""m27.liveness: a pid plus its start time names one process; zombies and strangers are gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

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


def _procfs_with_boot_time_moved(root: Path, by: float) -> float:
    """A /proc at `root` that is the real one except for `stat`, whose boot time is `by`
    seconds later: what the kernel reports after the wall clock is stepped forward. psutil
    reads the procfs at ``psutil.PROCFS_PATH``. Returns the moved boot time."""
    root.mkdir()
    for entry in os.listdir("/proc"):
        if entry != "stat":
            (root / entry).symlink_to(f"/proc/{entry}")
    lines = Path("/proc/stat").read_text().splitlines()
    btime = next(int(line.split()[1]) for line in lines if line.startswith("btime "))
    moved = [f"btime {btime + int(by)}" if line.startswith("btime ") else line for line in lines]
    (root / "stat").write_text("\n".join(moved) + "\n")
    return float(btime + int(by))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the boot-time step is Linux's")
def test_a_stepped_wall_clock_leaves_live_processes_alive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NTP stepping the clock 10 s moved psutil's start time of every process by 10 s, and
    the node service declared live runs crashed and stopped their steps (seen in CI)."""
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(liveness, "ANCHOR_DIR", shm)
    monkeypatch.setattr(liveness, "_ANCHOR", {})
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = liveness.start_time(proc.pid)
        assert started is not None
        moved = _procfs_with_boot_time_moved(tmp_path / "proc", by=10)
        monkeypatch.setattr(psutil, "PROCFS_PATH", str(tmp_path / "proc"))
        assert psutil.boot_time() == moved  # psutil sees the step ...
        assert liveness.alive(proc.pid, started)  # ... m27 still knows the process
        assert liveness.start_time(proc.pid) == pytest.approx(started, abs=0.01)
        assert not liveness.alive(proc.pid, started - 5.0)  # a stranger is still told apart
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the boot anchor is Linux's")
def test_a_process_started_after_a_clock_step_reads_the_recorded_start_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The boot anchor is one file per boot: a process that first looks after the clock
    was stepped (a restarted node service, `m27 status`) gets the very start time this
    one recorded before the step."""
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(liveness, "ANCHOR_DIR", shm)
    monkeypatch.setattr(liveness, "_ANCHOR", {})
    mine = liveness.start_time(os.getpid())
    assert [p.name for p in shm.iterdir()] == [f"m27-boot-{liveness._boot_id()}"]
    _procfs_with_boot_time_moved(tmp_path / "proc", by=10)
    code = (
        "from pathlib import Path; import psutil; from m27 import liveness; "
        f"psutil.PROCFS_PATH = {str(tmp_path / 'proc')!r}; "
        f"liveness.ANCHOR_DIR = Path({str(shm)!r}); "
        f"print(repr(liveness.start_time({os.getpid()})), psutil.boot_time())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert float(out[1]) == psutil.boot_time() + 10  # it sees the moved boot time ...
    assert float(out[0]) == mine  # ... and the start time recorded before the step
