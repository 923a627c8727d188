"""SQLite helpers of the store: a write transaction, and what changed since a poll."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator

__all__ = ["data_version", "rollback", "transaction"]


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
