"""`m27 queue` shows the queue the running agent published with its decision (gpus.json)
once that holds every change the log has, instead of folding the whole log; the agent
publishes again within a tick or two of a change (m27.node.report.queue_rows)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pytest

from m27 import events as ev
from m27.cli.commands import queue
from m27.clock import FakeClock
from m27.gpu.sim import SimBackend
from m27.node.agent import REPUBLISH_S, Agent
from m27.node.book import BOOK_KINDS, Book
from m27.node.report import SNAPSHOT_NAME, read_snapshot, snapshot, write_snapshot
from m27.store.sqlite import open_store
from tests.unit.event_samples import sample_event

GiB = 1024**3


def _request(step: str, at: float, priority: int = 0) -> ev.StepRequested:
    return ev.StepRequested(at=at, run_id="r", step=step, type="gpu", gpus=1,
                            gpu_memory=GiB, priority=priority)  # fmt: skip


def _publish(home: Path, seq: int, why: str) -> dict[str, object]:
    """A queue as a live agent (this process) publishes it, as of the log's `seq`."""
    book = Book(last_seq=seq)
    rows = {"held": [], "waiting": [{"step": "r/fit", "type": "gpu", "gpus": 1,
            "priority": 0, "base": 0, "bump": 0, "owner": "", "waited_s": 1.0, "why": why}]}  # fmt: skip
    write_snapshot(home, snapshot([], book, "sim", time.time(), queue=rows))
    return rows


def _queue(capsys: pytest.CaptureFixture[str], why: str | None = None) -> str:
    assert queue.run(argparse.Namespace(why=why, json=why is None)) == 0
    return capsys.readouterr().out


def test_the_published_queue_is_shown_while_it_holds_every_change_in_the_log(
    m27_home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(m27_home)
    store.append([_request("fit", time.time())])  # no aging yet
    published = _publish(m27_home, store.last_seq(), "waits for the agent's reason")
    # what changes no queue (a measurement) does not make it out of date
    store.append([ev.StepEnergyMeasured(at=2.0, run_id="r", step="md", gpu=0, joules=5.0)])
    # (with no step waiting out a retry_delay beside it)
    assert json.loads(_queue(capsys)) == {**published, "retrying": []}
    assert _queue(capsys, "fit") == "r/fit: waits for the agent's reason\n"
    # a bump after it: no newer one comes, so the log is folded (and shows the bump)
    monkeypatch.setattr(queue, "WAIT_S", 0.0)
    store.append([ev.PriorityBumped(at=3.0, run_id="r", step="fit", delta=4)])
    (row,) = json.loads(_queue(capsys))["waiting"]
    assert (row["step"], row["bump"], row["priority"]) == ("r/fit", 4, 4)
    assert "agent's reason" not in row["why"]
    store.close()


def test_every_kind_outside_book_kinds_leaves_a_book_as_it_was() -> None:
    """BOOK_KINDS names what makes a published queue out of date: a kind left out of it
    that changed a book would leave `m27 queue` showing an old queue."""
    for cls in ev.EVENT_TYPES.values():
        if cls in BOOK_KINDS:
            continue
        book = Book()
        book.apply(_request("s", 1.0))
        book.apply(ev.LeaseGranted(at=2.0, run_id="r", step="s", gpus=(0,)))
        before = repr(book)
        book.apply(sample_event(cls))
        assert repr(book) == before, cls.__name__


def test_the_agent_publishes_its_queue_again_soon_after_the_book_changes(
    m27_home: Path,
) -> None:
    store = open_store(m27_home)
    clock = FakeClock(100.0)
    agent = Agent(store, SimBackend(1, memory_total=16 * GiB), m27_home, clock=clock)
    try:
        agent.tick()
        first = read_snapshot(m27_home, now=clock.now())
        assert first is not None and first["queue"] == {"held": [], "waiting": []}
        asked = store.append([_request("fit", clock.now(), priority=2)])
        for rec in store.read(after=agent.book.last_seq):
            agent._apply(rec)
        clock.advance(REPUBLISH_S / 2)
        agent.tick()  # too soon after the last one
        assert read_snapshot(m27_home, now=clock.now())["seq"] == first["seq"]  # type: ignore[index]
        clock.advance(REPUBLISH_S)
        agent.tick()
        again = read_snapshot(m27_home, now=clock.now())
        assert again is not None and again["seq"] == asked  # as of the request
        held, waiting = again["queue"]["held"], again["queue"]["waiting"]
        # the agent granted it in that tick: the reason says so, from its own decision
        assert [w["step"] for w in waiting] == ["r/fit"] and held == []
        assert waiting[0]["why"].startswith("granted (immediate) on GPU 0")
        assert (m27_home / SNAPSHOT_NAME).exists()
    finally:
        agent.close()
        store.close()
