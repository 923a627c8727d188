"""m27.locks: one holder per lock file, its pid on record, gone with its process."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from m27.locks import AGENT_LOCK, BOT_LOCK, NodeLock, OutputHeld, OutputLocks


def test_one_holder_at_a_time_and_each_lock_file_is_its_own(tmp_path: Path) -> None:
    a, b = NodeLock(tmp_path), NodeLock(tmp_path, AGENT_LOCK)
    bot = NodeLock(tmp_path, BOT_LOCK)
    assert a.acquire() and a.held
    assert a.acquire()  # taking it again is a no-op
    assert not b.acquire() and not b.held
    assert bot.acquire()  # another service's lock is independent
    assert b.holder() == os.getpid()
    a.release()
    a.release()  # releasing twice is a no-op
    assert b.acquire()
    b.release()
    bot.release()


@contextlib.contextmanager
def _holder(tmp_path: Path, take: str) -> Iterator[subprocess.Popen[str]]:
    """A process that ran `take` (a statement that holds a lock under sys.argv[1], True
    when it got it) and waits; killed at the end if it still runs."""
    code = (
        "import sys; from pathlib import Path; from m27.locks import NodeLock, OutputLocks\n"
        f"print('held' if {take} else 'busy', flush=True)\n"
        "sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "held"
        yield child
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def _kill_9(child: subprocess.Popen[str]) -> None:
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=60)


def test_kill_9_of_the_holder_frees_the_lock(tmp_path: Path) -> None:
    with _holder(tmp_path, "NodeLock(Path(sys.argv[1])).acquire()") as child:
        mine = NodeLock(tmp_path)
        assert not mine.acquire()
        assert mine.holder() == child.pid
        _kill_9(child)
        assert mine.acquire()  # the kernel dropped the dead holder's flock
        assert mine.holder() == os.getpid()
        mine.release()


def test_two_runs_sharing_an_output_one_holds_them_and_the_other_none(tmp_path: Path) -> None:
    first = OutputLocks(tmp_path, ["/lab/out/a.npz", "/lab/out/b.png"])
    second = OutputLocks(tmp_path, ["/lab/out/c.csv", "/lab/out/b.png"])
    assert first.acquire("run r1 (md)") is None
    held = second.acquire("run r2 (md)")
    assert held == OutputHeld("/lab/out/b.png", os.getpid(), "run r1 (md)")
    # the refused run kept nothing: its other output is free for a third run
    third = OutputLocks(tmp_path, ["/lab/out/c.csv"])
    assert third.acquire("run r3 (x)") is None
    third.release()
    first.release()
    first.release()  # idempotent
    assert second.acquire("run r2 (md)") is None
    second.release()


def test_a_dead_runs_outputs_are_free(tmp_path: Path) -> None:
    take = "OutputLocks(Path(sys.argv[1]), ['/lab/out/a.npz']).acquire('run r1 (md)') is None"
    with _holder(tmp_path, take) as child:
        mine = OutputLocks(tmp_path, ["/lab/out/a.npz"])
        assert mine.acquire("run r2 (md)") == OutputHeld("/lab/out/a.npz", child.pid, "run r1 (md)")
        _kill_9(child)
        assert mine.acquire("run r2 (md)") is None  # kill -9 of a run frees its outputs
        mine.release()
