"""The outbox and the deliverer on a fake clock: order, backoff, flood control, parking."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from m27.clock import FakeClock
from m27.notify.config import NotifyConfig, QuietHours, Secret
from m27.notify.delivery import Deliverer
from m27.notify.outbox import Draft, Outbox
from m27.notify.telegram import DeliveryError

CFG = NotifyConfig(token=Secret("t"), chat_ids=(1,), max_attempts=3, min_interval_s=1.0)


@dataclass
class FakeSender:
    clock: FakeClock
    sent: list[tuple[int, str]] = field(default_factory=list)
    script: list[DeliveryError] = field(default_factory=list)
    down: Callable[[], bool] = lambda: False

    def send(self, chat_id: int, text: str) -> int:
        if self.down():
            raise DeliveryError("sendMessage failed: NetworkError: Bad Gateway", transient=True)
        if self.script:
            raise self.script.pop(0)
        self.sent.append((chat_id, text))
        return len(self.sent)


def net() -> DeliveryError:
    return DeliveryError("NetworkError", transient=True)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(dt.datetime(2024, 5, 1, 12, tzinfo=dt.UTC).timestamp())


@pytest.fixture
def box(tmp_path: Path) -> Outbox:
    return Outbox(tmp_path / "notify.db")


def drain(d: Deliverer, clock: FakeClock, until: float) -> None:
    """Run the deliverer the way the notifier loop does, sleeping on the fake clock."""
    while clock.now() < until:
        wake = d.deliver_due()
        clock.sleep(1.0 if wake is None else max(0.001, min(wake - clock.now(), 30.0)))


def queue(
    box: Outbox,
    clock: FakeClock,
    *texts: str,
    chats: tuple[int, ...] = (1,),
    kind: str = "run_failed",
    start: int = 1,
) -> None:
    drafts = [Draft(start + i, kind, t) for i, t in enumerate(texts)]
    box.enqueue(drafts, chats, clock.now(), cursor=start + len(texts) - 1)


def test_enqueue_moves_the_cursor_and_is_idempotent(box: Outbox, clock: FakeClock) -> None:
    queue(box, clock, "a", "b", chats=(1, 2))
    queue(box, clock, "a", "b", chats=(1, 2))
    assert box.cursor() == 2 and box.counts()["pending"] == 4


def test_messages_go_out_in_order_one_per_interval_per_chat(box: Outbox, clock: FakeClock) -> None:
    sender = FakeSender(clock)
    for seq, kind in enumerate(("run_failed", "gpu_lost", "run_failed"), start=1):
        queue(box, clock, str(seq), chats=(1, -5), kind=kind, start=seq)  # kinds not joined
    d = Deliverer(box, sender, CFG, clock)
    start = clock.now()
    drain(d, clock, start + 20)
    assert [t for c, t in sender.sent if c == 1] == ["1", "2", "3"]
    assert [t for c, t in sender.sent if c == -5] == ["1", "2", "3"]
    assert box.counts() == {"pending": 0, "sent": 6, "parked": 0}


def test_rate_limit_spaces_sends_to_one_chat(box: Outbox, clock: FakeClock) -> None:
    sender = FakeSender(clock)
    queue(box, clock, "1")
    queue(box, clock, "2", kind="gpu_lost", start=2)
    d = Deliverer(box, sender, CFG, clock)
    d.deliver_due()
    assert len(sender.sent) == 1
    clock.advance(0.5)
    d.deliver_due()
    assert len(sender.sent) == 1
    clock.advance(0.6)
    d.deliver_due()
    assert len(sender.sent) == 2


def test_messages_of_one_kind_queued_together_go_out_as_one(box: Outbox, clock: FakeClock) -> None:
    """40 replicas restored at once: one buzz, not 40 over 40 seconds. Only messages of
    one kind right behind each other join, in order, as many as fit one message."""
    sender = FakeSender(clock)
    restored = [f"restored md.{i}" for i in range(40)]
    queue(box, clock, *restored, kind="checkpoint_restored")
    queue(box, clock, "run failed", kind="run_failed", start=41)
    queue(box, clock, "restored late", kind="checkpoint_restored", start=42)
    long = ["x" * 1500, "y" * 1500, "z" * 1500]
    queue(box, clock, *long, kind="step_retried", start=43)
    d = Deliverer(box, sender, CFG, clock)
    drain(d, clock, clock.now() + 20)
    assert [t for _, t in sender.sent] == [
        "\n\n".join(restored),
        "run failed",
        "restored late",
        long[0] + "\n\n" + long[1],  # a third would pass Telegram's length
        long[2],
    ]
    assert box.counts() == {"pending": 0, "sent": 45, "parked": 0}
    assert d.stats.sent == 45


def test_a_joined_send_that_fails_leaves_every_message_queued(
    box: Outbox, clock: FakeClock
) -> None:
    sender = FakeSender(clock, script=[net()])
    queue(box, clock, "a", "b", kind="checkpoint_restored")
    d = Deliverer(box, sender, CFG, clock)
    d.deliver_due()
    assert sender.sent == [] and [m.text for m in box.pending()] == ["a", "b"]
    drain(d, clock, clock.now() + 10)
    assert sender.sent == [(1, "a\n\nb")]


def test_retry_after_is_obeyed_and_not_counted_as_a_failure(box: Outbox, clock: FakeClock) -> None:
    sender = FakeSender(clock, script=[DeliveryError("429", transient=True, retry_after=30)] * 5)
    queue(box, clock, "x")
    d = Deliverer(box, sender, CFG, clock)
    t0 = clock.now()
    wake = d.deliver_due()
    assert wake == t0 + 30 and box.pending()[0].attempts == 0
    clock.advance(29)
    sender.script.clear()
    d.deliver_due()
    assert sender.sent == []
    clock.advance(1)
    d.deliver_due()
    assert sender.sent == [(1, "x")]


def test_network_errors_back_off_exponentially(box: Outbox, clock: FakeClock) -> None:
    sender = FakeSender(clock, script=[net(), net()])
    queue(box, clock, "x")
    d = Deliverer(box, sender, replace(CFG, max_attempts=5), clock)
    t0 = clock.now()
    assert d.deliver_due() == t0 + 1
    clock.advance(1)
    assert d.deliver_due() == t0 + 1 + 2
    clock.advance(2)
    d.deliver_due()
    assert sender.sent == [(1, "x")]
    assert d.backoff(10) == 60.0


def test_after_max_attempts_a_message_is_parked_reported_and_not_dropped(
    box: Outbox, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    sender = FakeSender(clock, down=lambda: True)
    queue(box, clock, "first", "second")
    d = Deliverer(box, sender, CFG, clock)
    with caplog.at_level(logging.WARNING, "m27.notify"):
        drain(d, clock, clock.now() + 30)
    parked = box.parked()
    assert [m.text for m in parked] == ["first", "second"]
    assert all(m.attempts == 3 and not m.permanent for m in parked)
    assert "parked after 3 attempt(s)" in caplog.text


def test_parked_messages_return_when_telegram_answers_again(box: Outbox, clock: FakeClock) -> None:
    outage_end = clock.now() + 600
    sender = FakeSender(clock, down=lambda: clock.now() < outage_end)
    queue(box, clock, "a", "b")
    d = Deliverer(box, sender, replace(CFG, parked_retry_s=120), clock)
    drain(d, clock, outage_end + 200)
    assert [t for _, t in sender.sent] == ["a", "b"]
    assert box.counts() == {"pending": 0, "sent": 2, "parked": 0}


def test_a_permanent_refusal_parks_at_once_and_waits_for_retry(
    box: Outbox, clock: FakeClock
) -> None:
    sender = FakeSender(clock, script=[DeliveryError("Forbidden", transient=False)])
    queue(box, clock, "blocked", "next")
    d = Deliverer(box, sender, CFG, clock)
    drain(d, clock, clock.now() + 1000)
    assert [t for _, t in sender.sent] == ["next"]
    assert [(m.text, m.permanent) for m in box.parked()] == [("blocked", True)]
    assert box.unpark(clock.now(), include_permanent=True) == 1
    d.deliver_due()
    assert [t for _, t in sender.sent] == ["next", "blocked"]


def test_quiet_hours_hold_success_but_not_failures(box: Outbox, clock: FakeClock) -> None:
    cfg = replace(CFG, quiet=QuietHours.parse("11:00-13:00", dt.UTC))
    sender = FakeSender(clock)
    queue(box, clock, "done", kind="run_succeeded")
    queue(box, clock, "boom", kind="run_failed", start=2)
    d = Deliverer(box, sender, cfg, clock)
    wake = d.deliver_due()
    assert sender.sent == [(1, "boom")]
    assert wake == dt.datetime(2024, 5, 1, 13, tzinfo=dt.UTC).timestamp()
    drain(d, clock, clock.now() + 3599)
    assert [t for _, t in sender.sent] == ["boom"]
    drain(d, clock, clock.now() + 5)
    assert [t for _, t in sender.sent] == ["boom", "done"]


def test_outbox_survives_reopening(tmp_path: Path, clock: FakeClock) -> None:
    box = Outbox(tmp_path / "n.db")
    queue(box, clock, "a")
    box.close()
    again = Outbox(tmp_path / "n.db")
    assert again.cursor() == 1 and [m.text for m in again.pending()] == ["a"]


def test_prune_forgets_only_old_sent_messages(box: Outbox, clock: FakeClock) -> None:
    queue(box, clock, "a", "b")
    first = box.pending()[0]
    box.mark_sent([first.id], clock.now() - 100)
    assert box.prune_sent(clock.now() - 50) == 1
    assert box.counts() == {"pending": 1, "sent": 0, "parked": 0}
