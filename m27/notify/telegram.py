"""A small synchronous face on python-telegram-bot, with the token kept out of every log.

PTB is asyncio; the notifier and the bot are plain loops on an injected clock, so each
:class:`TelegramClient` owns a private event loop and runs one call at a time on it (use a
client from one thread only). Every PTB error becomes a :class:`DeliveryError` that says
what the caller should do: wait ``retry_after`` seconds (flood control), retry later
(``transient``: network, timeouts, 5xx) or stop retrying (bad request, blocked, bad token).

The token reaches PTB's URLs, and PTB and httpx log those URLs at DEBUG/INFO and put the
token in some error texts. :func:`install_scrubber` therefore wraps the logging record
factory so that any record, from any logger, has known secrets replaced by ``***`` before
a handler sees it, and error texts pass through :func:`scrub` before they are raised.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import threading
import warnings
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

# Opt in to PTB's future timedelta time periods: reading RetryAfter.retry_after then does
# not emit a deprecation warning (an error under `-W error`).
os.environ.setdefault("PTB_TIMEDELTA", "true")

import telegram
from telegram import error as tg_error
from telegram.request import HTTPXRequest

from m27._exceptions import NotifyError
from m27.notify.config import NotifyConfig, Secret

_T = TypeVar("_T")
_SECRETS: set[str] = set()
_lock = threading.Lock()
_installed = False


def scrub(text: str) -> str:
    """`text` with every known secret replaced by ***."""
    for secret in list(_SECRETS):
        if secret:
            text = text.replace(secret, "***")
    return text


def _scrub_record(record: logging.LogRecord) -> None:
    try:
        message = record.getMessage()
    except Exception:  # a malformed record is the logging module's problem, not ours
        return
    if any(s in message for s in list(_SECRETS)):
        record.msg, record.args = scrub(message), None
    if record.exc_info:
        text = logging.Formatter().formatException(record.exc_info)
        if any(s in text for s in list(_SECRETS)):
            record.exc_text, record.exc_info = scrub(text), None


def install_scrubber(secret: Secret | None) -> None:
    """Make sure `secret` never reaches a log handler of this process (idempotent)."""
    global _installed
    if not secret:
        return
    with _lock:
        _SECRETS.add(secret.reveal())
        if _installed:
            return
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            if _SECRETS:
                _scrub_record(record)
            return record

        logging.setLogRecordFactory(factory)
        _installed = True
    # httpx logs every request URL (with the token) at INFO; keep it to warnings.
    for name in ("httpx", "httpcore"):
        if logging.getLogger(name).level == logging.NOTSET:
            logging.getLogger(name).setLevel(logging.WARNING)


class DeliveryError(NotifyError):
    """A Bot API call failed; ``transient`` and ``retry_after`` say what to do next."""

    def __init__(
        self, message: str, *, transient: bool, retry_after: float | None = None, **ctx: Any
    ) -> None:
        super().__init__(message, **ctx)
        self.transient = transient
        self.retry_after = retry_after


def _retry_seconds(exc: tg_error.RetryAfter) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        value: Any = exc.retry_after
    if isinstance(value, dt.timedelta):
        return max(0.0, value.total_seconds())
    return max(0.0, float(value))


def _translate(exc: BaseException, method: str) -> DeliveryError:
    name = type(exc).__name__
    text = scrub(str(exc)) or name
    if isinstance(exc, tg_error.RetryAfter):
        seconds = _retry_seconds(exc)
        return DeliveryError(
            f"Telegram flood control on {method}: retry in {seconds:g}s",
            transient=True,
            retry_after=seconds,
            method=method,
        )
    if isinstance(exc, tg_error.InvalidToken):
        return DeliveryError(
            f"Telegram rejected the bot token on {method} (check M27_TELEGRAM_TOKEN)",
            transient=False,
            method=method,
        )
    if isinstance(exc, tg_error.BadRequest | tg_error.Forbidden | tg_error.Conflict):
        return DeliveryError(f"{method} refused: {name}: {text}", transient=False, method=method)
    if isinstance(exc, tg_error.TelegramError | OSError | asyncio.TimeoutError):
        # NetworkError, TimedOut, 5xx, connection refused, and unexpected API errors
        return DeliveryError(f"{method} failed: {name}: {text}", transient=True, method=method)
    return DeliveryError(f"{method} failed: {name}: {text}", transient=True, method=method)


class TelegramClient:
    """One bot, one private event loop, synchronous calls; errors are DeliveryError."""

    def __init__(self, token: Secret, api_url: str, timeout_s: float = 10.0) -> None:
        if not token:
            raise NotifyError("no Telegram token configured (set M27_TELEGRAM_TOKEN)")
        install_scrubber(token)
        self._timeout = timeout_s
        self._loop = asyncio.new_event_loop()
        request = HTTPXRequest(
            connect_timeout=timeout_s, read_timeout=timeout_s, write_timeout=timeout_s
        )
        updates = HTTPXRequest(
            connect_timeout=timeout_s, read_timeout=timeout_s, write_timeout=timeout_s
        )
        try:
            self._bot = telegram.Bot(
                token.reveal(),
                base_url=api_url.rstrip("/"),
                request=request,
                get_updates_request=updates,
            )
        except tg_error.TelegramError as exc:
            raise _translate(exc, "Bot") from None

    @classmethod
    def from_config(cls, config: NotifyConfig) -> TelegramClient:
        if config.token is None:
            raise NotifyError("no Telegram token configured (set M27_TELEGRAM_TOKEN)")
        return cls(config.token, config.api_url, config.request_timeout_s)

    def __repr__(self) -> str:
        return "TelegramClient(token=***)"

    def _call(self, method: str, coro: Coroutine[Any, Any, _T]) -> _T:
        try:
            return self._loop.run_until_complete(coro)
        except Exception as exc:
            raise _translate(exc, method) from None

    def get_me(self) -> str:
        """The bot's @username; also proves the token is accepted."""
        user = self._call("getMe", self._bot.get_me())
        return str(user.username or user.first_name)

    def send(self, chat_id: int, text: str, reply_markup: Any = None) -> int:
        """Send `text` (HTML) to `chat_id`; returns Telegram's message id."""
        msg = self._call(
            "sendMessage",
            self._bot.send_message(
                chat_id=chat_id,
                text=text,
                parse_mode="HTML",
                link_preview_options=telegram.LinkPreviewOptions(is_disabled=True),
                reply_markup=reply_markup,
            ),
        )
        return int(msg.message_id)

    def get_updates(self, offset: int, timeout: int) -> Sequence[telegram.Update]:
        """Long poll: waits up to `timeout` seconds on the server for new updates."""
        return self._call(
            "getUpdates",
            self._bot.get_updates(
                offset=offset,
                timeout=timeout,
                read_timeout=timeout + self._timeout,
                allowed_updates=["message", "callback_query"],
            ),
        )

    def answer_callback(self, query_id: str, text: str = "") -> None:
        self._call(
            "answerCallbackQuery",
            self._bot.answer_callback_query(query_id, text=text or None),
        )

    def edit_text(self, chat_id: int, message_id: int, text: str) -> None:
        self._call(
            "editMessageText",
            self._bot.edit_message_text(
                text=text, chat_id=chat_id, message_id=message_id, parse_mode="HTML"
            ),
        )

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._loop.run_until_complete(self._bot.shutdown())
        except Exception:  # closing a half-open connection must not mask the caller's error
            pass
        finally:
            self._loop.close()
