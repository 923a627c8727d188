"""The notifier: follow the event log from a durable cursor and feed the outbox.

One loop, two halves: *ingest* reads new events after the cursor, folds them into the run
facts, renders messages and stores them with the new cursor in one transaction (see
:mod:`m27.notify.outbox` for why that is at-least-once); *deliver* sends what is due.
Telegram being slow or down only delays the deliverer; ingestion, and so the run that
writes the log, never waits on it.

Only one notifier per node delivers: it holds ``$M27_HOME/notify.lock`` (an flock, freed
by the kernel even after ``kill -9``). An embedded notifier that finds the lock taken,
because ``m27 notifier`` runs as a service, stays idle.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from m27.clock import Clock, SystemClock
from m27.locks import NOTIFY_LOCK, NodeLock
from m27.notify.config import NotifyConfig
from m27.notify.delivery import Deliverer, Sender
from m27.notify.facts import NodeFacts
from m27.notify.messages import render
from m27.notify.outbox import PENDING, Draft, Outbox, outbox_path
from m27.notify.telegram import TelegramClient, scrub
from m27.paths import m27_home
from m27.store import EventStore

log = logging.getLogger("m27.notify")

CURSOR = "notifier"


@dataclass
class Notifier:
    store: EventStore
    config: NotifyConfig
    outbox: Outbox
    sender: Sender
    clock: Clock = field(default_factory=SystemClock)
    node: str = ""
    batch: int = 500
    facts: NodeFacts = field(default_factory=NodeFacts)
    deliverer: Deliverer = field(init=False)
    _caught_up: bool = False

    def __post_init__(self) -> None:
        self.deliverer = Deliverer(self.outbox, self.sender, self.config, self.clock)

    def catch_up(self) -> None:
        """Rebuild the run facts from the events already handled (before the cursor)."""
        cursor = self.outbox.cursor(CURSOR)
        after = 0
        while after < cursor:
            chunk = self.store.read(after, min(self.batch, cursor - after))
            if not chunk:
                break
            for rec in chunk:
                self.facts.apply(rec.seq, rec.event)
            after = chunk[-1].seq
        self._caught_up = True

    def ingest(self) -> int:
        """Handle the next batch of events; returns how many were read."""
        if not self._caught_up:
            self.catch_up()
        cursor = self.outbox.cursor(CURSOR)
        records = self.store.read(cursor, self.batch)
        if not records:
            return 0
        drafts: list[Draft] = []
        for rec in records:
            self.facts.apply(rec.seq, rec.event)
            try:
                msg = render(rec.event, self.facts, self.node)
            except Exception as exc:  # a rendering bug must not stop every later message
                log.error("cannot render event %s (%s): %s", rec.seq, rec.event.kind, exc)
                continue
            if msg is not None and self.config.wants(msg.kind):
                drafts.append(Draft(rec.seq, msg.kind, msg.text))
        self.outbox.enqueue(drafts, self.config.chat_ids, self.clock.now(), cursor=records[-1].seq)
        return len(records)

    def step(self) -> float | None:
        """Ingest everything new, deliver what is due; returns when delivery wants to run."""
        while self.ingest() == self.batch:
            pass
        return self.deliverer.deliver_due()

    def close(self) -> None:
        """Close the outbox and the Telegram client (a test sender may have no close)."""
        self.outbox.close()
        close = getattr(self.sender, "close", None)
        if close is not None:
            close()

    def run(self, stop: threading.Event, progress: Progress | None = None) -> None:
        """Loop until `stop` is set; errors are logged and retried, never raised.

        With `progress`, each pass reports how far it got, and a pause ends early when
        someone waits for that (:meth:`NotifierHandle.drain`).
        """
        real = isinstance(self.clock, SystemClock)
        while not stop.is_set():
            try:
                wake = self.step()
                if progress is not None:
                    progress.passed(self.outbox.cursor(CURSOR), self.outbox.counts()[PENDING])
            except Exception as exc:  # store or Telegram trouble: log, wait, try again
                log.error("notifier: %s; retrying", scrub(f"{type(exc).__name__}: {exc}"))
                wake = None
            now = self.clock.now()
            wait = self.config.poll_interval_s
            if wake is not None:
                wait = max(0.0, min(wait, wake - now))
            if not real:
                self.clock.sleep(wait)
            elif progress is not None:
                progress.nudge.wait(wait)
                progress.nudge.clear()
            else:
                stop.wait(wait)


def open_notifier(
    store: EventStore,
    config: NotifyConfig,
    *,
    home: Path | None = None,
    clock: Clock | None = None,
    sender: Sender | None = None,
) -> Notifier:
    """A notifier on the node's outbox and a real Telegram client (unless `sender`)."""
    home = home or m27_home()
    client: Sender = sender if sender is not None else TelegramClient.from_config(config)
    return Notifier(
        store,
        config,
        Outbox(outbox_path(home)),
        client,
        clock or SystemClock(),
        node=os.environ.get("M27_NODE_NAME") or socket.gethostname(),
    )


class Progress:
    """How far an embedded notifier has got: told by its thread after every pass,
    awaited by :meth:`NotifierHandle.drain`."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.nudge = threading.Event()  # cuts the notifier's pause short
        self._cond = threading.Condition()
        self._cursor = -1
        self._pending = 0

    def passed(self, cursor: int, pending: int) -> None:
        with self._cond:
            self._cursor, self._pending = cursor, pending
            self._cond.notify_all()

    def wait_drained(self, timeout: float, alive: Callable[[], bool]) -> bool:
        target = self.store.last_seq()
        self.nudge.set()
        with self._cond:
            return self._cond.wait_for(
                lambda: (self._cursor >= target and self._pending == 0) or not alive(), timeout
            )


class NotifierHandle:
    """What `start_embedded_notifier` returns: a thread you can drain and stop."""

    def __init__(
        self,
        thread: threading.Thread | None,
        stop: threading.Event,
        progress: Progress | None = None,
    ) -> None:
        self.thread = thread
        self._stop = stop
        self.progress = progress

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def drain(self, timeout: float) -> bool:
        """Wait until every event appended so far is read and its messages are sent.

        True once drained (or when no notifier runs here); False after `timeout` seconds,
        when Telegram is slow or down: the messages stay in the durable outbox for the
        next notifier. `m27 run` calls this before it stops its notifier, so the run's
        outcome goes out with it, instead of a fixed pause that is too long or too short.
        """
        if self.progress is None or not self.running:
            return True
        return self.progress.wait_drained(timeout, lambda: self.running)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self.progress is not None:
            self.progress.nudge.set()
        if self.thread is not None:
            self.thread.join(timeout)


def start_embedded(
    what: str,
    config: NotifyConfig,
    home: Path | None,
    lock_name: str,
    serve: Callable[[Path, threading.Event], None],
    logger: logging.Logger = log,
) -> NotifierHandle:
    """Run `serve(home, stop)` in a daemon thread holding the node's `lock_name`; never
    raises into the caller (the run goes on whatever happens to Telegram).

    Idle when Telegram is not configured, or when another process (the ``m27 notifier``
    or ``m27 bot`` service) holds the lock: one of `what` per node.
    """
    stop = threading.Event()
    if not config.enabled:
        return NotifierHandle(None, stop)
    where = home or m27_home()

    def main() -> None:
        lock = NodeLock(where, lock_name)
        try:
            if not lock.acquire():
                logger.info("another %s holds %s; the embedded one stays idle", what, lock.path)
                return
            serve(where, stop)
        except Exception as exc:
            logger.error("embedded %s stopped: %s", what, scrub(f"{type(exc).__name__}: {exc}"))
        finally:
            lock.release()

    thread = threading.Thread(target=main, name=f"m27-{what}", daemon=True)
    thread.start()
    return NotifierHandle(thread, stop)


def start_embedded_notifier(
    store: EventStore,
    config: NotifyConfig,
    *,
    home: Path | None = None,
    clock: Clock | None = None,
) -> NotifierHandle:
    """Run the notifier in a daemon thread of this process (see :func:`start_embedded`).

    `store` is used from the notifier's thread (the SQLite and memory stores are
    thread-safe).
    """

    progress = Progress(store)

    def serve(where: Path, stop: threading.Event) -> None:
        notifier = open_notifier(store, config, home=where, clock=clock)
        try:
            notifier.run(stop, progress)
        finally:
            notifier.close()

    handle = start_embedded("notifier", config, home, NOTIFY_LOCK, serve)
    if handle.thread is not None:
        handle.progress = progress
    return handle
