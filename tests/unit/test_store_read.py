"""A big read of the sqlite log (a replay) gives exactly what reading each row alone gives.

A read of more than one chunk reads each gapless span of positional rows joined into one
row by SQLite (:func:`m27.events.decode_group`) and every other span row by row; these
tests mix every kind, named and positional rows, a row at another version, values that
stay named, a gap and garbled rows, and compare the result with the checked one-row
decode and with the projection built by applying the same events one by one.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from m27._exceptions import UnknownEventError
from m27.events import (
    EVENT_TYPES,
    Event,
    GpuLost,
    Recorded,
    RunEvent,
    StepEvent,
    decode_row,
    encode,
)
from m27.events.state import apply, fold
from m27.store import sqlite as sqlite_store
from m27.store.sqlite import SqliteEventStore
from tests.unit.event_samples import sample_event

ALL = sorted(EVENT_TYPES.values(), key=lambda c: c.__name__)
#: A small chunk, so that a log of a few hundred rows is read in many spans.
CHUNK = 16


def _mixed(count: int) -> list[Event]:
    """Every kind in turn, about a few runs and steps, so the projection has content."""
    out: list[Event] = []
    for i in range(count):
        cls = ALL[i % len(ALL)]
        changes: dict[str, Any] = {"at": 1_700_000_000.0 + i}
        if issubclass(cls, RunEvent):
            changes["run_id"] = f"r-{i % 3}"
        if issubclass(cls, StepEvent):
            changes["step"] = f"s-{i % 4}"
        out.append(dataclasses.replace(sample_event(cls), **changes))
    return out


def _rows(path: Path) -> list[tuple[int, str, int, str]]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT seq, kind, version, payload FROM events ORDER BY seq")
        return rows.fetchall()


def _insert(path: Path, *rows: tuple[int, str, int, str]) -> None:
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO events (seq, kind, version, at, payload) VALUES (?, ?, ?, 0, ?)", rows
        )
    conn.close()


def _one_by_one(store: SqliteEventStore, path: Path) -> list[Recorded]:
    """What the checked path makes of each row alone."""
    return [Recorded(s, decode_row(k, v, p, store._layouts)) for s, k, v, p in _rows(path)]


def _same(got: list[Recorded], want: list[Recorded]) -> None:
    assert got == want
    for a, b in zip(got, want, strict=True):
        assert type(a.event) is type(b.event)
        for f in dataclasses.fields(b.event):
            assert type(getattr(a.event, f.name)) is type(getattr(b.event, f.name)), f.name
        assert list(a.event.__dict__) == list(b.event.__dict__)  # the same compact dict


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_store, "_CHUNK", CHUNK)


@pytest.mark.usefixtures("small_chunks")
def test_a_big_read_of_a_mixed_log_equals_reading_each_row_alone(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    events = _mixed(CHUNK * 12 + 5)
    with SqliteEventStore(path) as store:
        for first in range(0, len(events), 7):
            store.append(events[first : first + 7])
        last = len(events)
        # rows m27 writes named (an int beyond 64 bits), an older log's named rows, a row
        # at version 0 (read as named, defaults filled), a payload stored as a blob
        big = GpuLost(at=2.0, gpu=2**70)
        named = events[3]
        _insert(
            path,
            (last + 1, *encode(big)),
            (last + 2, *encode(named)),
            (last + 3, "GpuLost", 0, '{"at":3.0,"gpu":1}'),
            (last + 4, "GpuLost", 1, b'{"at":4.0,"gpu":2}'),  # type: ignore[arg-type]
        )
        store.append(events[: CHUNK * 3])
        records = store.read()
        assert len(records) == last + 4 + CHUNK * 3
        _same(records, _one_by_one(store, path))
        assert records[last].event == big and records[last].event.gpu == 2**70  # type: ignore[attr-defined]
        # the same log paged with a limit (the chunked path of one statement) agrees
        paged: list[Recorded] = []
        while page := store.read(after=paged[-1].seq if paged else 0, limit=CHUNK * 2 + 3):
            paged += page
        _same(paged, records)
        assert store.read(after=5, limit=0) == []
        _same(store.read(after=CHUNK * 5 + 3), records[CHUNK * 5 + 3 :])


def test_replaying_a_mixed_log_builds_the_projection_of_its_events_one_by_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.db"
    events = _mixed(sqlite_store._CHUNK * 3 + 17)
    with SqliteEventStore(path) as store:
        for first in range(0, len(events), 100):
            store.append(events[first : first + 100])
        records = store.read()
    state = None
    for seq, event in enumerate(events, start=1):  # one at a time, as the agent applies them
        state = apply(state if state is not None else fold([]), Recorded(seq, event))
    replayed = fold(records)
    assert replayed == state
    assert replayed.last_seq == len(events) and replayed.runs  # the log had content


def test_fold_does_what_apply_does_for_records_events_and_kinds_without_a_handler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from m27.events._handlers import _HANDLERS

    monkeypatch.delitem(_HANDLERS, GpuLost)  # a kind added without a handler
    events = _mixed(len(ALL) * 4)
    mixed: list[Recorded | Event] = [
        Recorded(seq, e) if seq % 3 else e for seq, e in enumerate(events, start=1)
    ]
    state = fold([])
    for rec in mixed:
        apply(state, rec)
    folded = fold(mixed)
    assert folded == state
    assert folded.unhandled_kinds == {"GpuLost"}
    assert folded.last_seq == max(r.seq for r in mixed if isinstance(r, Recorded))


@pytest.mark.usefixtures("small_chunks")
@pytest.mark.parametrize("garble", ["", '[1.0,"r","s",1],[2.0,"r","s",2]', '[1.0,"r"'])
def test_spans_read_joined_give_the_same_records_and_a_garbled_row_still_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, garble: str
) -> None:
    """Most spans of a log of plain positional rows are read joined (one row per span);
    a row that is not one JSON value of its own sends its span to the checked path."""
    path = tmp_path / "events.db"
    events = [e for e in _mixed(CHUNK * 40) if not hasattr(type(e), "__post_init__")]
    joined: list[bool] = []
    real = sqlite_store.decode_group  # type: ignore[attr-defined]

    def spy(*args: Any) -> Any:
        got = real(*args)
        joined.append(got is not None)
        return got

    monkeypatch.setattr(sqlite_store, "decode_group", spy)
    with SqliteEventStore(path) as store:
        store.append(events)
        if garble:
            bad = len(events) + 1
            _insert(path, (bad, "GuestPaused", 1, garble))
            store.append(events[: CHUNK * 2])
            with pytest.raises(UnknownEventError, match=f"seq {bad} in {path}"):
                store.read()
            return
        records = store.read()
        _same(records, _one_by_one(store, path))
    assert sum(joined) >= len(events) // CHUNK // 2


@pytest.mark.usefixtures("small_chunks")
def test_a_gap_in_the_seqs_is_read_with_the_seqs_it_has(tmp_path: Path) -> None:
    """m27 writes no gaps; a log with one (edited, or pruned) still reads exactly."""
    path = tmp_path / "events.db"
    events = _mixed(CHUNK * 4)
    with SqliteEventStore(path) as store:
        store.append(events)
        with sqlite3.connect(path) as conn:
            conn.execute("DELETE FROM events WHERE seq IN (?, ?)", (CHUNK * 2 + 3, CHUNK * 3))
        conn.close()
        records = store.read()
        _same(records, _one_by_one(store, path))
        assert len(records) == len(events) - 2
        assert CHUNK * 2 + 3 not in {r.seq for r in records}


@pytest.mark.usefixtures("small_chunks")
def test_a_garbled_row_in_a_span_fails_naming_its_seq_and_file(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    with SqliteEventStore(path) as store:
        store.append(_mixed(CHUNK * 3))
        bad = CHUNK * 3 + 1
        _insert(path, (bad, "GpuLost", 1, "[1.0, 2, 3]"))
        store.append(_mixed(CHUNK))
        with pytest.raises(UnknownEventError, match=f"seq {bad} in {path}"):
            store.read()


@pytest.mark.usefixtures("small_chunks")
def test_a_big_read_sees_one_log_while_another_process_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "events.db"
    events = _mixed(CHUNK * 6)
    with SqliteEventStore(path) as store, SqliteEventStore(path) as other:
        store.append(events)
        real = sqlite_store.decode_records  # type: ignore[attr-defined]
        calls: list[int] = []

        def append_meanwhile(*args: Any) -> Any:
            if not calls:  # after the read's first statement, before the rest is read
                other.append(_mixed(CHUNK * 2))
            calls.append(1)
            return real(*args)

        monkeypatch.setattr(sqlite_store, "decode_records", append_meanwhile)
        records = store.read()
        assert calls and [r.event for r in records] == events
        assert len(store.read()) == len(events) + CHUNK * 2  # seen by the next read
