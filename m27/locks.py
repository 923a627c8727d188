"""One service of a kind per node, one writer per output: non-blocking flocks in ``$M27_HOME``.

The node agent holds ``agent.lock``, the notifier ``notify.lock`` and the Telegram bot
``bot.lock``; a run holds one lock per declared output (:class:`OutputLocks`). An
``flock`` is dropped by the kernel when its process dies, ``kill -9`` included, so a
crashed holder never blocks the node. The file holds the holder's pid, for messages
("held by pid N"); :mod:`m27.liveness` says whether that process still runs.

Why a top-level module: the agent (``m27.node``) and the notifier and bot (``m27.notify``)
sit in one layer and may not import each other, so the lock they share lives below both,
as a leaf that imports nothing from m27.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["AGENT_LOCK", "BOT_LOCK", "NOTIFY_LOCK", "NodeLock", "OutputHeld", "OutputLocks"]

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

    def acquire(self, note: str = "") -> bool:
        """Take the lock if it is free (True), or say it is held elsewhere (False); the
        file then holds our pid and `note` on a second line."""
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
        os.write(fd, f"{os.getpid()}\n{note}\n".encode() if note else f"{os.getpid()}\n".encode())
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
        first = self._lines()[0]
        return int(first) if first.isdigit() else None

    def note(self) -> str:
        """What the last holder wrote beside its pid ("" when nothing)."""
        return self._lines()[1]

    def _lines(self) -> tuple[str, str]:
        try:
            text = self.path.read_text()
        except OSError:
            return "", ""
        first, _, rest = text.partition("\n")
        return first.strip(), rest.strip()


@dataclass(frozen=True)
class OutputHeld:
    """An output another process is writing: its path, that process and its note."""

    path: str
    pid: int | None
    note: str


class OutputLocks:
    """One flock per output path (``outputs/<sha256 of the path>.lock``), so two runs on a
    node never write the same file at once; the kernel drops them when the run dies.

    The paths are taken in sorted order: of two runs that share outputs and start at the
    same moment, exactly one gets them all (both would lose if each took one first). The
    lock files stay (a few bytes each): removing one that another process has just opened
    would let a third lock a new file of the same name.
    """

    def __init__(self, home: Path, paths: Iterable[str]) -> None:
        self.home = Path(home)
        self.paths = sorted(set(paths))
        self._held: list[NodeLock] = []

    def _lock(self, path: str) -> NodeLock:
        digest = hashlib.sha256(path.encode("utf-8", "surrogateescape")).hexdigest()[:40]
        return NodeLock(self.home, f"outputs/{digest}.lock")

    def acquire(self, note: str) -> OutputHeld | None:
        """Take every path's lock (None), or take none and say which is held elsewhere."""
        for path in self.paths:
            lock = self._lock(path)
            if not lock.acquire(note):
                self.release()
                return OutputHeld(path, lock.holder(), lock.note())
            self._held.append(lock)
        return None

    def release(self) -> None:
        """Drop every lock held (at the run's end; idempotent)."""
        held, self._held = self._held, []
        for lock in held:
            lock.release()
