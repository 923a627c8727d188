"""SQLite helpers of the store: a write transaction, and what changed since a poll."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator

__all__ = ["data_version", "disk_full", "rollback", "transaction"]

#: Less free space than this (bytes) on the log's disk is a full disk to its errors.
FULL_BELOW = 1 << 20


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
