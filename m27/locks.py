"""One service of a kind per node: a non-blocking flock on a file in ``$M27_HOME``.

The node agent holds ``agent.lock``, the notifier ``notify.lock`` and the Telegram bot
``bot.lock``. An ``flock`` is dropped by the kernel when its process dies, ``kill -9``
included, so a crashed holder never blocks the node. The file holds the holder's pid, for
messages ("held by pid N"); :mod:`m27.liveness` says whether that process still runs.

Why a top-level module: the agent (``m27.node``) and the notifier and bot (``m27.notify``)
sit in one layer and may not import each other, so the lock they share lives below both,
as a leaf that imports nothing from m27.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

__all__ = ["AGENT_LOCK", "BOT_LOCK", "NOTIFY_LOCK", "NodeLock"]

AGENT_LOCK = "agent.lock"
NOTIFY_LOCK = "notify.lock"
BOT_LOCK = "bot.lock"


class NodeLock:
    """An exclusive flock on ``home/name``; :meth:`acquire` never blocks.

    Two ``NodeLock`` objects on one file exclude each other even inside one process (each
    opens its own file description), the same as two processes would.
    """

    def __init__(self, home: Path, name: str = AGENT_LOCK) -> None:
        self.path = Path(home) / name
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock if it is free (True), or say it is held elsewhere (False)."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def release(self) -> None:
        """Drop the lock; a no-op when it is not held."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def holder(self) -> int | None:
        """The pid written by the last holder (it may have ended since)."""
        try:
            text = self.path.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None
