"""`m27 notify test|status|retry`, `m27 notifier` and `m27 bot`: Telegram from the shell."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator

from m27._exceptions import ConfigError, NotifyError
from m27.cli.commands import SUMMARY
from m27.cli.commands._options import whole
from m27.locks import BOT_LOCK, NOTIFY_LOCK, NodeLock
from m27.notify.bot import serve_bot
from m27.notify.config import NotifyConfig, load_config
from m27.notify.messages import hello_message
from m27.notify.notifier import CURSOR, open_notifier
from m27.notify.outbox import Outbox, outbox_path
from m27.notify.telegram import DeliveryError, TelegramClient, install_scrubber, scrub
from m27.paths import m27_home
from m27.signals import stop_event
from m27.store.sqlite import SqliteEventStore, open_store

log = logging.getLogger("m27.notify")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "notify",
        help=SUMMARY["notify"],
        description="Check the Telegram settings (M27_TELEGRAM_TOKEN or a 0600 token file, "
        "M27_TELEGRAM_CHAT_IDS) and look at the notifier's outbox.",
    )
    actions = p.add_subparsers(dest="notify_action", metavar="ACTION", required=True)
    t = actions.add_parser("test", help="send a test message to every configured chat")
    t.add_argument("--chat", type=int, action="append", help="only this chat id (repeatable)")
    t.set_defaults(func=run_test)
    s = actions.add_parser("status", help="outbox counts, cursor and parked messages")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=run_status)
    r = actions.add_parser("retry", help="put every parked message back in the queue")
    r.set_defaults(func=run_retry)

    n = sub.add_parser(
        "notifier",
        help=SUMMARY["notifier"],
        description="Run until SIGTERM/Ctrl-C. One notifier per node delivers.",
    )
    n.set_defaults(func=run_notifier)
    b = sub.add_parser(
        "bot",
        help=SUMMARY["bot"],
        description="Long-polls Telegram: /status /runs /queue /gpus /cancel /bump /resume.",
    )
    b.add_argument(
        "--poll-timeout",
        type=whole(least=0, most=3600),
        default=30,
        help="long-poll seconds (default 30; 0 polls without waiting)",
    )
    b.set_defaults(func=run_bot)


def _config(need_chats: bool = True) -> NotifyConfig:
    config = load_config()
    install_scrubber(config.token)
    if not config.token:
        raise ConfigError("no Telegram token: set M27_TELEGRAM_TOKEN or M27_TELEGRAM_TOKEN_FILE")
    if need_chats and not config.chat_ids:
        raise ConfigError("no chat ids: set M27_TELEGRAM_CHAT_IDS (comma-separated)")
    return config


def run_test(args: argparse.Namespace) -> int:
    config = _config()
    chats = args.chat or list(config.chat_ids)
    client = TelegramClient.from_config(config)
    failed = 0
    try:
        try:
            name = client.get_me()
        except DeliveryError as exc:
            # where it asked: a wrong M27_TELEGRAM_API_URL reads like a network fault
            print(f"m27: {scrub(str(exc))} (Bot API {config.api_url}<token>)", file=sys.stderr)
            return 1
        msg = hello_message(socket.gethostname(), time.strftime("%Y-%m-%d %H:%M:%S"))
        for chat in chats:
            try:
                mid = client.send(chat, msg.text)
            except DeliveryError as exc:
                failed += 1
                print(f"chat {chat}: FAILED: {scrub(str(exc))}", file=sys.stderr)
            else:
                print(f"chat {chat}: sent as @{name} (message {mid})")
    finally:
        client.close()
    return 1 if failed else 0


def run_status(args: argparse.Namespace) -> int:
    path = outbox_path(m27_home())
    if not path.exists():
        data: dict[str, object] = {"cursor": 0, "counts": {}, "parked": []}
    else:
        box = Outbox(path)
        try:
            data = {
                "cursor": box.cursor(CURSOR),
                "counts": box.counts(),
                "parked": [
                    {
                        "id": m.id,
                        "seq": m.seq,
                        "chat_id": m.chat_id,
                        "kind": m.kind,
                        "attempts": m.attempts,
                        "permanent": m.permanent,
                        "error": m.last_error,
                    }
                    for m in box.parked()
                ],
            }
        finally:
            box.close()
    if args.json:
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    counts = data["counts"]
    print(f"cursor: event {data['cursor']}")
    if isinstance(counts, dict):
        print("outbox: " + (", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "empty"))
    parked = data["parked"]
    if isinstance(parked, list):
        for p in parked:
            why = "refused" if p["permanent"] else "undeliverable"
            print(f"parked #{p['id']} {p['kind']} -> chat {p['chat_id']} ({why}): {p['error']}")
    return 0


def run_retry(args: argparse.Namespace) -> int:
    box = Outbox(outbox_path(m27_home()))
    try:
        n = box.unpark(time.time(), include_permanent=True)
    finally:
        box.close()
    print(f"{n} parked message(s) back in the queue")
    return 0


def _stop_on_signals() -> threading.Event:
    return stop_event((signal.SIGTERM, signal.SIGINT))


def _open_store() -> SqliteEventStore:
    return open_store(m27_home())


@contextlib.contextmanager
def _service(what: str, lock_name: str) -> Iterator[SqliteEventStore]:
    """The node's log for the `what` service, which holds the node's `lock_name` while it
    runs (one per node: a second one is refused)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    lock = NodeLock(m27_home(), lock_name)
    if not lock.acquire():
        raise NotifyError(f"another {what} is running on this node ({lock.path} is locked)")
    try:
        with _open_store() as store:
            yield store
    finally:
        lock.release()


def run_notifier(args: argparse.Namespace) -> int:
    config = _config()
    with _service("notifier", NOTIFY_LOCK) as store:
        notifier = open_notifier(store, config, home=m27_home())
        stop = _stop_on_signals()
        cursor = notifier.outbox.cursor(CURSOR)
        log.info("notifier: following %s from event %d", m27_home(), cursor)
        try:
            notifier.run(stop)
        finally:
            notifier.close()
    return 0


def run_bot(args: argparse.Namespace) -> int:
    config = _config()
    with _service("bot", BOT_LOCK) as store:
        serve_bot(store, config, m27_home(), _stop_on_signals(), poll_timeout=args.poll_timeout)
    return 0
