"""m27.io_wait() and m27.gate(): the step side and the agent side of one channel page."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from m27._exceptions import M27Error
from m27.step import _process as _step_api
from m27.step._channel import CHANNEL_SIZE, Channel
from m27.step._process import gate, io_wait
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh_step_channel() -> Iterator[None]:
    _step_api._reset_step_channel()
    yield
    _step_api._reset_step_channel()


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Channel]:
    """The agent's view of a channel this (test) process uses as its step channel."""
    path = tmp_path / "step.chan"
    channel = Channel.create(path)
    monkeypatch.setenv("M27_CHANNEL", str(path))
    yield channel
    _step_api._reset_step_channel()
    channel.close()


def test_outside_the_agent_io_wait_and_gate_do_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("M27_CHANNEL", raising=False)
    with io_wait():
        pass
    assert gate() is True
    assert _step_api._step_channel() is None


def test_io_wait_is_visible_to_the_agent_while_the_block_runs(agent: Channel) -> None:
    assert not agent.io_waiting() and agent.io_since() is None
    with io_wait():
        assert agent.io_waiting()
        assert agent.io_since() is not None
    assert not agent.io_waiting()
    assert agent.io_count() == 1 and agent.io_seconds() >= 0.0
    assert agent.pid() == os.getpid()


def test_nested_io_wait_counts_until_the_outer_block_ends(agent: Channel) -> None:
    with io_wait():
        since = agent.io_since()
        with io_wait():
            assert agent.io_since() == since
        assert agent.io_waiting()
    assert not agent.io_waiting()
    assert agent.io_count() == 2


def test_io_wait_ends_when_the_block_raises(agent: Channel) -> None:
    with pytest.raises(OSError), io_wait():
        raise OSError("disk full")
    assert not agent.io_waiting()


def test_io_wait_from_many_threads_keeps_a_consistent_depth(agent: Channel) -> None:
    def work() -> None:
        for _ in range(500):
            with io_wait():
                pass

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not agent.io_waiting()
    assert agent.io_count() == 2000


def test_gate_returns_at_once_when_open_and_counts_the_call(agent: Channel) -> None:
    assert not agent.uses_gate()
    assert gate() is True
    assert agent.uses_gate() and not agent.at_gate()


def test_closed_gate_times_out_and_clears_the_at_gate_flag(agent: Channel) -> None:
    agent.set_gate(False)
    assert not agent.gate_open()
    assert gate(timeout=0.01) is False
    assert not agent.at_gate()
    assert agent.gate_seconds() > 0.0


def test_channel_created_with_a_closed_gate(tmp_path: Path) -> None:
    channel = Channel.create(tmp_path / "c", gate_open=False)
    assert not channel.gate_open()
    channel.set_gate(True)
    assert Channel.open(tmp_path / "c", writable=False).gate_open()


def test_opening_something_that_is_not_a_channel_fails(tmp_path: Path) -> None:
    with pytest.raises(M27Error, match="cannot open channel"):
        Channel.open(tmp_path / "missing")
    (tmp_path / "short").write_bytes(b"x" * 10)
    with pytest.raises(M27Error, match="size"):
        Channel.open(tmp_path / "short")
    (tmp_path / "zeros").write_bytes(bytes(CHANNEL_SIZE))
    with pytest.raises(M27Error, match="not an m27 channel"):
        Channel.open(tmp_path / "zeros")


def test_bad_m27_channel_is_reported_once_and_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("M27_CHANNEL", str(tmp_path / "missing"))
    with io_wait():
        pass
    assert gate() is True
    assert capsys.readouterr().err.count("m27: M27_CHANNEL ignored") == 1


GATE_CHILD = """
import m27.step._process as api
print("loaded", flush=True)
api.gate()
print("passed", flush=True)
"""


def test_gate_blocks_a_real_child_until_the_agent_opens_it(tmp_path: Path) -> None:
    path = tmp_path / "guest.chan"
    agent = Channel.create(path, gate_open=False)
    env = dict(os.environ, M27_CHANNEL=str(path), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", GATE_CHILD], stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"loaded\n"
        wait_until(agent.at_gate, what="the child to reach its gate")
        ready, _, _ = select.select([proc.stdout], [], [], 0.05)
        assert not ready and proc.poll() is None  # still held
        assert agent.uses_gate() and agent.pid() == proc.pid
        agent.set_gate(True)
        out, _ = proc.communicate(timeout=20)
        assert out == b"passed\n" and proc.returncode == 0
        assert not agent.at_gate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        agent.close()


EXIT_CHILD = """
import os, sys
from m27.step._channel import Channel
from m27.step._process import gate
gate()  # resolves the step channel
pid = os.fork()
if pid == 0:
    sys.exit(0)  # a forked child that exits through atexit: not the step's exit
os.waitpid(pid, 0)
print("computing" if not Channel.open(os.environ["M27_CHANNEL"]).io_waiting() else "idle")
"""


def test_a_step_counts_as_waiting_on_io_once_its_interpreter_exits(tmp_path: Path) -> None:
    """The GPU of an exiting step is a guest's (the runner releases the lease later)."""
    path = tmp_path / "step.chan"
    agent = Channel.create(path)
    env = dict(os.environ, M27_CHANNEL=str(path), PYTHONPATH=str(ROOT))
    try:
        done = subprocess.run(
            [sys.executable, "-c", EXIT_CHILD], env=env, capture_output=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == b"computing\n"  # the forked child's exit did not speak for it
        assert agent.io_waiting()  # and its own exit did
    finally:
        agent.close()


def test_forked_child_can_use_io_wait_even_if_the_lock_was_held_at_fork(
    agent: Channel,
) -> None:
    with io_wait():
        pass
    channel = _step_api._step_channel()
    assert channel is not None
    channel._acquire()  # as if another thread were inside io_wait when the step forked
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        with io_wait():
            pass
        os._exit(0)
    channel._release()
    status: list[int] = []

    def reaped() -> bool:
        done, code = os.waitpid(pid, os.WNOHANG)
        if done:
            status.append(code)
        return bool(done)

    try:
        wait_until(reaped, timeout=20, what="the forked child (deadlocked in io_wait?)")
    finally:
        if not status:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status[0]) == 0
    assert agent.io_count() == 2 and not agent.io_waiting()
