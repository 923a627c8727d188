"""An event log that cannot be written (a full disk) pauses the agent's decisions, not the
agent: the first failed append used to end its thread and the node service with it."""

from __future__ import annotations

import errno
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from m27 import events as ev
from m27._exceptions import StoreError
from m27.clock import FakeClock
from m27.node.outage import Outage, Repeats
from m27.step import Channel
from m27.store.sqlite import SqliteEventStore
from tests.unit.agent_helpers import make_node, run_step_leased
from tests.waiting import wait_until


class FullDisk:
    """The agent's view of the node's log: appends fail while `full` is set (reads work, as
    SQLite's do on a full disk); everything else goes to the real store."""

    def __init__(self, store: SqliteEventStore) -> None:
        self.store = store
        self.full = threading.Event()
        self.refused = 0

    def append(self, events: Any) -> Any:
        if self.full.is_set():
            self.refused += 1
            raise StoreError(f"cannot append to event log {self.store.path}: disk is full")
        return self.store.append(events)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


@pytest.mark.parametrize("full_at_start", [False, True])
def test_a_full_disk_holds_the_grant_until_the_log_takes_it_then_grants_once(
    full_at_start: bool,
    m27_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(Outage, "RETRY_S", 0.05)
    caplog.set_level(logging.WARNING, logger="m27.node.outage")
    node = make_node(m27_home, gpus=1)
    disk = FullDisk(node.store)
    node.agent.store = disk  # type: ignore[assignment]
    if full_at_start:  # its AgentStarted cannot be recorded either
        disk.full.set()
    node.start()
    try:
        disk.full.set()
        step = run_step_leased(node.lease(), "r", "s", ("true",))
        # the agent decided to grant and could not record it; it keeps trying, alive
        wait_until(lambda: disk.refused >= 3, what="three refused appends")
        assert node.thread is not None and node.thread.is_alive()
        assert node.of(ev.StepRequested) and not node.of(ev.LeaseGranted)
        assert "the agent decides nothing new until the log can be written" in caplog.text

        disk.full.clear()
        result = step.wait()
        assert result is not None and result.exit_code == 0
        # the kept grant was appended, and no second one was decided meanwhile
        assert [(e.run_id, e.step) for e in node.of(ev.LeaseGranted)] == [("r", "s")]  # type: ignore[attr-defined]
        assert "takes writes again" in caplog.text
        assert len(node.of(ev.AgentStarted)) == 1
    finally:
        disk.full.clear()
        node.close()


def test_a_failure_repeated_every_pass_is_one_line_a_minute_with_its_count() -> None:
    said: list[str] = []
    clock = FakeClock()
    say = Repeats(said.append, every=60.0, clock=clock)
    for _ in range(120):  # a full disk, every 0.5 s for a minute
        say("cannot write the GPU snapshot: No space left on device")
        clock.advance(0.5)
    say("cannot write the GPU snapshot: No space left on device")
    assert said == [
        "cannot write the GPU snapshot: No space left on device",
        "cannot write the GPU snapshot: No space left on device "
        "(again 119 time(s) in the last 60s)",
    ]
    say("crash watch: StoreError")  # another line: said at once
    clock.advance(1)
    say("crash watch: StoreError")
    say("the log takes writes again")  # the count held back comes first
    assert said[2:] == [
        "crash watch: StoreError",
        "crash watch: StoreError (again 1 time(s) in the last 1s)",
        "the log takes writes again",
    ]


def test_a_channel_file_the_full_disk_refuses_leaves_the_step_waiting_not_the_agent_dead(
    m27_home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    full = threading.Event()
    create = Channel.create.__func__  # type: ignore[attr-defined]

    def on_a_full_disk(cls: type[Channel], path: Any, **kw: Any) -> Channel:
        if full.is_set():
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return create(cls, path, **kw)  # type: ignore[no-any-return]

    monkeypatch.setattr(Channel, "create", classmethod(on_a_full_disk))
    caplog.set_level(logging.WARNING, logger="m27.node.agent")
    node = make_node(m27_home, gpus=1).start()
    try:
        full.set()
        step = run_step_leased(node.lease(), "r", "s", ("true",))
        wait_until(lambda: "cannot create a step's channel" in caplog.text)
        assert node.thread is not None and node.thread.is_alive()
        assert not node.of(ev.LeaseGranted)
        full.clear()
        result = step.wait()
        assert result is not None and result.exit_code == 0
        assert len(node.of(ev.LeaseGranted)) == 1
    finally:
        full.clear()
        node.close()
