"""`m27 bot`: answer a few commands from allow-listed chats over long polling.

Commands read the node's state from the event log (the same fold the notifier uses) and
act only by appending request events, so the bot needs no access to runs' processes:
/cancel appends ``CancelRequested`` (the run's flow honours it), /bump appends
``PriorityBumped`` (the agent's policy reads it). /resume starts ``m27 run --resume RUN
--detach`` on the node when ``M27_TELEGRAM_RESUME=1`` allows it (:mod:`m27.notify.resume`)
or the embedding program passes a ``resume_handler``; otherwise it replies with that
command, to type on the node.

A chat that is not in ``M27_TELEGRAM_CHAT_IDS`` gets no answer at all (not even an error,
which would confirm the bot exists); the attempt is logged with its chat id. /cancel is
confirmed with an inline button, because a mistyped run id on a phone should not stop a
three-day simulation.
"""

from __future__ import annotations

import html
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from telegram import InlineKeyboardButton, InlineKeyboardMarkup, Update

from m27 import events as ev
from m27.clock import Clock, SystemClock
from m27.events.state import step_ended
from m27.executors.logtail import last_line
from m27.locks import BOT_LOCK
from m27.notify.config import NotifyConfig
from m27.notify.facts import NodeFacts, RunFacts
from m27.notify.messages import resume_command
from m27.notify.notifier import NotifierHandle, start_embedded
from m27.notify.outbox import Outbox, outbox_path
from m27.notify.resume import resume_detached
from m27.notify.telegram import DeliveryError, TelegramClient, scrub
from m27.policy import PRIORITY_LIMIT
from m27.runids import RunIdError, resolve
from m27.store import EventStore
from m27.units import format_duration

log = logging.getLogger("m27.notify.bot")

HELP = (
    "<b>m27 bot</b>\n"
    "/status: node summary\n"
    "/status RUN: its steps, and what each running one printed last\n"
    "/runs: recent runs\n"
    "/queue: running and queued steps\n"
    "/gpus: GPUs of this node\n"
    "/cancel RUN [STEP]: cancel a run, or one of its steps (asks first)\n"
    "/bump RUN STEP N: raise a step's priority by N\n"
    "/resume RUN: how to resume a run"
)
RUNS_SHOWN = 10
#: /status RUN lists this many steps (a message holds at most 4096 characters), each
#: running step's last line cut to this many characters
STEPS_SHOWN, SAID_CHARS = 25, 100
_STEP_ICONS = {"running": "▶", "queued": "⏳", "succeeded": "✅", "failed": "❌", "cancelled": "⏹"}
_ICONS = {"running": "▶", "succeeded": "✅", "failed": "❌", "cancelled": "⏹", "crashed": "💥"}


class BotClient(Protocol):
    def send(self, chat_id: int, text: str, reply_markup: Any = None) -> int: ...
    def get_updates(self, offset: int, timeout: int) -> Sequence[Update]: ...
    def answer_callback(self, query_id: str, text: str = "") -> None: ...
    def edit_text(self, chat_id: int, message_id: int, text: str) -> None: ...


def esc(value: object) -> str:
    return html.escape(str(value), quote=False)


def default_gpu_info() -> str:
    """GPUs as `m27.gpu.detect()` sees them now, or a plain 'unavailable'."""
    try:
        from m27 import gpu

        backend = gpu.detect(notice=lambda _msg: None)
        try:
            samples = backend.sample(SystemClock().now())
        finally:
            backend.close()
        kind = backend.kind
    except Exception:  # no driver, NVML errors: the bot still answers
        return "GPU info unavailable"
    if not samples:
        return "no GPUs on this node"
    lines = [f"backend: {esc(kind)}"]
    for s in samples:
        if s.lost:
            lines.append(f"🚨 GPU {s.index}: lost")
            continue
        parts = [f"GPU {s.index}: {esc(s.name or '?')}"]
        if s.utilization_gpu is not None:
            parts.append(f"{s.utilization_gpu:.0f}%")
        if s.memory_used is not None and s.memory_total:
            parts.append(f"{s.memory_used / 2**30:.1f}/{s.memory_total / 2**30:.0f} GiB")
        if s.temperature_c is not None:
            parts.append(f"{s.temperature_c:.0f} °C")
        lines.append(" · ".join(parts))
    return "\n".join(lines)


@dataclass
class CommandBot:
    store: EventStore
    config: NotifyConfig
    client: BotClient
    clock: Clock = field(default_factory=SystemClock)
    outbox: Outbox | None = None
    gpu_info: Callable[[], str] = default_gpu_info
    resume_handler: Callable[[str], str] | None = None
    poll_timeout: int = 30
    facts: NodeFacts = field(default_factory=NodeFacts)
    offset: int = 0

    def __post_init__(self) -> None:
        if self.outbox is not None:
            self.offset = self.outbox.cursor("bot")

    # --- the loop ------------------------------------------------------------------------

    def refresh(self) -> None:
        while True:
            records = self.store.read(self.facts.last_seq, 1000)
            if not records:
                return
            for rec in records:
                self.facts.apply(rec.seq, rec.event)

    def poll_once(self, timeout: int | None = None) -> int:
        """One long poll; handles each update and confirms it. Returns updates handled."""
        updates = self.client.get_updates(
            self.offset, self.poll_timeout if timeout is None else timeout
        )
        for update in updates:
            try:
                self.handle(update)
            except DeliveryError as exc:
                log.warning("bot could not answer update %s: %s", update.update_id, scrub(str(exc)))
            self.offset = update.update_id + 1
            if self.outbox is not None:
                self.outbox.enqueue([], [], self.clock.now(), cursor=self.offset, cursor_name="bot")
        return len(updates)

    def run(self, stop: threading.Event) -> None:
        failures = 0
        while not stop.is_set():
            try:
                self.poll_once()
                failures = 0
            except DeliveryError as exc:
                failures += 1
                wait = min(60.0, 2.0 ** min(failures, 6))
                if exc.retry_after is not None:
                    wait = exc.retry_after
                log.warning("bot polling failed: %s; retrying in %gs", scrub(str(exc)), wait)
                if isinstance(self.clock, SystemClock):
                    stop.wait(wait)
                else:
                    self.clock.sleep(wait)

    # --- dispatch ------------------------------------------------------------------------

    def allowed(self, chat_id: int | None) -> bool:
        return chat_id is not None and chat_id in self.config.chat_ids

    def handle(self, update: Update) -> None:
        chat = update.effective_chat
        chat_id = chat.id if chat is not None else None
        if not self.allowed(chat_id):
            user = update.effective_user
            log.warning(
                "ignored Telegram update %s from unauthorised chat %s (user %s)",
                update.update_id,
                chat_id,
                user.id if user is not None else "?",
            )
            return
        assert chat_id is not None
        if update.callback_query is not None:
            self._callback(chat_id, update)
            return
        message = update.message
        if message is None or not message.text:
            return
        self.refresh()
        reply = self.command(chat_id, message.text)
        if isinstance(reply, tuple):
            self.client.send(chat_id, reply[0], reply_markup=reply[1])
        else:
            self.client.send(chat_id, reply)

    def command(self, chat_id: int, text: str) -> str | tuple[str, InlineKeyboardMarkup]:
        """The answer to one command line (facts must be refreshed)."""
        words = text.strip().split()
        if not words or not words[0].startswith("/"):
            return HELP
        name, args = words[0][1:].split("@", 1)[0].lower(), words[1:]
        if name == "status":
            return self.run_status(args) if args else self.status()
        if name == "runs":
            return self.runs()
        if name == "queue":
            return self.queue()
        if name == "gpus":
            return "<b>GPUs</b>\n" + self.gpu_info()
        if name == "cancel":
            return self.cancel(args)
        if name == "bump":
            return self.bump(chat_id, args)
        if name == "resume":
            return self.resume(args)
        return HELP

    # --- commands ------------------------------------------------------------------------

    def status(self) -> str:
        runs = list(self.facts.runs.values())
        by: dict[str, int] = {}
        for r in runs:
            by[r.status] = by.get(r.status, 0) + 1
        steps = [s for r in runs if r.status == "running" for s in r.steps.values()]
        running = sum(1 for s in steps if s.status == "running")
        queued = sum(1 for s in steps if s.status == "queued")
        lines = ["<b>m27 status</b>"]
        order = ("running", "succeeded", "failed", "crashed", "cancelled")
        counts = [f"{by[k]} {k}" for k in order if by.get(k)]
        lines.append("runs: " + (" · ".join(counts) if counts else "none yet"))
        lines.append(f"steps: {running} running · {queued} queued")
        if self.facts.lost_gpus:
            lines.append("GPUs lost: " + ", ".join(str(g) for g in sorted(self.facts.lost_gpus)))
        return "\n".join(lines)

    def run_status(self, args: list[str]) -> str:
        """/status RUN: each step, and a running step's time and last line of output (how
        far a simulation got: `step 78000, will finish ...`, and how long ago it said so)."""
        found = self._find_run(args, "/status [RUN]")
        if isinstance(found, str):
            return found
        now = self.clock.now()
        lines = [self._run_line(found)]
        steps = list(found.steps.values())
        for s in steps[:STEPS_SHOWN]:
            icon = _STEP_ICONS.get(s.status, "·")
            line = f"{icon} <b>{esc(s.name)}</b> {s.status}"
            if s.status == "running":
                line += f" · GPU {','.join(map(str, s.gpus))}" if s.gpus else ""
                line += f" · {format_duration(now - s.started_at)}" if s.started_at else ""
                said = last_line(s.log_path) if s.log_path else None
                if said is not None:
                    ago = format_duration(max(0.0, now - said[1]))
                    line += f"\n    <code>{esc(said[0].strip()[:SAID_CHARS])}</code> ({ago} ago)"
            lines.append(line)
        if len(steps) > STEPS_SHOWN:
            lines.append(f"... and {len(steps) - STEPS_SHOWN} more steps (m27 status on the node)")
        return "\n".join(lines)

    def _run_line(self, run: RunFacts) -> str:
        icon = _ICONS.get(run.status, "·")
        return (
            f"{icon} <code>{esc(run.run_id)}</code> {esc(run.pipeline or '?')} · "
            f"{run.steps_done}/{len(run.steps)} steps · {run.status}"
        )

    def runs(self) -> str:
        recent = list(self.facts.runs.values())[-RUNS_SHOWN:][::-1]
        if not recent:
            return "No runs yet."
        return "<b>Recent runs</b>\n" + "\n".join(self._run_line(r) for r in recent)

    def queue(self) -> str:
        rows: list[tuple[int, int, str]] = []
        for run in self.facts.runs.values():
            if run.status != "running":
                continue
            for s in run.steps.values():
                if s.status not in ("running", "queued"):
                    continue
                where = (
                    f" GPU {','.join(map(str, s.gpus))}" if s.status == "running" and s.gpus else ""
                )
                icon = "▶" if s.status == "running" else "⏳"
                line = (
                    f"{icon} <code>{esc(run.run_id)}</code>/<b>{esc(s.name)}</b> "
                    f"{esc(s.type or '?')} · prio {s.priority}{where}"
                )
                rows.append((0 if s.status == "running" else 1, -s.priority, line))
        if not rows:
            return "The queue is empty."
        return "<b>Queue</b>\n" + "\n".join(line for *_, line in sorted(rows))

    def _find_run(self, args: list[str], usage: str) -> RunFacts | str:
        if not args:
            return f"Usage: {usage}"
        run = self.facts.runs.get(args[0])
        if run is None:
            return f"No run <code>{esc(args[0])}</code> on this node."
        return run

    def cancel(self, args: list[str]) -> str | tuple[str, InlineKeyboardMarkup]:
        usage = "/cancel RUN [STEP]"
        found = self._find_run(args, usage)
        if isinstance(found, str):
            return found
        if len(args) > 2:
            return f"Usage: {usage}"
        if found.status != "running":
            return f"Run <code>{esc(found.run_id)}</code> already {found.status}."
        step = args[1] if len(args) == 2 else ""
        what = f"run <code>{esc(found.run_id)}</code>"
        if step:
            if step not in found.steps:
                return f"Run <code>{esc(found.run_id)}</code> has no step <b>{esc(step)}</b>."
            what = f"<code>{esc(found.run_id)}</code>/<b>{esc(step)}</b>"
            ended = step_ended(found.status, found.steps[step].status)
            if ended is not None:
                return f"{what} is {ended}: nothing to cancel."
        data = f"cancel:{found.run_id}" + (f":{step}" if step else "")
        if len(data.encode()) > 64:
            return "This run id is too long for a button; use `m27 cancel` on the node."
        keyboard = InlineKeyboardMarkup(
            [
                [
                    InlineKeyboardButton("Cancel it", callback_data=data),
                    InlineKeyboardButton("Keep running", callback_data="keep"),
                ]
            ]
        )
        alone = " (the run goes on without it)" if step else ""
        return f"Cancel {what}?{alone}", keyboard

    def bump(self, chat_id: int, args: list[str]) -> str:
        usage = "/bump RUN STEP N"
        found = self._find_run(args, usage)
        if isinstance(found, str):
            return found
        if len(args) != 3:
            return f"Usage: {usage}"
        step, amount = args[1], args[2]
        if step not in found.steps:
            return f"Run <code>{esc(found.run_id)}</code> has no step <b>{esc(step)}</b>."
        ended = step_ended(found.status, found.steps[step].status)
        if ended is not None:
            where = f"<code>{esc(found.run_id)}</code>/<b>{esc(step)}</b>"
            return f"{where} is {ended}: nothing to bump."
        try:
            delta = int(amount)
        except ValueError:
            return f"N must be an integer, not <code>{esc(amount)}</code>."
        if abs(delta) > PRIORITY_LIMIT:
            return f"N must be from -{PRIORITY_LIMIT:,} to {PRIORITY_LIMIT:,}."
        self.store.append([ev.PriorityBumped(self.clock.now(), found.run_id, step, delta)])
        now_prio = found.steps[step].priority + delta
        log.info("telegram:%s bumped %s/%s by %d", chat_id, found.run_id, step, delta)
        return (
            f"Priority of <code>{esc(found.run_id)}</code>/<b>{esc(step)}</b> "
            f"{delta:+d} → {now_prio}"
        )

    def resume(self, args: list[str]) -> str:
        if not args:
            return "Usage: /resume RUN"
        try:  # as `m27 run --resume` reads it (a prefix, `last`): the run whose environment
            target = resolve(args[0], self.facts.runs)  # the resume runs in
        except RunIdError:
            target = args[0]  # the command says what is wrong with it
        run = self.facts.runs.get(target)
        if run is not None and run.status == "running":
            # resuming it would run its steps twice at once (`m27 run --resume` refuses too)
            return f"Run <code>{esc(run.run_id)}</code> is still running; /cancel it first."
        if self.resume_handler is not None:
            return esc(self.resume_handler(target))
        if self.config.allow_resume:
            return esc(resume_detached(target))
        return (
            "Resuming from a phone is not enabled (M27_TELEGRAM_RESUME=1 on the node "
            "enables it); on the node run:\n"
            f"<code>{esc(resume_command(target))}</code>"
        )

    def _callback(self, chat_id: int, update: Update) -> None:
        query = update.callback_query
        assert query is not None
        data = query.data or ""
        message = query.message
        message_id = message.message_id if message is not None else None
        if data.startswith("cancel:"):
            self.refresh()
            run_id, _, step = data.removeprefix("cancel:").partition(":")
            run = self.facts.runs.get(run_id)
            what = f"<code>{esc(run_id)}</code>" + (f"/<b>{esc(step)}</b>" if step else "")
            ended = None
            if run is not None and step:
                ended = step_ended(run.status, run.step(step).status)
            if run is None or run.status != "running" or ended is not None:
                state = "is unknown" if run is None else f"already {ended or run.status}"
                self.client.answer_callback(query.id, "Nothing to cancel")
                text = f"{'Run ' if not step else ''}{what} {state}."
            else:
                by = f"telegram:{chat_id}"
                self.store.append([ev.CancelRequested(self.clock.now(), run_id, by=by, step=step)])
                log.info("%s requested cancel of %s", by, f"{run_id}/{step}" if step else run_id)
                self.client.answer_callback(query.id, "Cancel requested")
                text = f"⏹ Cancel requested for {what} by {esc(by)}."
        else:
            self.client.answer_callback(query.id, "Kept")
            text = "Kept running."
        if message_id is not None:
            self.client.edit_text(chat_id, message_id, text)


def serve_bot(
    store: EventStore,
    config: NotifyConfig,
    home: Path,
    stop: threading.Event,
    *,
    resume_handler: Callable[[str], str] | None = None,
    poll_timeout: int = 30,
) -> None:
    """Answer bot commands until `stop` is set, on a Telegram client and the node's outbox
    that it closes at the end (the caller holds the bot lock)."""
    client = TelegramClient.from_config(config)
    box = Outbox(outbox_path(home))
    try:
        bot = CommandBot(
            store,
            config,
            client,
            outbox=box,
            resume_handler=resume_handler,
            poll_timeout=poll_timeout,
        )
        bot.run(stop)
    finally:
        client.close()
        box.close()


def start_embedded_bot(
    store: EventStore,
    config: NotifyConfig,
    *,
    home: Path | None = None,
    resume_handler: Callable[[str], str] | None = None,
    poll_timeout: int = 30,
) -> NotifierHandle:
    """Answer bot commands from a daemon thread of this process (see
    :func:`m27.notify.notifier.start_embedded`): Telegram allows one long poll per token,
    so it stays idle while ``m27 bot`` holds the node. Stopping waits for the current
    long poll.
    """

    def serve(where: Path, stop: threading.Event) -> None:
        serve_bot(
            store, config, where, stop, resume_handler=resume_handler, poll_timeout=poll_timeout
        )

    return start_embedded("bot", config, home, BOT_LOCK, serve, log)
