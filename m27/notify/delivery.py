"""Sending what the outbox holds: order per chat, backoff, flood control, parking.

Rules, each for a reason:

- Per chat, messages go out in the order they were queued: a phone that reads "run
  failed" then "run succeeded" for a rerun must not see them swapped. Only the oldest
  message of a chat that is not held by quiet hours is tried.
- A chat gets at most one message per ``min_interval_s`` (3 s for groups, whose ids are
  negative), below Telegram's documented limits, so a burst of events does not earn a 429.
- Messages of one kind queued one after another for a chat go out as one (as many as fit
  Telegram's length): a resume of 40 replicas restores 40 checkpoints at once, and the
  phone buzzed 40 times over 40 seconds.
- ``RetryAfter`` from Telegram is obeyed exactly and is not counted as a failure.
- Network errors, timeouts and 5xx are retried with exponential backoff (base 1 s,
  capped at 60 s, no jitter: one notifier per node). After ``max_attempts`` failures the
  message is parked and logged as a warning. A parked message is never dropped: every
  ``parked_retry_s`` the oldest transiently-parked one is tried again, and the first
  successful send returns all transiently-parked messages to the queue.
- A permanent refusal (bad request, bot blocked, bad token) parks at once; only
  ``m27 notify retry`` puts those back.

All times come from the injected clock, so a ten-minute outage is simulated in
milliseconds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

from m27.clock import Clock
from m27.notify.config import NotifyConfig
from m27.notify.messages import MAX_TEXT
from m27.notify.outbox import Outbox, OutboxMessage
from m27.notify.telegram import DeliveryError, scrub

log = logging.getLogger("m27.notify")
#: between the messages sent as one
_BETWEEN = "\n\n"


class Sender(Protocol):
    def send(self, chat_id: int, text: str) -> int: ...


@dataclass
class DeliveryStats:
    sent: int = 0
    failed: int = 0
    parked: int = 0
    deferred: int = 0


@dataclass
class Deliverer:
    outbox: Outbox
    sender: Sender
    config: NotifyConfig
    clock: Clock
    stats: DeliveryStats = field(default_factory=DeliveryStats)
    _chat_ready_at: dict[int, float] = field(default_factory=dict)
    _next_parked_probe: float = 0.0

    def _interval(self, chat_id: int) -> float:
        return self.config.min_interval_s if chat_id > 0 else max(self.config.min_interval_s, 3.0)

    def backoff(self, attempts: int) -> float:
        """Seconds to wait after the `attempts`-th consecutive failure."""
        return float(
            min(self.config.backoff_max_s, self.config.backoff_base_s * 2 ** (attempts - 1))
        )

    def _candidates(self, now: float) -> tuple[list[OutboxMessage], float | None]:
        """The head message of each chat that may go now, and the next time one may."""
        heads: dict[int, OutboxMessage] = {}
        wake: float | None = None
        for msg in self.outbox.pending():
            if msg.chat_id in heads:
                continue
            held_until = self.config.held(msg.kind, now)
            if held_until is not None:
                if msg.next_at < held_until:
                    self.outbox.defer(msg.id, held_until, "held by quiet hours")
                    self.stats.deferred += 1
                wake = held_until if wake is None else min(wake, held_until)
                continue
            heads[msg.chat_id] = msg
        ready: list[OutboxMessage] = []
        for chat, msg in heads.items():
            due = max(msg.next_at, self._chat_ready_at.get(chat, 0.0))
            if due <= now:
                ready.append(msg)
            else:
                wake = due if wake is None else min(wake, due)
        return ready, wake

    def deliver_due(self) -> float | None:
        """Try every message that is due now; returns when the next one will be due."""
        now = self.clock.now()
        ready, wake = self._candidates(now)
        for msg in ready:
            self._attempt(msg, now)
        probe = self._probe_parked(now)
        if ready:
            again, later = self._candidates(self.clock.now())
            wake = self.clock.now() if again else later
        if probe is not None:
            wake = probe if wake is None else min(wake, probe)
        return wake

    def _batch(self, head: OutboxMessage, now: float) -> list[OutboxMessage]:
        """`head` and the messages of its kind queued right behind it for its chat that
        may go now, as many as fit one Telegram message together."""
        batch = [head]
        size = len(head.text)
        for msg in self.outbox.pending():
            if msg.chat_id != head.chat_id or msg.id <= head.id:
                continue
            size += len(_BETWEEN) + len(msg.text)
            if (
                msg.kind != head.kind
                or msg.next_at > now
                or size > MAX_TEXT
                or self.config.held(msg.kind, now) is not None
            ):
                break
            batch.append(msg)
        return batch

    def _attempt(self, msg: OutboxMessage, now: float) -> bool:
        batch = self._batch(msg, now)
        try:
            self.sender.send(msg.chat_id, _BETWEEN.join(m.text for m in batch))
        except DeliveryError as exc:
            self._failed(msg, exc, now)  # the head's: the others wait behind it as they were
            return False
        # Recorded before anything else happens: the crash window for a duplicate.
        self.outbox.mark_sent([m.id for m in batch], self.clock.now())
        self.stats.sent += len(batch)
        self._chat_ready_at[msg.chat_id] = now + self._interval(msg.chat_id)
        if self.outbox.unpark(now):
            log.info("Telegram answers again: parked messages are back in the queue")
        return True

    def _failed(self, msg: OutboxMessage, exc: DeliveryError, now: float) -> None:
        error = scrub(str(exc))
        if exc.retry_after is not None:
            until = now + exc.retry_after
            self._chat_ready_at[msg.chat_id] = until
            self.outbox.defer(msg.id, until, error)
            self.stats.deferred += 1
            log.info(
                "Telegram flood control for chat %s: waiting %gs", msg.chat_id, exc.retry_after
            )
            return
        attempts = msg.attempts + 1
        self.stats.failed += 1
        if not exc.transient or attempts >= self.config.max_attempts:
            self.outbox.park(msg.id, attempts, error, permanent=not exc.transient)
            self.stats.parked += 1
            how = (
                "it is retried every "
                f"{self.config.parked_retry_s:g}s and when Telegram answers again"
                if exc.transient
                else "run `m27 notify retry` once the cause is fixed"
            )
            log.warning(
                "Telegram message %s (%s) to chat %s parked after %d attempt(s): %s; %s",
                msg.id,
                msg.kind,
                msg.chat_id,
                attempts,
                error,
                how,
            )
            return
        delay = self.backoff(attempts)
        self.outbox.mark_failed(msg.id, attempts, now + delay, error)
        log.info(
            "Telegram message %s to chat %s failed (attempt %d), retrying in %gs: %s",
            msg.id,
            msg.chat_id,
            attempts,
            delay,
            error,
        )

    def _probe_parked(self, now: float) -> float | None:
        """Try the oldest transiently-parked message now and then; None when none is parked."""
        parked = [m for m in self.outbox.parked() if not m.permanent]
        if not parked:
            return None
        if self._next_parked_probe == 0.0:
            self._next_parked_probe = now + self.config.parked_retry_s
        if now < self._next_parked_probe:
            return self._next_parked_probe
        self._next_parked_probe = now + self.config.parked_retry_s
        msg = parked[0]
        if self.config.held(msg.kind, now) is not None:
            return self._next_parked_probe
        try:
            self.sender.send(msg.chat_id, msg.text)
        except DeliveryError as exc:
            log.info("parked Telegram message %s still fails: %s", msg.id, scrub(str(exc)))
            return self._next_parked_probe
        self.outbox.mark_sent([msg.id], self.clock.now())
        self.stats.sent += 1
        self._chat_ready_at[msg.chat_id] = now + self._interval(msg.chat_id)
        self.outbox.unpark(now)
        return now
