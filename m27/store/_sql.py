"""SQLite helpers of the store: a write transaction, and what changed since a poll."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

__all__ = ["data_version", "disk_full", "rollback", "transaction", "why_failed"]

#: Less free space than this (bytes) on the log's disk is a full disk to its errors.
FULL_BELOW = 1 << 20
#: The longest path SQLite's unix VFS opens (its MAX_PATHNAME).
SQLITE_PATH_MAX = 512


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """A write transaction that takes the file's write lock at once (no deadlock on upgrade);
    rolled back on any error, KeyboardInterrupt included."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        rollback(conn)
        raise


def rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def data_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


def disk_full(folder: os.PathLike[str] | str) -> bool:
    """Whether the disk holding `folder` has (nearly) no space left for its user."""
    try:
        stat = os.statvfs(folder)
    except OSError:
        return False
    # /proc and /sys report no blocks at all: not a disk, so not a full one
    return stat.f_blocks > 0 and stat.f_bavail * stat.f_frsize < FULL_BELOW


def why_failed(path: Path, exc: sqlite3.Error) -> str:
    """SQLite's `exc` about the log at `path`, with what to do about it: its own text
    ("file is not a database") names neither the way out nor what it costs."""
    text = str(exc)
    # SQLite says "disk I/O error" when a full disk stops it making its WAL files
    if "full" not in text and disk_full(path.parent):
        return f"{text} (the disk holding it is full)"
    if "not a database" in text or "malformed" in text:
        return (
            f"{text}. The event log is damaged: stop the node service (`m27 agent stop`) "
            f"and move {path} aside; m27 then starts a new, empty log (the runs it held are "
            f"no longer listed; `sqlite3 {path} .recover` may get them back)"
        )
    if "readonly" in text:
        return f"{text}. m27 records every run in {path}: make it writable again"
    if "unable to open" in text and path.is_dir():
        return f"{text} ({path} is a folder; m27 keeps its event log in that file)"
    if "unable to open" in text and len(str(path)) > SQLITE_PATH_MAX:
        return (
            f"{text} (its path is {len(str(path))} characters long; SQLite opens at most "
            f"{SQLITE_PATH_MAX}: set M27_HOME to a shorter folder)"
        )
    return text
