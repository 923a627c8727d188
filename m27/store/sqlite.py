"""The default event store: one SQLite file in WAL mode, shared by every process of a node.

Why SQLite: the CLI, the Prefect flow (from several task threads), each step's child process
(writing ``CheckpointWritten``) and the agent all append to the same log, and SQLite gives
them a total order with no server to run. Promises:

- ``seq`` is gapless and increasing: a writer takes the write lock (``BEGIN IMMEDIATE``),
  reads the last ``seq`` and inserts ``last + 1 ...`` explicitly, so a rolled-back batch
  never burns numbers the way AUTOINCREMENT would.
- A batch is atomic: all of its events are committed, or none (also under ``kill -9``).
- WAL with ``synchronous=NORMAL``: a commit survives a process crash; a power cut may lose
  the last few milliseconds of commits, never corrupt the file (64k events/s instead of
  6.4k, see shared/notes/limits.md). Losing a tail is recoverable: the agent finds steps
  whose processes are gone and requeues them from their last checkpoint.
- ``follow`` wakes within a few milliseconds of another process's commit by polling
  ``PRAGMA data_version`` (a read of shared memory) with a short adaptive sleep, and at once
  for appends made through the same store object.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path

from m27._exceptions import StoreError, UnknownEventError
from m27._gc import collector_paused
from m27.events import (
    Event,
    Layouts,
    Recorded,
    current_layouts,
    decode_group,
    decode_records,
    decode_row,
    encode_positional,
)
from m27.paths import home_problem
from m27.store import _encode
from m27.store._runs import (
    INDEX,
    add_run_column,
    belongs,
    fill,
    has_run_column,
    selection,
    unfilled,
)
from m27.store._sql import data_version, rollback, transaction, why_failed

#: The layout of the file; bump it (and migrate) when tables change. 2: the ``layouts``
#: table and positional payloads (a file of version 1 is migrated when opened). 3: the
#: ``run`` column and its index (m27.store._runs; added to an older file when opened).
SCHEMA_VERSION = 3
#: The event log's file name in $M27_HOME.
LOG_NAME = "events.db"

_MIN_POLL_S = 0.0005
_MAX_POLL_S = 0.005
_MAX_IDLE_CONNECTIONS = 8

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY, kind TEXT NOT NULL,"
    " version INT NOT NULL, at REAL NOT NULL, payload TEXT NOT NULL, run TEXT)",
    "CREATE TABLE IF NOT EXISTS cursors (name TEXT PRIMARY KEY, seq INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS layouts (kind TEXT NOT NULL, version INT NOT NULL,"
    " fields TEXT NOT NULL, PRIMARY KEY (kind, version))",
)


class SqliteEventStore:
    """An :class:`~m27.store.EventStore` in one SQLite file.

    Safe to share between threads: each operation borrows a connection from a small pool,
    so task threads append concurrently and SQLite's lock orders them. Safe across
    processes: each process opens its own store on the same path.
    """

    def __init__(
        self, path: Path | str, *, busy_timeout: float = 10.0, max_poll: float = _MAX_POLL_S
    ) -> None:
        self.path = Path(path)
        self._busy_timeout = busy_timeout
        # Each idle poll costs a wake-up (~70 us on a small VM): the 5 ms default keeps an
        # idle follower near 3% of a core; a tailer that can wait longer passes more.
        self._max_poll = max(_MIN_POLL_S, max_poll)
        self._lock = threading.Lock()
        self._idle: list[sqlite3.Connection] = []
        self._pid = os.getpid()
        self._closed = False
        # In-process appends wake followers at once; other processes are seen by polling.
        self._appended = threading.Condition()
        self._generation = 0
        self._layouts = Layouts({})
        conn = self._connect()
        try:
            self._layouts = self._init_schema(conn)
        except BaseException:
            conn.close()
            raise
        self._idle.append(conn)

    # --- connections ------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=self._busy_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise self._error(f"open event log {self.path}", exc) from exc
        try:
            with self._failing("open event log"):
                conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
                mode = self._set_wal(conn)
                if mode.lower() != "wal":
                    raise StoreError(
                        f"event log {self.path} cannot use WAL mode (got {mode!r}); "
                        "put $M27_HOME on a local filesystem",
                        file=str(self.path),
                    )
                conn.execute("PRAGMA synchronous = NORMAL")
        except BaseException:
            conn.close()
            raise
        return conn

    def _set_wal(self, conn: sqlite3.Connection) -> str:
        # Switching a fresh file to WAL needs an exclusive lock; several processes opening
        # the same new file at once can see "locked" here without the busy handler.
        deadline = time.monotonic() + self._busy_timeout
        while True:
            try:
                row = conn.execute("PRAGMA journal_mode = WAL").fetchone()
                return str(row[0])
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.005)

    def _init_schema(self, conn: sqlite3.Connection) -> Layouts:
        """Create or migrate the tables; record this m27's layouts; return the file's."""
        with self._failing("open event log"), transaction(conn):
            has_meta = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
            ).fetchone()
            if has_meta:
                row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                found = int(row[0]) if row else SCHEMA_VERSION
                if found > SCHEMA_VERSION:
                    raise StoreError(
                        f"event log {self.path} has schema version {found}, this m27 "
                        f"knows up to {SCHEMA_VERSION}: upgrade m27 to read it",
                        file=str(self.path),
                        version=found,
                    )
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('schema_version', ?)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(SCHEMA_VERSION),),
            )
            # A (kind, version) recorded already keeps its layout: rows were written in it.
            recorded = conn.execute("SELECT kind, version, fields FROM layouts").fetchall()
            known = {(kind, version) for kind, version, _ in recorded}
            missing = [
                (kind, version, json.dumps(names))
                for (kind, version), names in current_layouts().items()
                if (kind, version) not in known
            ]
            if missing:
                conn.executemany(
                    "INSERT INTO layouts (kind, version, fields) VALUES (?, ?, ?)", missing
                )
                recorded += missing
            layouts = Layouts(
                {(kind, version): self._layout(kind, fields) for kind, version, fields in recorded}
            )
            if not has_run_column(conn):
                add_run_column(conn, layouts)
            conn.execute(INDEX)
        return layouts

    def _layout(self, kind: str, fields: str) -> list[str]:
        """One recorded layout, checked: a list of field names."""
        try:
            names = json.loads(fields)
        except (TypeError, ValueError):
            names = None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise StoreError(
                f"event log {self.path} has a garbled layout for {kind}: {fields!r}",
                file=str(self.path),
                kind=kind,
            )
        return names

    @contextlib.contextmanager
    def _conn(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._closed:
                raise StoreError(f"event log {self.path} is closed", file=str(self.path))
            if os.getpid() != self._pid:
                # A forked child must not use its parent's SQLite handles; drop, don't close.
                self._idle = []
                self._pid = os.getpid()
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._connect()
        try:
            yield conn
        finally:
            reusable = not conn.in_transaction
            with self._lock:
                if reusable and not self._closed and len(self._idle) < _MAX_IDLE_CONNECTIONS:
                    self._idle.append(conn)
                    conn = None
            if conn is not None:
                conn.close()

    # --- the EventStore protocol ------------------------------------------------------

    def append(self, events: Sequence[Event]) -> int:
        if not events:
            return self.last_seq()
        # Encoded before the write lock is taken: other writers wait only for the inserts.
        encoded = _encoded(events, self._layouts.writes)
        with self._conn() as conn, self._failing("append to event log"), transaction(conn):
            (last,) = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()
            conn.executemany(
                "INSERT INTO events (seq, kind, version, payload, at, run)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [(last + i, *row) for i, row in enumerate(encoded, start=1)],
            )
        with self._appended:
            self._generation += 1
            self._appended.notify_all()
        return int(last) + len(events)

    def read(self, after: int = 0, limit: int | None = None) -> list[Recorded]:
        with self._conn() as conn:
            return self._read(conn, after, limit)

    def read_runs(
        self, runs: Collection[str], *, outline: bool = False, after: int = 0
    ) -> list[Recorded]:
        where = selection(runs, outline)
        if where is None or not self._runs_filled():
            return [r for r in self.read(after) if belongs(r.event, runs, outline)]
        clause, values = where
        with self._conn() as conn, self._failing("read event log"):
            cursor = conn.execute(_ROWS + f" AND ({clause}) ORDER BY seq", (after, *values))
            return self._chunks(cursor, cursor.fetchmany(_CHUNK))

    def _runs_filled(self) -> bool:
        """Whether every row that names a run has it in its column, after filling in those
        an older m27 appended without it (m27.store._runs.unfilled); False when they could
        not be filled: then the whole log is read."""
        with self._conn() as conn, self._failing("read event log"):
            rows = unfilled(conn)
            if not rows:
                return True
            try:
                with transaction(conn):
                    fill(conn, rows, self._layouts)
            except sqlite3.Error:
                return False
            return True

    def last_seq(self) -> int:
        with self._conn() as conn, self._failing("read event log"):
            (last,) = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()
            return int(last)

    def follow(self, after: int, timeout: float, limit: int | None = None) -> list[Recorded]:
        deadline = time.monotonic() + max(0.0, timeout)
        with self._conn() as conn:
            # Read the version before the rows: a commit landing in between changes it.
            version = data_version(conn)
            with self._appended:
                generation = self._generation
            records = self._read(conn, after, limit)
            delay = _MIN_POLL_S
            while not records:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                with self._appended:
                    if self._generation == generation:
                        self._appended.wait(min(delay, remaining))
                    generation = self._generation
                now_version = data_version(conn)
                if now_version != version:
                    version = now_version
                    records = self._read(conn, after, limit)
                delay = min(delay * 2, self._max_poll)
            return records

    def get_cursor(self, name: str) -> int:
        with self._conn() as conn, self._failing(f"read cursor {name!r} in"):
            row = conn.execute("SELECT seq FROM cursors WHERE name = ?", (name,)).fetchone()
            return int(row[0]) if row else 0

    def set_cursor(self, name: str, seq: int) -> None:
        if seq < 0:
            raise StoreError(f"cursor {name!r} cannot move to {seq} (< 0)", cursor=name)
        with self._conn() as conn, self._failing(f"move cursor {name!r} in"):
            conn.execute(
                "INSERT INTO cursors (name, seq) VALUES (?, ?)"
                " ON CONFLICT (name) DO UPDATE SET seq = excluded.seq",
                (name, seq),
            )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        with self._appended:
            self._appended.notify_all()

    def __enter__(self) -> SqliteEventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SqliteEventStore({str(self.path)!r})"

    # --- helpers ----------------------------------------------------------------------

    def _error(self, what: str, exc: sqlite3.Error) -> StoreError:
        return StoreError(f"cannot {what}: {why_failed(self.path, exc)}", file=str(self.path))

    @contextlib.contextmanager
    def _failing(self, what: str) -> Iterator[None]:
        """An sqlite3 error inside becomes a StoreError: ``cannot <what> <file>: <error>``."""
        try:
            yield
        except sqlite3.Error as exc:
            raise self._error(f"{what} {self.path}", exc) from exc

    def _read(self, conn: sqlite3.Connection, after: int, limit: int | None) -> list[Recorded]:
        """Rows after `after`, decoded; fetched and decoded in chunks of :data:`_CHUNK`.

        Chunks, not one ``fetchall``: each chunk's rows are freed before the next is
        fetched, so their memory is reused while still in the CPU's caches (~0.5 us per
        event less CPU in a 300k replay on this VM). A read sees one log: the first
        statement's snapshot is kept to the end (by it, or by :meth:`_spans`).
        """
        with self._failing("read event log"):
            cursor = conn.execute(
                _ROWS + " ORDER BY seq LIMIT ?", (after, -1 if limit is None else limit)
            )
            rows = cursor.fetchmany(_CHUNK)
            if len(rows) < _CHUNK:
                return self._decode(rows)  # the common read: a follower's few new events
            if limit is None:
                with collector_paused():
                    return self._spans(conn, cursor, self._decode(rows))
            return self._chunks(cursor, rows)

    def _chunks(
        self, cursor: sqlite3.Cursor, rows: list[tuple[int, str, int, str]]
    ) -> list[Recorded]:
        """`rows` (the first chunk) and the rest of `cursor`'s, decoded chunk by chunk."""
        if len(rows) < _CHUNK:
            return self._decode(rows)
        out: list[Recorded] = []
        with collector_paused():
            while rows:
                out += self._decode(rows)
                rows = cursor.fetchmany(_CHUNK)
        return out

    def _spans(
        self, conn: sqlite3.Connection, pending: sqlite3.Cursor, out: list[Recorded]
    ) -> list[Recorded]:
        """The log after `out` (a read's first chunk; its statement `pending` holds the
        snapshot) in spans of :data:`_CHUNK` seqs. A span that holds all its seqs
        (``seq`` is gapless) of positional rows at version 1 is read joined into one row
        (:meth:`_joined`); any other span, and the next :data:`_JOINED_WAIT` after it,
        as the rows themselves (:func:`m27.events.decode_records`)."""
        conn.execute("BEGIN")  # keeps the pending statement's snapshot after it ends
        try:
            pending.close()
            start = out[-1].seq
            (last,) = conn.execute("SELECT MAX(seq) FROM events").fetchone()
            wait = 0  # spans to read row by row before the next joined read is tried
            while start < last:
                end = start + _CHUNK
                got = None if wait else self._joined(conn, start, end)
                wait = max(wait - 1, 0) if wait or got is not None else _JOINED_WAIT
                if got is None:  # a gap, another version, named or garbled rows
                    rows = conn.execute(_ROWS + " AND seq <= ? ORDER BY seq", (start, end))
                    got = self._decode(rows.fetchall())
                out += got
                start = end
        finally:
            rollback(conn)  # it only read: nothing to keep
        return out

    def _joined(self, conn: sqlite3.Connection, start: int, end: int) -> list[Recorded] | None:
        """The span read joined (:data:`_JOINED`, :func:`m27.events.decode_group`), or None."""
        kinds, payloads, count, low, high, tail = conn.execute(_JOINED, (start, end)).fetchone()
        if count != _CHUNK or low != 1 or high != 1 or tail.__class__ is not str:
            return None  # a gap, another version, or a payload stored as a blob
        if not payloads.endswith(tail + "]"):
            return None  # not the rows in seq order
        try:
            return decode_group(start, kinds, payloads, count, self._layouts)
        except UnknownEventError:
            return None

    def _decode(self, rows: list[tuple[int, str, int, str]]) -> list[Recorded]:
        try:
            return decode_records(rows, self._layouts)
        except UnknownEventError:
            pass  # decode again one by one below, to name the row that failed
        out: list[Recorded] = []
        for seq, kind, version, payload in rows:
            try:
                ev = decode_row(kind, version, payload, self._layouts)
            except UnknownEventError as exc:
                raise UnknownEventError(
                    f"{exc.message} (seq {seq} in {self.path})",
                    **{**exc.context, "seq": seq, "file": str(self.path)},
                ) from exc
            out.append(Recorded(seq, ev))
        return out


#: Reads fetch and decode this many rows at a time; a read of more runs with the cyclic
#: garbage collector paused.
_CHUNK = 1000
_MANY_ROWS = _CHUNK
_ROWS = "SELECT seq, kind, version, payload FROM events WHERE seq > ?"
#: A span's rows in one: kinds (space-separated), payloads (one JSON array), count, lowest
#: and highest version, and the last row's payload (checks that they were joined in order).
_JOINED = (
    "SELECT group_concat(kind, ' '), '[' || group_concat(payload, ',') || ']', count(*),"
    " min(version), max(version), (SELECT payload FROM events WHERE seq = ?2)"
    " FROM events WHERE seq > ?1 AND seq <= ?2"
)
#: Spans read row by row after one that could not be read joined (an older log's rows).
_JOINED_WAIT = 16


def _encoded(
    events: Sequence[Event], positional: frozenset[type[Event]]
) -> list[tuple[str, int, str, float, str | None]]:
    """(kind, version, payload, at, run) per event; one that fails to encode refuses the
    batch.

    Positional where the file's layout of the kind is its class's field order and every
    value is plain (:func:`m27.events.encode_positional`), named otherwise.
    """
    out = []
    for ev in events:
        row = encode_positional(ev) if type(ev) in positional else None
        out.append((*(row or _encode(ev)), ev.at, getattr(ev, "run_id", None)))
    return out


def open_store(home: Path | None = None, *, max_poll: float = _MAX_POLL_S) -> SqliteEventStore:
    """The node's event log, ``$M27_HOME/events.db``, creating the directory if needed."""
    from m27.config import m27_home

    home = m27_home() if home is None else Path(home)
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(home_problem(home, exc), file=str(home)) from exc
    return SqliteEventStore(home / LOG_NAME, max_poll=max_poll)
