"""The ``run`` column of the SQLite log: which run each event belongs to, indexed.

Why: ``m27 status``, ``m27 runs``, ``m27 logs`` and ``m27 cancel`` each show a few runs,
yet folded the whole log to find them, and a busy node's log grows without end (480k
events, a year of 40 runs a day, took 1.3 s a command here, linear in the log). With the
run of each row stored beside it (NULL for the node's own events: agent starts, GPU
alerts), a command reads every run's own events (a few per run) to list them, then the
few runs it shows in full through the index (``SqliteEventStore.read_runs``).

A log written before the column existed (schema version 2) gets it when a version-3 m27
first opens it: every row is decoded once to find its run (about 4 s per million events
here, inside the open's write transaction; other processes wait for it).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection

from m27._exceptions import UnknownEventError
from m27.events import EVENT_TYPES, Event, Layouts, RunEvent, decode_records, decode_row, run_kinds

__all__ = [
    "INDEX",
    "add_run_column",
    "belongs",
    "fill",
    "has_run_column",
    "selection",
    "unfilled",
]

INDEX = "CREATE INDEX IF NOT EXISTS events_by_run ON events (run, seq)"

#: Rows decoded per batch while a version-2 log gets its run column.
_BATCH = 10_000

#: Past this many runs a read of them by name is near a whole read: it is one.
MANY_RUNS = 500

#: The kinds about a run as a whole (what an outline reads), and every kind that names a
#: run (steps' too); m27.events registers every kind before this module is imported.
_RUN_KINDS = run_kinds()
_OWN_KINDS = tuple(sorted(_RUN_KINDS))
_NAMING_KINDS = tuple(sorted(n for n, cls in EVENT_TYPES.items() if issubclass(cls, RunEvent)))


def has_run_column(conn: sqlite3.Connection) -> bool:
    return any(row[1] == "run" for row in conn.execute("PRAGMA table_info(events)"))


def add_run_column(conn: sqlite3.Connection, layouts: Layouts) -> None:
    """Add and fill the column in a log that lacks it (inside the caller's transaction).

    A row this m27 cannot decode (an unknown kind) keeps NULL: a read of it fails later
    as it always did, naming the row."""
    conn.execute("ALTER TABLE events ADD COLUMN run TEXT")
    after = 0
    while True:
        rows = conn.execute(
            "SELECT seq, kind, version, payload FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
            (after, _BATCH),
        ).fetchall()
        if not rows:
            return
        fill(conn, rows, layouts)
        after = rows[-1][0]


def unfilled(conn: sqlite3.Connection) -> list[tuple[int, str, int, str]]:
    """Rows of a kind that names a run, stored without it: what an m27 from before the
    column appends while it still runs beside this one (an agent not restarted after an
    upgrade). Found through the index (the node's own events are the only other rows
    without a run: a few per agent start and GPU alert)."""
    return conn.execute(
        "SELECT seq, kind, version, payload FROM events WHERE run IS NULL"
        f" AND kind IN ({', '.join('?' * len(_NAMING_KINDS))})",
        _NAMING_KINDS,
    ).fetchall()


def fill(conn: sqlite3.Connection, rows: list[tuple[int, str, int, str]], layouts: Layouts) -> None:
    """Store the run of each of `rows` in its column."""
    conn.executemany("UPDATE events SET run = ? WHERE seq = ?", _runs_of(rows, layouts))


def _runs_of(rows: list[tuple[int, str, int, str]], layouts: Layouts) -> list[tuple[str, int]]:
    """(run, seq) of each row that names a run; a row this m27 cannot decode is left out."""
    try:
        events = [(r.seq, r.event) for r in decode_records(rows, layouts)]
    except UnknownEventError:
        events = []
        for seq, kind, version, payload in rows:
            try:
                events.append((seq, decode_row(kind, version, payload, layouts)))
            except UnknownEventError:
                continue
    return [(run, seq) for seq, ev in events if (run := getattr(ev, "run_id", None)) is not None]


def selection(runs: Collection[str], outline: bool) -> tuple[str, tuple[str, ...]] | None:
    """The WHERE clause (after ``seq > ?``) and its values for ``read_runs``; None when a
    whole read is as good (every run named, or too many)."""
    if len(runs) > MANY_RUNS:
        return None
    terms, values = [], tuple(runs)
    if runs:
        terms.append(f"run IN ({', '.join('?' * len(runs))})")
    if outline:
        terms += ["run IS NULL", f"kind IN ({', '.join('?' * len(_OWN_KINDS))})"]
        values += _OWN_KINDS
    return (" OR ".join(terms) or "0"), values


def belongs(event: Event, runs: Collection[str], outline: bool) -> bool:
    """Whether ``read_runs(runs, outline=outline)`` returns `event`."""
    run = getattr(event, "run_id", None)
    if run is None:
        return outline
    return run in runs or (outline and event.kind in _RUN_KINDS)
