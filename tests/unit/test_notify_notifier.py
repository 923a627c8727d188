"""The notifier loop: cursor, restarts, crashes at each point, filters, the embedded thread."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from m27 import events as ev
from m27.clock import FakeClock
from m27.locks import NOTIFY_LOCK, NodeLock
from m27.notify.config import NotifyConfig, Secret
from m27.notify.notifier import Notifier, start_embedded_notifier
from m27.notify.outbox import Outbox
from m27.store.memory import MemoryEventStore
from tests.unit.test_notify_delivery import FakeSender

T0 = 1_700_000_000.0
CFG = NotifyConfig(token=Secret("t"), chat_ids=(7, 8), min_interval_s=0.0)


def run_events(run: str, ok: bool = True) -> list[ev.Event]:
    end: ev.Event = ev.RunSucceeded(T0, run, 10.0) if ok else ev.RunFailed(T0, run, 10.0)
    return [
        ev.RunSubmitted(T0, run, "p", "p.yaml", ("s",)),
        ev.StepStarted(T0, run, "s", 1, 1, 1, ("x",), (0,)),
        ev.StepSucceeded(T0, run, "s", 1, 3600.0)
        if ok
        else ev.StepFailed(T0, run, "s", 1, 3600.0, "boom", exit_code=2),
        end,
    ]


def make(
    store: MemoryEventStore, path: Path, sender: FakeSender, cfg: NotifyConfig = CFG
) -> Notifier:
    return Notifier(store, cfg, Outbox(path), sender, sender.clock)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


def test_each_message_reaches_every_chat_once(tmp_path: Path, clock: FakeClock) -> None:
    store = MemoryEventStore()
    store.append(run_events("r1") + run_events("r2", ok=False))
    sender = FakeSender(clock)
    n = make(store, tmp_path / "n.db", sender)
    n.step()
    n.step()
    kinds = sorted((c, t.split("\n")[0]) for c, t in sender.sent)
    assert kinds == [
        (7, "✅ <b>Run succeeded</b>"),
        (7, "❌ <b>Run failed</b>"),
        (8, "✅ <b>Run succeeded</b>"),
        (8, "❌ <b>Run failed</b>"),
    ]
    assert n.outbox.cursor() == store.last_seq()


def test_filters_drop_unwanted_kinds(tmp_path: Path, clock: FakeClock) -> None:
    store = MemoryEventStore()
    store.append(run_events("r1") + run_events("r2", ok=False))
    sender = FakeSender(clock)
    n = make(
        store,
        tmp_path / "n.db",
        sender,
        CFG.__class__(
            token=Secret("t"), chat_ids=(7,), kinds=frozenset({"run_failed"}), min_interval_s=0
        ),
    )
    n.step()
    assert [t.split("\n")[0] for _, t in sender.sent] == ["❌ <b>Run failed</b>"]


def test_restart_sends_nothing_twice_and_remembers_earlier_facts(
    tmp_path: Path, clock: FakeClock
) -> None:
    store = MemoryEventStore()
    events = run_events("r1")
    store.append(events[:3])
    sender = FakeSender(clock)
    first = make(store, tmp_path / "n.db", sender)
    first.step()
    first.outbox.close()
    store.append(events[3:])
    second = make(store, tmp_path / "n.db", sender)
    second.step()
    assert len(sender.sent) == 2  # one success message, two chats
    assert "1.00 GPU-h" in sender.sent[0][1]


def test_crash_before_the_enqueue_commit_loses_nothing(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = MemoryEventStore()
    store.append(run_events("r1"))
    sender = FakeSender(clock)
    n = make(store, tmp_path / "n.db", sender)

    def crash(*args: object, **kwargs: object) -> int:
        raise KeyboardInterrupt  # stands in for kill -9 before the commit

    monkeypatch.setattr(n.outbox, "enqueue", crash)
    with pytest.raises(KeyboardInterrupt):
        n.step()
    again = make(store, tmp_path / "n.db", sender)
    again.step()
    assert len(sender.sent) == 2


def test_crash_between_send_and_mark_sent_resends_exactly_once(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = MemoryEventStore()
    store.append(run_events("r1") + run_events("r2"))
    sender = FakeSender(clock)
    n = make(store, tmp_path / "n.db", sender)
    real = n.outbox.mark_sent
    calls = {"n": 0}

    def mark(ids: Sequence[int], now: float) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt  # killed after Telegram accepted the 2nd send
        real(ids, now)

    monkeypatch.setattr(n.outbox, "mark_sent", mark)
    with pytest.raises(KeyboardInterrupt):
        n.step()
    again = make(store, tmp_path / "n.db", sender)
    for _ in range(5):
        again.step()
    texts = [(c, t) for c, t in sender.sent]
    unique = set(texts)
    # both runs' messages, queued together, went to each chat as one: nothing lost
    assert {c for c, _ in unique} == {7, 8}
    assert all(t.count("<code>r1</code>") == t.count("<code>r2</code>") == 1 for _, t in texts)
    assert len(texts) - len(unique) == 1  # exactly one send repeated, the whole of it


def test_store_errors_are_logged_and_retried(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    store = MemoryEventStore()
    store.append(run_events("r1"))
    sender = FakeSender(clock)
    n = make(store, tmp_path / "n.db", sender)
    real_read = store.read
    failures = {"left": 2}

    def flaky(after: int = 0, limit: int | None = None) -> list[ev.Recorded]:
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("database is locked")
        return real_read(after, limit)

    store.read = flaky  # type: ignore[method-assign]
    stop = threading.Event()
    original_sleep = clock.sleep

    def sleep(seconds: float) -> None:
        original_sleep(seconds)
        if len(sender.sent) == 2:
            stop.set()

    clock.sleep = sleep  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, "m27.notify"):
        n.run(stop)
    assert "database is locked" in caplog.text and len(sender.sent) == 2


def test_embedded_notifier_without_a_token_does_nothing(tmp_path: Path) -> None:
    handle = start_embedded_notifier(MemoryEventStore(), NotifyConfig(chat_ids=(1,)), home=tmp_path)
    assert not handle.running
    handle.stop()
    assert not (tmp_path / "notify.db").exists()


def test_only_one_notifier_holds_the_node(tmp_path: Path) -> None:
    a, b = NodeLock(tmp_path, NOTIFY_LOCK), NodeLock(tmp_path, NOTIFY_LOCK)
    assert a.acquire()
    assert not b.acquire()
    a.release()
    assert b.acquire()
    b.release()
