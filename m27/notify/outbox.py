"""The durable outbox: rendered messages waiting for Telegram, and the notifier's cursor.

Why this gives at-least-once delivery with at most one duplicate after a crash:

1. For a batch of events the notifier renders the messages and, in ONE SQLite
   transaction, inserts them as ``pending`` and moves its cursor past the batch. A crash
   before the commit loses both, so the events are read and rendered again; a crash after
   it keeps both. A message can therefore never be skipped, and ``UNIQUE(seq, chat_id)``
   makes a re-render harmless.
2. A pending message is sent, then marked ``sent``. A crash between the two leaves it
   pending and it is sent once more on restart: that is the one possible duplicate, and
   it needs a crash inside that window.
3. A message is never deleted while unsent: after ``max_attempts`` transient failures, or
   one permanent one, it is ``parked`` (kept, reported, listed by ``m27 notify status``,
   requeued by ``m27 notify retry``).

The outbox lives in its own file (``$M27_HOME/notify.db``) so the event log stays the
node's append-only history, and the notifier never holds the log's write lock.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from m27._exceptions import StoreError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    seq INTEGER,
    chat_id INTEGER NOT NULL,
    kind TEXT NOT NULL,
    text TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at REAL NOT NULL DEFAULT 0,
    permanent INTEGER NOT NULL DEFAULT 0,
    last_error TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    sent_at REAL,
    UNIQUE (seq, chat_id)
);
CREATE INDEX IF NOT EXISTS outbox_status ON outbox (status, id);
CREATE TABLE IF NOT EXISTS cursors (name TEXT PRIMARY KEY, seq INTEGER NOT NULL);
"""

PENDING, SENT, PARKED = "pending", "sent", "parked"


@dataclass(frozen=True)
class OutboxMessage:
    id: int
    seq: int | None
    chat_id: int
    kind: str
    text: str
    status: str
    attempts: int
    next_at: float
    permanent: bool
    last_error: str
    created_at: float
    sent_at: float | None


@dataclass(frozen=True)
class Draft:
    """A rendered message for one event, before it is fanned out to the chats."""

    seq: int | None
    kind: str
    text: str


def outbox_path(home: Path) -> Path:
    return home / "notify.db"


class Outbox:
    """SQLite-backed queue of messages per chat plus named cursors; one thread per instance."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(path), timeout=30.0, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the notify outbox: {exc}", file=str(path)) from exc

    def close(self) -> None:
        self._db.close()

    # --- cursor + enqueue -------------------------------------------------------------

    def cursor(self, name: str = "notifier") -> int:
        row = self._db.execute("SELECT seq FROM cursors WHERE name = ?", (name,)).fetchone()
        return int(row[0]) if row else 0

    def enqueue(
        self,
        drafts: Iterable[Draft],
        chat_ids: Iterable[int],
        now: float,
        *,
        cursor: int | None = None,
        cursor_name: str = "notifier",
    ) -> int:
        """Insert each draft for each chat and move the cursor, atomically; returns rows added."""
        chats = list(chat_ids)
        added = 0
        try:
            self._db.execute("BEGIN IMMEDIATE")
            for d in drafts:
                for chat in chats:
                    cur = self._db.execute(
                        "INSERT OR IGNORE INTO outbox (seq, chat_id, kind, text, created_at,"
                        " next_at) VALUES (?, ?, ?, ?, ?, ?)",
                        (d.seq, chat, d.kind, d.text, now, now),
                    )
                    added += cur.rowcount
            if cursor is not None:
                self._db.execute(
                    "INSERT INTO cursors (name, seq) VALUES (?, ?)"
                    " ON CONFLICT(name) DO UPDATE SET seq = MAX(seq, excluded.seq)",
                    (cursor_name, cursor),
                )
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            self._db.execute("ROLLBACK")
            raise StoreError(f"cannot write the notify outbox: {exc}", file=str(self.path)) from exc
        return added

    # --- delivery state -----------------------------------------------------------------

    def _rows(self, where: str, params: tuple[object, ...] = ()) -> list[OutboxMessage]:
        rows = self._db.execute(
            "SELECT id, seq, chat_id, kind, text, status, attempts, next_at, permanent,"
            f" last_error, created_at, sent_at FROM outbox WHERE {where} ORDER BY id",
            params,
        ).fetchall()
        return [
            OutboxMessage(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], bool(r[8]), *r[9:])
            for r in rows
        ]

    def pending(self) -> list[OutboxMessage]:
        return self._rows("status = ?", (PENDING,))

    def parked(self) -> list[OutboxMessage]:
        return self._rows("status = ?", (PARKED,))

    def sent(self) -> list[OutboxMessage]:
        return self._rows("status = ?", (SENT,))

    def get(self, msg_id: int) -> OutboxMessage | None:
        rows = self._rows("id = ?", (msg_id,))
        return rows[0] if rows else None

    def mark_sent(self, ids: Sequence[int], now: float) -> None:
        """Messages sent together (one Telegram message), marked in one statement: a crash
        resends all of them or none."""
        marks = ",".join("?" * len(ids))
        self._db.execute(
            f"UPDATE outbox SET status = ?, sent_at = ?, last_error = '' WHERE id IN ({marks})",
            (SENT, now, *ids),
        )

    def mark_failed(self, msg_id: int, attempts: int, next_at: float, error: str) -> None:
        self._db.execute(
            "UPDATE outbox SET attempts = ?, next_at = ?, last_error = ? WHERE id = ?",
            (attempts, next_at, error, msg_id),
        )

    def defer(self, msg_id: int, next_at: float, note: str = "") -> None:
        """Push a message back without counting a failure (flood control, quiet hours)."""
        self._db.execute(
            "UPDATE outbox SET next_at = ?, last_error = ? WHERE id = ?", (next_at, note, msg_id)
        )

    def park(self, msg_id: int, attempts: int, error: str, *, permanent: bool) -> None:
        self._db.execute(
            "UPDATE outbox SET status = ?, attempts = ?, last_error = ?, permanent = ?"
            " WHERE id = ?",
            (PARKED, attempts, error, int(permanent), msg_id),
        )

    def unpark(self, now: float, *, include_permanent: bool = False) -> int:
        """Put parked messages back in line (attempts reset); returns how many."""
        where = "status = ?" + ("" if include_permanent else " AND permanent = 0")
        cur = self._db.execute(
            f"UPDATE outbox SET status = ?, attempts = 0, next_at = ?, permanent = 0 WHERE {where}",
            (PENDING, now, PARKED),
        )
        return int(cur.rowcount)

    def counts(self) -> dict[str, int]:
        out = {PENDING: 0, SENT: 0, PARKED: 0}
        for status, n in self._db.execute("SELECT status, COUNT(*) FROM outbox GROUP BY status"):
            out[str(status)] = int(n)
        return out

    def prune_sent(self, before: float) -> int:
        """Forget sent messages older than `before` (they are history in the event log)."""
        cur = self._db.execute(
            "DELETE FROM outbox WHERE status = ? AND sent_at < ?", (SENT, before)
        )
        return int(cur.rowcount)
