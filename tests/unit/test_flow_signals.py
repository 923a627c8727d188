"""The flow's own handling of SIGTERM and SIGHUP (flows._run.cancel_on_signals): each asks
the run to cancel through the log, from the relay's thread; an ignored one stays ignored;
the previous handlers come back when the flow ends."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from typing import Any, cast

import pytest

from flows._run import _Run, cancel_on_signals
from m27.events import CancelRequested, Event
from tests.waiting import wait_until


class _Recorder:
    run_id = "r1"

    def __init__(self) -> None:
        self.events: list[Event] = []

    def append(self, *events: Event) -> None:
        self.events.extend(events)


@pytest.fixture
def handlers() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    yield
    for s, h in saved.items():
        signal.signal(s, cast(Any, h))


def test_sigterm_asks_the_run_to_cancel_and_the_old_handler_comes_back(handlers: None) -> None:
    before = signal.getsignal(signal.SIGTERM)
    run = _Recorder()
    restore = cancel_on_signals(cast(_Run, run))
    os.kill(os.getpid(), signal.SIGTERM)
    wait_until(lambda: run.events, timeout=10, what="the cancel request")
    restore()
    (asked,) = run.events
    assert isinstance(asked, CancelRequested)
    assert (asked.run_id, asked.by) == ("r1", "SIGTERM")
    assert signal.getsignal(signal.SIGTERM) == before


def test_an_ignored_hup_stays_ignored(handlers: None) -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    restore = cancel_on_signals(cast(_Run, _Recorder()))
    try:
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
    finally:
        restore()


def test_outside_the_main_thread_nothing_is_installed(handlers: None) -> None:
    before = signal.getsignal(signal.SIGTERM)
    done: list[object] = []
    worker = threading.Thread(target=lambda: done.append(cancel_on_signals(cast(_Run, None))))
    worker.start()
    worker.join(10)
    assert done and signal.getsignal(signal.SIGTERM) == before
