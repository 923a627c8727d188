"""The notifier with the real python-telegram-bot client against a local Bot API server."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from m27 import events as ev
from m27.clock import FakeClock
from m27.notify.config import NotifyConfig, Secret
from m27.notify.facts import NodeFacts
from m27.notify.messages import render
from m27.notify.notifier import Notifier, start_embedded_notifier
from m27.notify.outbox import Outbox
from m27.notify.telegram import TelegramClient
from m27.store.memory import MemoryEventStore
from tests.integration.fake_bot_api import FakeBotApi, running
from tests.services import free_port
from tests.waiting import wait_until

pytestmark = pytest.mark.service

TOKEN = "987654:TEST-token-that-must-never-leak"
T0 = 1_700_000_000.0
ROOT = Path(__file__).resolve().parents[2]


def run_events(run: str, ok: bool = True) -> list[ev.Event]:
    return [
        ev.RunSubmitted(T0, run, "md", "md.yaml", ("s",), prefect_url=f"http://ui/runs/{run}"),
        ev.StepStarted(T0, run, "s", 1, 1, 1, ("x",), (0,)),
        ev.StepSucceeded(T0, run, "s", 1, 1800.0)
        if ok
        else ev.StepFailed(T0, run, "s", 1, 1800.0, "boom", exit_code=3, log_tail="a <b>\n"),
        ev.RunSucceeded(T0, run, 1800.0) if ok else ev.RunFailed(T0, run, 1800.0),
    ]


def expected_texts(events: list[ev.Event], node: str = "") -> list[str]:
    facts, out = NodeFacts(), []
    for seq, e in enumerate(events, 1):
        facts.apply(seq, e)
        msg = render(e, facts, node)
        if msg is not None:
            out.append(msg.text)
    return out


@pytest.fixture
def api() -> Iterator[FakeBotApi]:
    with running(TOKEN) as server:
        yield server


def config(api_url: str, **kw: object) -> NotifyConfig:
    base = dict(
        token=Secret(TOKEN),
        chat_ids=(11, -22),
        api_url=api_url,
        request_timeout_s=2.0,
        min_interval_s=1.0,
    )
    base.update(kw)
    return NotifyConfig(**base)  # type: ignore[arg-type]


def notifier(store: MemoryEventStore, cfg: NotifyConfig, path: Path, clock: FakeClock) -> Notifier:
    return Notifier(store, cfg, Outbox(path), TelegramClient.from_config(cfg), clock)


def drive(n: Notifier, clock: FakeClock, seconds: float) -> None:
    end = clock.now() + seconds
    while clock.now() < end:
        wake = n.step()
        clock.sleep(1.0 if wake is None else max(0.01, min(wake - clock.now(), 30.0)))


def test_texts_arrive_as_rendered_in_html_mode(api: FakeBotApi, tmp_path: Path) -> None:
    events = run_events("r1") + run_events("r2", ok=False)
    store = MemoryEventStore()
    store.append(events)
    clock = FakeClock(T0)
    n = notifier(store, config(api.base_url), tmp_path / "n.db", clock)
    drive(n, clock, 10)
    assert api.sent(11) == expected_texts(events) == api.sent(-22)
    assert {c.params["parse_mode"] for c in api.calls_to("sendMessage")} == {"HTML"}


def test_429_retry_after_is_honoured(api: FakeBotApi, tmp_path: Path) -> None:
    store = MemoryEventStore()
    store.append(run_events("r1"))
    clock = FakeClock(T0)
    n = notifier(store, config(api.base_url, chat_ids=(11,)), tmp_path / "n.db", clock)
    api.fail("429", "sendMessage", retry_after=17)
    n.step()
    assert api.sent() == [] and n.outbox.pending()[0].next_at == clock.now() + 17
    clock.advance(16.5)
    n.step()
    assert len(api.calls_to("sendMessage", answered=None)) == 1
    clock.advance(0.5)
    n.step()
    assert len(api.sent()) == 1


def test_500s_are_retried_with_backoff(api: FakeBotApi, tmp_path: Path) -> None:
    store = MemoryEventStore()
    store.append(run_events("r1"))
    clock = FakeClock(T0)
    n = notifier(store, config(api.base_url, chat_ids=(11,)), tmp_path / "n.db", clock)
    api.fail("500", "sendMessage", times=3)
    drive(n, clock, 20)
    assert len(api.sent()) == 1
    assert [c.answered for c in api.calls_to("sendMessage", None)] == ["500"] * 3 + ["ok"]


def test_connection_refused_keeps_messages_until_the_server_is_back(
    api: FakeBotApi, tmp_path: Path
) -> None:
    dead = f"http://127.0.0.1:{free_port()}/bot"  # reserved, and nobody listens on it
    store = MemoryEventStore()
    store.append(run_events("r1"))
    clock = FakeClock(T0)
    n = notifier(store, config(dead, chat_ids=(11,)), tmp_path / "n.db", clock)
    drive(n, clock, 5)
    [msg] = n.outbox.pending()
    assert msg.attempts >= 2 and "NetworkError" in msg.last_error
    assert TOKEN not in msg.last_error
    n.sender = n.deliverer.sender = TelegramClient.from_config(config(api.base_url))
    drive(n, clock, 60)
    assert len(api.sent(11)) == 1 and n.outbox.counts()["sent"] == 1


def test_a_ten_minute_outage_loses_nothing(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    with running(TOKEN, outage=lambda: clock.now() < T0 + 600) as api:
        store = MemoryEventStore()
        n = notifier(store, config(api.base_url), tmp_path / "n.db", clock)
        all_events: list[ev.Event] = []
        for i in range(4):  # runs keep finishing during the outage
            batch = run_events(f"r{i}", ok=i % 2 == 0)
            store.append(batch)
            all_events += batch
            drive(n, clock, 150)
        drive(n, clock, 400)
        assert clock.now() > T0 + 900
        assert api.calls_to("sendMessage", answered="outage")
        assert api.sent(11) == expected_texts(all_events) == api.sent(-22)
        assert n.outbox.counts() == {"pending": 0, "sent": 8, "parked": 0}


def test_the_token_never_reaches_logs_or_errors(
    api: FakeBotApi,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = MemoryEventStore()
    store.append(run_events("r1", ok=False))
    clock = FakeClock(T0)
    with caplog.at_level(logging.DEBUG):
        n = notifier(store, config(api.base_url), tmp_path / "n.db", clock)
        api.fail("500", times=2)
        api.fail("400", "sendMessage")
        drive(n, clock, 10)
        rejected = TelegramClient(Secret(TOKEN), f"http://127.0.0.1:{api.port}/wrong", 2.0)
        with pytest.raises(Exception) as info:
            rejected.get_me()
        rejected.close()
    text = caplog.text + capsys.readouterr().err + str(info.value) + repr(info.value)
    text += "".join(m.last_error for m in n.outbox.parked())
    assert "Calling Bot API endpoint" in caplog.text  # PTB's own debug lines were captured
    assert TOKEN not in text and "TEST-token" not in text


def test_embedded_notifier_delivers_in_the_background_and_stops(
    api: FakeBotApi, tmp_path: Path
) -> None:
    store = MemoryEventStore()
    handle = start_embedded_notifier(
        store, config(api.base_url, chat_ids=(11,), poll_interval_s=0.05), home=tmp_path
    )
    store.append(run_events("r1"))
    wait_until(api.sent, timeout=30, interval=0.05, what="the message at the fake Telegram")
    handle.stop()
    assert len(api.sent()) == 1 and not handle.running


def test_draining_the_embedded_notifier_returns_once_the_logs_messages_are_sent(
    api: FakeBotApi, tmp_path: Path
) -> None:
    store = MemoryEventStore()
    # A pause far longer than the test: only drain()'s nudge gets the messages out.
    handle = start_embedded_notifier(
        store, config(api.base_url, chat_ids=(11,), poll_interval_s=600), home=tmp_path
    )
    try:
        store.append(run_events("r1") + run_events("r2", ok=False))
        assert handle.drain(timeout=60)
        assert len(api.sent(11)) == 2  # both outcomes were at Telegram when drain returned
        api.fail("500", "sendMessage", times=10**6)  # Telegram now refuses everything
        store.append(run_events("r3"))
        assert not handle.drain(timeout=1.0)  # bounded: the message waits in the outbox
    finally:
        handle.stop(timeout=30)
    assert not handle.running


def test_embedded_notifier_never_blocks_or_raises_when_telegram_is_down(tmp_path: Path) -> None:
    store = MemoryEventStore()
    with running(TOKEN) as api:
        api.fail("hang", times=100)
        # Telegram takes a request and never answers (within the test's bounds).
        handle = start_embedded_notifier(
            store, config(api.base_url, request_timeout_s=120, poll_interval_s=0.05), home=tmp_path
        )
        store.append(run_events("r0"))
        assert api.hanging.wait(30)  # the notifier's thread is now stuck inside one call
        calls = len(api.calls)
        for i in range(1, 20):
            store.append(run_events(f"r{i}"))
        # Every append returned while that one call was still unanswered: appends never
        # wait on Telegram (ordered by the fake server, not by a stopwatch).
        assert len(api.calls) == calls and not api.release.is_set() and handle.running
        api.release.set()
        handle.stop(timeout=60)
        assert not handle.running


def _spawn(home: Path, api: FakeBotApi) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "M27_HOME": str(home),
        "M27_TELEGRAM_TOKEN": TOKEN,
        "M27_TELEGRAM_CHAT_IDS": "11",
        "M27_TELEGRAM_API_URL": api.base_url,
        "M27_NODE_NAME": "lab1",
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "m27.cli", "notifier"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )


def test_notifier_killed_mid_delivery_resends_at_most_once(api: FakeBotApi, m27_home: Path) -> None:
    from m27.store.sqlite import open_store

    store = open_store(m27_home)
    events = run_events("r1") + run_events("r2", ok=False) + run_events("r3")
    store.append(events)
    api.fail("hang", "sendMessage")  # the first message hangs after the server got it
    first = _spawn(m27_home, api)
    try:
        assert api.hanging.wait(30), first.stdout.read() if first.stdout else ""
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
    finally:
        first.kill()
    api.release.set()
    second = _spawn(m27_home, api)
    try:
        wait_until(lambda: len(set(api.sent())) >= 3, timeout=60, interval=0.1, what="3 texts")
    finally:
        second.send_signal(signal.SIGTERM)
        out = second.communicate(timeout=20)[0].decode()
    expected = expected_texts(events, node="lab1")
    got = api.sent()
    assert set(got) == set(expected), out
    assert len(got) - len(expected) == 1  # the message in flight at the kill, and only it
    assert got.count(expected[0]) == 2
    assert second.returncode == 0, out
    assert TOKEN not in out
    store.close()
