"""Telegram settings: where the token comes from, who hears what, and when to keep quiet.

The token is a credential that can post as the lab's bot, so it lives in a :class:`Secret`
whose ``repr`` and ``str`` are ``***``; only :meth:`Secret.reveal` gives the value, and only
the Telegram client calls it. A token file is refused unless only its owner can read it
(mode 0600 or stricter), like ``ssh`` refuses a readable private key.

Environment (all optional; without a token and chat ids nothing is sent):

``M27_TELEGRAM_TOKEN``       the bot token
``M27_TELEGRAM_TOKEN_FILE``  a file holding it (default ``$M27_HOME/telegram.token`` if present)
``M27_TELEGRAM_CHAT_IDS``    comma-separated chat ids that get messages and may use the bot
``M27_TELEGRAM_API_URL``     Bot API base (default ``https://api.telegram.org/bot``)
``M27_TELEGRAM_EVENTS``      ``all`` (default), ``failures``, or a comma list of kinds
``M27_TELEGRAM_QUIET_HOURS`` e.g. ``22:00-07:00``: non-critical messages wait until it ends
``M27_TELEGRAM_TZ``          time zone of the quiet hours (default: the machine's)
``M27_TELEGRAM_MAX_ATTEMPTS`` failures before a message is parked (default 8)
``M27_TELEGRAM_RESUME``      ``1`` lets the bot's /resume start ``m27 run --resume RUN
                             --detach`` on the node (default ``0``: it replies with that command)
"""

from __future__ import annotations

import datetime as dt
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from m27._exceptions import ConfigError
from m27.paths import m27_home

DEFAULT_API_URL = "https://api.telegram.org/bot"

#: Every message kind the notifier can send (the names users write in filters).
KINDS: tuple[str, ...] = (
    "agent_restarted",
    "checkpoint_restored",
    "gpu_hot",
    "gpu_lost",
    "gpu_throttled",
    "run_cancelled",
    "run_failed",
    "run_succeeded",
    "step_retried",
    "test",
)

#: Kinds that go through quiet hours: someone may need to act now.
CRITICAL_KINDS: frozenset[str] = frozenset({"run_failed", "gpu_lost", "test"})

_PRESETS: dict[str, frozenset[str]] = {
    "all": frozenset(KINDS),
    "failures": frozenset({"run_failed", "gpu_lost", "test"}),
}


class Secret:
    """A string that never shows itself in logs, reprs, tracebacks or config dumps."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    def __str__(self) -> str:
        return "***"

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))


@dataclass(frozen=True)
class QuietHours:
    """A daily window (may cross midnight) during which non-critical messages are held."""

    start: dt.time
    end: dt.time
    tz: dt.tzinfo | None = None

    @classmethod
    def parse(cls, text: str, tz: dt.tzinfo | None = None) -> QuietHours:
        try:
            a, b = (part.strip() for part in text.split("-"))
            start, end = dt.time.fromisoformat(a), dt.time.fromisoformat(b)
        except ValueError:
            raise ConfigError(
                f"quiet hours {text!r} are not HH:MM-HH:MM (e.g. 22:00-07:00)",
                key="M27_TELEGRAM_QUIET_HOURS",
            ) from None
        return cls(start, end, tz)

    def _local(self, now: float) -> dt.datetime:
        return dt.datetime.fromtimestamp(now, self.tz or dt.UTC).astimezone(self.tz)

    def contains(self, now: float) -> bool:
        t = self._local(now).time()
        if self.start <= self.end:
            return self.start <= t < self.end
        return t >= self.start or t < self.end

    def ends_after(self, now: float) -> float:
        """Epoch seconds when the quiet period that contains `now` ends."""
        local = self._local(now)
        end = local.replace(hour=self.end.hour, minute=self.end.minute, second=0, microsecond=0)
        if end <= local:
            end += dt.timedelta(days=1)
        return end.timestamp()


@dataclass(frozen=True)
class NotifyConfig:
    """Everything the notifier and the bot need; safe to print (the token shows as ***)."""

    token: Secret | None = None
    chat_ids: tuple[int, ...] = ()
    api_url: str = DEFAULT_API_URL
    kinds: frozenset[str] = field(default_factory=lambda: frozenset(KINDS))
    quiet: QuietHours | None = None
    max_attempts: int = 8
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    parked_retry_s: float = 300.0
    min_interval_s: float = 1.0
    request_timeout_s: float = 10.0
    poll_interval_s: float = 1.0
    #: /resume starts the resume on the node (M27_TELEGRAM_RESUME=1), not just names it
    allow_resume: bool = False

    @property
    def enabled(self) -> bool:
        return bool(self.token) and bool(self.chat_ids)

    def wants(self, kind: str) -> bool:
        return kind in self.kinds

    def held(self, kind: str, now: float) -> float | None:
        """When a message of `kind` may go out if quiet hours hold it now, else None."""
        if self.quiet is None or kind in CRITICAL_KINDS or not self.quiet.contains(now):
            return None
        return self.quiet.ends_after(now)

    def describe(self) -> dict[str, str]:
        """The settings as `m27 config` shows them: the token only as set or not set."""
        quiet = f"{self.quiet.start:%H:%M}-{self.quiet.end:%H:%M}" if self.quiet is not None else ""
        return {
            "telegram.token": "*** (set)" if self.token else "(not set)",
            "telegram.chat_ids": ",".join(str(c) for c in self.chat_ids),
            "telegram.api_url": self.api_url,
            "telegram.events": ",".join(sorted(self.kinds)),
            "telegram.quiet_hours": quiet,
            "telegram.max_attempts": str(self.max_attempts),
        }


def _api_url(text: str) -> str:
    """The Bot API base the token is appended to. A server's address alone
    (``http://127.0.0.1:8081``, as a self-hosted telegram-bot-api is started) gets ``/bot``:
    without it the token became part of the port (``Invalid port: '8081***'``)."""
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number)
    except ValueError as exc:
        raise ConfigError(
            f"M27_TELEGRAM_API_URL={text!r} is not a URL: {exc}", key="M27_TELEGRAM_API_URL"
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"M27_TELEGRAM_API_URL={text!r} must start with http:// or https:// and a host, "
            f"e.g. {DEFAULT_API_URL}",
            key="M27_TELEGRAM_API_URL",
        )
    text = text.rstrip("/")
    return text + "/bot" if parts.path.strip("/") == "" else text


def read_token_file(path: Path) -> Secret:
    """The token in `path`; refused when group or others may read or write the file."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"cannot read the token file: {exc.strerror}", file=str(path)) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"token file {path} has mode {stat.S_IMODE(mode):o}; "
            f"run `chmod 600 {path}` so only you can read it",
            file=str(path),
        )
    value = path.read_text(encoding="utf-8").strip()
    if not value:
        raise ConfigError("the token file is empty", file=str(path))
    return Secret(value)


def parse_chat_ids(text: str) -> tuple[int, ...]:
    ids: list[int] = []
    for part in text.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            ids.append(int(part))
        except ValueError:
            raise ConfigError(
                f"chat id {part!r} is not an integer", key="M27_TELEGRAM_CHAT_IDS"
            ) from None
    return tuple(dict.fromkeys(ids))


def parse_kinds(text: str) -> frozenset[str]:
    kinds: set[str] = set()
    for part in (p.strip().lower() for p in text.split(",")):
        if not part:
            continue
        if part in _PRESETS:
            kinds |= _PRESETS[part]
        elif part in KINDS:
            kinds.add(part)
        else:
            known = ", ".join([*_PRESETS, *KINDS])
            raise ConfigError(
                f"unknown event kind {part!r} in M27_TELEGRAM_EVENTS (known: {known})",
                key="M27_TELEGRAM_EVENTS",
            )
    return frozenset(kinds | {"test"})


def _positive_int(env: Mapping[str, str], key: str, default: int) -> int:
    raw = env.get(key)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{key}={raw!r} must be a positive integer", key=key)
    return value


#: A bot token as @BotFather gives it: the bot's numeric id, a colon, a url-safe secret.
_TOKEN_SHAPE = re.compile(r"\d+:[A-Za-z0-9_-]+")


def load_config(env: Mapping[str, str] | None = None) -> NotifyConfig:
    """Read the Telegram settings from the environment (and the token file)."""
    env = os.environ if env is None else env
    token: Secret | None = None
    if env.get("M27_TELEGRAM_TOKEN", "").strip():
        token = Secret(env["M27_TELEGRAM_TOKEN"].strip())
    elif env.get("M27_TELEGRAM_TOKEN_FILE", "").strip():
        token = read_token_file(Path(env["M27_TELEGRAM_TOKEN_FILE"]).expanduser())
    elif (m27_home(env) / "telegram.token").exists():
        token = read_token_file(m27_home(env) / "telegram.token")
    if token is not None and not _TOKEN_SHAPE.fullmatch(token.reveal()):
        # said now, not as "getMe failed: Unauthorized" (or a network error) later
        raise ConfigError(
            "the Telegram token does not look like a bot token (digits, a colon, then "
            "letters, digits, - and _; @BotFather gives one like 123456789:AAH...)",
            key="M27_TELEGRAM_TOKEN",
        )

    tz: dt.tzinfo | None = None
    if env.get("M27_TELEGRAM_TZ", "").strip():
        try:
            tz = ZoneInfo(env["M27_TELEGRAM_TZ"].strip())
        except (ZoneInfoNotFoundError, ValueError):
            raise ConfigError(
                f"unknown time zone {env['M27_TELEGRAM_TZ']!r}", key="M27_TELEGRAM_TZ"
            ) from None
    quiet_text = env.get("M27_TELEGRAM_QUIET_HOURS", "").strip()
    api_url = _api_url(env.get("M27_TELEGRAM_API_URL", "").strip() or DEFAULT_API_URL)
    events = env.get("M27_TELEGRAM_EVENTS", "").strip()
    return NotifyConfig(
        token=token,
        chat_ids=parse_chat_ids(env.get("M27_TELEGRAM_CHAT_IDS", "")),
        api_url=api_url,
        kinds=parse_kinds(events) if events else frozenset(KINDS),
        quiet=QuietHours.parse(quiet_text, tz) if quiet_text else None,
        max_attempts=_positive_int(env, "M27_TELEGRAM_MAX_ATTEMPTS", 8),
        allow_resume=_switch(env, "M27_TELEGRAM_RESUME"),
    )


_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"", "0", "false", "no", "off"})


def _switch(env: Mapping[str, str], key: str) -> bool:
    raw = env.get(key, "")
    if raw.strip().lower() in _ON | _OFF:
        return raw.strip().lower() in _ON
    raise ConfigError(f"{key}={raw!r}: use 1 (on) or 0 (off)", key=key)
