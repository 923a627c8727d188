"""`m27 bot` commands, round trip through the real PTB client and a local Bot API server."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from m27 import events as ev
from m27.clock import FakeClock
from m27.notify.bot import CommandBot, start_embedded_bot
from m27.notify.config import NotifyConfig, Secret
from m27.notify.telegram import TelegramClient
from m27.store.memory import MemoryEventStore
from tests.integration.fake_bot_api import FakeBotApi, running
from tests.waiting import wait_until

pytestmark = pytest.mark.service

TOKEN = "555:bot-token-secret"
CHAT = 31
T0 = 1_700_000_000.0


@pytest.fixture
def api() -> Iterator[FakeBotApi]:
    with running(TOKEN) as server:
        yield server


@pytest.fixture
def store() -> MemoryEventStore:
    s = MemoryEventStore()
    s.append(
        [
            ev.RunSubmitted(T0, "md-1", "md", "md.yaml", ("prep", "sim")),
            ev.StepQueued(T0, "md-1", "prep", "cpu"),
            ev.StepQueued(T0, "md-1", "sim", "gpu", priority=5),
            ev.StepStarted(T0, "md-1", "prep", 1, 9, 9, ("x",)),
            ev.RunSubmitted(T0, "old-1", "qc", "qc.yaml", ("a",)),
            ev.StepStarted(T0, "old-1", "a", 1, 9, 9, ("x",)),
            ev.StepSucceeded(T0, "old-1", "a", 1, 5.0),
            ev.RunSucceeded(T0, "old-1", 5.0),
        ]
    )
    return s


@pytest.fixture
def bot(api: FakeBotApi, store: MemoryEventStore) -> Iterator[CommandBot]:
    cfg = NotifyConfig(
        token=Secret(TOKEN), chat_ids=(CHAT,), api_url=api.base_url, request_timeout_s=2.0
    )
    client = TelegramClient.from_config(cfg)
    yield CommandBot(store, cfg, client, FakeClock(T0), poll_timeout=0)
    client.close()


def ask(api: FakeBotApi, bot: CommandBot, text: str, chat: int = CHAT) -> list[str]:
    before = len(api.sent())
    api.push_message(chat, text)
    assert bot.poll_once() == 1
    return api.sent()[before:]


def test_status(api: FakeBotApi, bot: CommandBot) -> None:
    [reply] = ask(api, bot, "/status")
    assert "runs: 1 running · 1 succeeded" in reply and "steps: 1 running · 1 queued" in reply


def test_status_of_a_run_lists_its_steps_and_what_a_running_one_printed_last(
    api: FakeBotApi, bot: CommandBot, store: MemoryEventStore, tmp_path: Path
) -> None:
    """A simulation of days, from the phone: how far it got and whether it still prints."""
    log = tmp_path / "sim.log"
    log.write_text("=== attempt 1: gmx mdrun ===\nstep 78000, will finish Mon Dec  7 23:38:48\n")
    os.utime(log, (T0 + 100, T0 + 100))
    store.append(
        [
            ev.StepSucceeded(T0 + 10, "md-1", "prep", 1, 10.0),
            ev.StepStarted(T0 + 20, "md-1", "sim", 1, 9, 9, ("x",), (0,), log_path=str(log)),
        ]
    )
    bot.clock.advance(125)  # type: ignore[attr-defined]
    [reply] = ask(api, bot, "/status md-1")
    assert reply.splitlines() == [
        "▶ <code>md-1</code> md · 1/2 steps · running",
        "✅ <b>prep</b> succeeded",
        "▶ <b>sim</b> running · GPU 0 · 1m45s",
        "    <code>step 78000, will finish Mon Dec  7 23:38:48</code> (25.0s ago)",
    ]
    [reply] = ask(api, bot, "/status nope")
    assert reply == "No run <code>nope</code> on this node."


def test_status_and_runs_count_crashed_runs(
    api: FakeBotApi, bot: CommandBot, store: MemoryEventStore
) -> None:
    """A run killed with kill -9 was missing from /status's counts (and had no icon)."""
    store.append(
        [
            ev.RunSubmitted(T0, "dead-1", "md", "md.yaml", ("sim",)),
            ev.RunCrashed(T0, "dead-1", "run process 4242 is gone"),
        ]
    )
    [reply] = ask(api, bot, "/status")
    assert "runs: 1 running · 1 succeeded · 1 crashed" in reply
    [reply] = ask(api, bot, "/runs")
    assert "💥 <code>dead-1</code> md · 0/1 steps · crashed" in reply


def test_runs_lists_the_newest_first(api: FakeBotApi, bot: CommandBot) -> None:
    [reply] = ask(api, bot, "/runs@m27_test_bot")
    lines = reply.splitlines()
    assert "old-1" in lines[1] and "succeeded" in lines[1]
    assert "md-1" in lines[2] and "0/2 steps · running" in lines[2]


def test_queue_shows_running_then_queued_by_priority(api: FakeBotApi, bot: CommandBot) -> None:
    [reply] = ask(api, bot, "/queue")
    assert reply.splitlines()[1:] == [
        "▶ <code>md-1</code>/<b>prep</b> cpu · prio 0",
        "⏳ <code>md-1</code>/<b>sim</b> gpu · prio 5",
    ]


def test_gpus_uses_the_node_backend(
    api: FakeBotApi, bot: CommandBot, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("M27_GPUS", "sim:2")
    [reply] = ask(api, bot, "/gpus")
    assert "backend: sim" in reply and "GPU 0:" in reply and "GPU 1:" in reply


def test_gpus_says_unavailable_when_detection_fails(api: FakeBotApi, bot: CommandBot) -> None:
    bot.gpu_info = lambda: "GPU info unavailable"
    [reply] = ask(api, bot, "/gpus")
    assert "GPU info unavailable" in reply


def test_cancel_asks_first_then_records_the_request(
    api: FakeBotApi, bot: CommandBot, store: MemoryEventStore
) -> None:
    [question] = ask(api, bot, "/cancel md-1")
    assert "Cancel run <code>md-1</code>?" in question
    call = api.calls_to("sendMessage")[-1]
    buttons = json.loads(call.params["reply_markup"])["inline_keyboard"][0]
    assert [b["callback_data"] for b in buttons] == ["cancel:md-1", "keep"]
    assert not any(isinstance(r.event, ev.CancelRequested) for r in store.read())

    api.push_callback(CHAT, "cancel:md-1", message_id=77)
    bot.poll_once()
    [req] = [r.event for r in store.read() if isinstance(r.event, ev.CancelRequested)]
    assert req.run_id == "md-1" and req.by == f"telegram:{CHAT}"
    assert len(api.calls_to("answerCallbackQuery")) == 1
    [edit] = api.calls_to("editMessageText")
    assert edit.params["message_id"] == "77" and "Cancel requested" in edit.params["text"]


def test_cancel_of_one_step_asks_first_then_records_it_for_that_step(
    api: FakeBotApi, bot: CommandBot, store: MemoryEventStore
) -> None:
    [question] = ask(api, bot, "/cancel md-1 sim")
    assert question.startswith("Cancel <code>md-1</code>/<b>sim</b>? (the run goes on")
    call = api.calls_to("sendMessage")[-1]
    buttons = json.loads(call.params["reply_markup"])["inline_keyboard"][0]
    assert [b["callback_data"] for b in buttons] == ["cancel:md-1:sim", "keep"]
    [typo] = ask(api, bot, "/cancel md-1 simm")
    assert typo == "Run <code>md-1</code> has no step <b>simm</b>."

    api.push_callback(CHAT, "cancel:md-1:sim", message_id=78)
    bot.poll_once()
    [req] = [r.event for r in store.read() if isinstance(r.event, ev.CancelRequested)]
    assert (req.run_id, req.step, req.by) == ("md-1", "sim", f"telegram:{CHAT}")
    [edit] = api.calls_to("editMessageText")
    assert "Cancel requested for <code>md-1</code>/<b>sim</b>" in edit.params["text"]
    # the run itself is not asked to stop
    assert bot.facts.runs["md-1"].cancel_requested_by == ""


def test_keep_running_button_cancels_nothing(
    api: FakeBotApi, bot: CommandBot, store: MemoryEventStore
) -> None:
    ask(api, bot, "/cancel md-1")
    api.push_callback(CHAT, "keep", message_id=78)
    bot.poll_once()
    assert not any(isinstance(r.event, ev.CancelRequested) for r in store.read())
    assert api.calls_to("editMessageText")[0].params["text"] == "Kept running."


def test_cancel_of_unknown_or_finished_runs_explains(api: FakeBotApi, bot: CommandBot) -> None:
    assert "No run <code>nope</code>" in ask(api, bot, "/cancel nope")[0]
    assert "already succeeded" in ask(api, bot, "/cancel old-1")[0]
    assert "Usage: /cancel RUN" in ask(api, bot, "/cancel")[0]


def test_bump_appends_a_priority_event(
    api: FakeBotApi, bot: CommandBot, store: MemoryEventStore
) -> None:
    [reply] = ask(api, bot, "/bump md-1 sim 10")
    assert "+10 → 15" in reply
    [bump] = [r.event for r in store.read() if isinstance(r.event, ev.PriorityBumped)]
    assert (bump.run_id, bump.step, bump.delta) == ("md-1", "sim", 10)
    assert "no step" in ask(api, bot, "/bump md-1 nosuch 1")[0]
    assert "must be an integer" in ask(api, bot, "/bump md-1 sim lots")[0]
    assert (
        "N must be from -1,000,000,000 to 1,000,000,000"
        in ask(api, bot, "/bump md-1 sim 100000000000000000000")[0]
    )
    assert len([r for r in store.read() if isinstance(r.event, ev.PriorityBumped)]) == 1
    before = store.last_seq()
    assert "is succeeded: nothing to bump" in ask(api, bot, "/bump old-1 a 3")[0]
    assert store.last_seq() == before


def test_resume_replies_with_the_command_or_uses_the_handler(
    api: FakeBotApi, bot: CommandBot
) -> None:
    assert "<code>m27 run --resume old-1 --detach</code>" in ask(api, bot, "/resume old-1")[0]
    bot.resume_handler = lambda run: f"started resume of {run} as <new>"
    assert "started resume of old-1 as &lt;new&gt;" in ask(api, bot, "/resume old-1")[0]
    assert "is still running; /cancel it first" in ask(api, bot, "/resume md-1")[0]
    # a prefix (or `last`) names the run as `m27 run --resume` reads it
    assert "is still running; /cancel it first" in ask(api, bot, "/resume md")[0]
    assert "started resume of old-1 as" in ask(api, bot, "/resume old")[0]


def test_unknown_text_gets_help(api: FakeBotApi, bot: CommandBot) -> None:
    assert "/bump RUN STEP N" in ask(api, bot, "hello")[0]


def test_unauthorised_chats_get_nothing_and_are_logged(
    api: FakeBotApi, bot: CommandBot, store: MemoryEventStore, caplog: pytest.LogCaptureFixture
) -> None:
    before = store.last_seq()
    with caplog.at_level(logging.WARNING, "m27.notify.bot"):
        assert ask(api, bot, "/status", chat=666) == []
        api.push_callback(666, "cancel:md-1", message_id=5)
        bot.poll_once()
    assert api.calls_to("answerCallbackQuery") == [] and api.calls_to("editMessageText") == []
    assert store.last_seq() == before
    assert "unauthorised chat 666" in caplog.text


def test_updates_are_confirmed_so_a_restart_does_not_replay_them(
    api: FakeBotApi, bot: CommandBot
) -> None:
    ask(api, bot, "/status")
    offset = bot.offset
    assert bot.poll_once() == 0
    assert api.calls_to("getUpdates")[-1].params["offset"] == str(offset)


def test_embedded_bot_answers_from_a_thread_and_stops(
    api: FakeBotApi, store: MemoryEventStore, tmp_path: Path
) -> None:
    cfg = NotifyConfig(
        token=Secret(TOKEN), chat_ids=(CHAT,), api_url=api.base_url, request_timeout_s=2.0
    )
    handle = start_embedded_bot(store, cfg, home=tmp_path, poll_timeout=1)
    second = start_embedded_bot(store, cfg, home=tmp_path, poll_timeout=1)
    api.push_message(CHAT, "/status")
    wait_until(api.sent, timeout=30, interval=0.05, what="the bot's answer")
    handle.stop(timeout=30)
    second.stop(timeout=30)
    assert len(api.sent()) == 1 and "m27 status" in api.sent()[0]
    assert not handle.running and not second.running
