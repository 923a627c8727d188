"""Telegram notifications and the Telegram bot.

``notifier`` follows the event log and sends messages through a durable outbox; ``bot``
answers commands from allow-listed chats. See docs/notify.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from m27 import _lazy
from m27.notify.config import NotifyConfig, QuietHours, Secret, load_config

if TYPE_CHECKING:
    from m27.notify.bot import CommandBot, start_embedded_bot
    from m27.notify.notifier import Notifier, NotifierHandle, start_embedded_notifier

#: Imported on first use: they pull in python-telegram-bot (~0.5 s), which `m27 run`
#: without Telegram configured never needs.
__getattr__ = _lazy.module_getattr(
    globals(),
    {
        "m27.notify.bot": ("CommandBot", "start_embedded_bot"),
        "m27.notify.notifier": ("Notifier", "NotifierHandle", "start_embedded_notifier"),
    },
)


__all__ = [
    "CommandBot",
    "Notifier",
    "NotifierHandle",
    "NotifyConfig",
    "QuietHours",
    "Secret",
    "load_config",
    "start_embedded_bot",
    "start_embedded_notifier",
]
