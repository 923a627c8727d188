"""Positional rows (schema version 2): written by m27, read back exactly, old rows still read.

A log written before holds named rows (JSON objects) and no ``layouts`` table; opening it
migrates it, and from then on both formats are read side by side. Anything m27 did not
write (a garbled array, a wrong number of values, a missing layout) fails with an
UnknownEventError naming the kind, the seq and the file, never with a traceback.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
from pathlib import Path

import pytest

from m27._exceptions import StoreError, UnknownEventError
from m27.events import (
    EVENT_TYPES,
    Event,
    GpuLost,
    GuestResumed,
    Layouts,
    LeaseGranted,
    Recorded,
    RunEvent,
    RunSubmitted,
    RunSucceeded,
    StepStarted,
    current_layouts,
    decode,
    decode_records,
    decode_row,
    encode,
    encode_positional,
    run_kinds,
)
from m27.store.sqlite import SCHEMA_VERSION, SqliteEventStore
from tests.unit.event_samples import sample_event

ALL = sorted(EVENT_TYPES.values(), key=lambda c: c.__name__)
LAYOUTS = Layouts(current_layouts())


def _same(again: Event, original: Event) -> None:
    assert again == original
    for f in dataclasses.fields(original):
        assert type(getattr(again, f.name)) is type(getattr(original, f.name)), f.name


def _rows(path: Path) -> list[tuple[int, str, int, str]]:
    with sqlite3.connect(path) as conn:
        return conn.execute(
            "SELECT seq, kind, version, payload FROM events ORDER BY seq"
        ).fetchall()


def _insert(path: Path, *rows: tuple[int, str, int, str]) -> None:
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO events (seq, kind, version, at, payload) VALUES (?, ?, ?, 0, ?)", rows
        )
    conn.close()


@pytest.mark.parametrize("cls", ALL)
def test_every_kind_round_trips_positionally(cls: type[Event]) -> None:
    original = sample_event(cls)
    row = encode_positional(original)
    assert row is not None
    kind, version, payload = row
    values = json.loads(payload)
    assert values == json.loads(
        json.dumps([getattr(original, f.name) for f in dataclasses.fields(cls)])
    )
    assert len(payload) < len(encode(original)[2])  # the names are not repeated
    [record] = decode_records([(5, kind, version, payload)], LAYOUTS)
    assert record == Recorded(5, original)
    _same(record.event, original)
    _same(decode_row(kind, version, payload, LAYOUTS), original)  # the checked path agrees
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.event.at = 0.0  # type: ignore[misc]
    # built like __init__ builds it: the same compact key-sharing dict, in field order
    assert list(record.event.__dict__) == [f.name for f in dataclasses.fields(cls)]


@pytest.mark.parametrize("cls", ALL)
def test_the_compiled_builder_takes_over_and_builds_the_same_events(cls: type[Event]) -> None:
    from m27.events._rows import _BUILDERS, _COMPILE_AFTER

    layouts = Layouts(current_layouts())
    events = [
        dataclasses.replace(sample_event(cls), at=float(i)) for i in range(_COMPILE_AFTER * 2)
    ]
    rows = [(i, *row) for i, ev in enumerate(events, start=1) if (row := encode_positional(ev))]
    records = decode_records(rows, layouts)
    assert layouts.fast[cls.__name__] is _BUILDERS[cls]  # compiled after the first rows
    assert [r.event for r in records] == events
    assert [r.seq for r in records] == list(range(1, len(events) + 1))
    for record in (records[0], records[-1]):  # the plain builder's and the compiled one's
        _same(record.event, events[record.seq - 1])
        assert list(record.event.__dict__) == [f.name for f in dataclasses.fields(cls)]
    # a garbled row after the switch still takes the checked path
    with pytest.raises(UnknownEventError, match="has 1 values"):
        decode_records([(1, cls.__name__, cls.version, "[1.0]")], layouts)


def test_the_store_writes_every_kind_positionally_and_reads_it_back(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    events = [sample_event(cls) for cls in ALL] * 2
    with SqliteEventStore(path) as store:
        store.append(events)
        assert [r.event for r in store.read()] == events
        assert [r.event for r in store.read(after=3, limit=5)] == events[3:8]
    assert all(payload.startswith("[") for *_, payload in _rows(path))
    with SqliteEventStore(path) as again:  # another process opening the same file
        assert [r.event for r in again.read()] == events


class _Name(str):
    pass


@pytest.mark.parametrize(
    "ev",
    [
        StepStarted(
            at=1.0,
            run_id="r",
            step="s",
            attempt=1,
            pid=2,
            pgid=2,
            command=("md",),
            pid_started=float("nan"),
        ),
        StepStarted(at=1.0, run_id="r", step="s", attempt=1, pid=2**70, pgid=2, command=("md",)),
        StepStarted(at=1.0, run_id="r", step="\ud800", attempt=1, pid=2, pgid=2, command=()),
        StepStarted(at=1.0, run_id="r", step=_Name("s"), attempt=1, pid=2, pgid=2, command=()),
    ],
    ids=["nan", "bigint", "surrogate", "str-subclass"],
)
def test_values_orjson_cannot_write_stay_named(tmp_path: Path, ev: Event) -> None:
    assert encode_positional(ev) is None
    path = tmp_path / "events.db"
    with SqliteEventStore(path) as store:
        store.append([ev, GpuLost(at=2.0, gpu=1)])
        [first, second] = store.read()
    [(_, _, _, named), (_, _, _, positional)] = _rows(path)
    assert named.startswith("{") and positional.startswith("[")
    assert second.event == GpuLost(at=2.0, gpu=1)
    for f in dataclasses.fields(ev):
        want, got = getattr(ev, f.name), getattr(first.event, f.name)
        if isinstance(want, float) and math.isnan(want):
            assert isinstance(got, float) and math.isnan(got)
        else:
            assert got == want


def _old_log(path: Path, events: list[Event]) -> None:
    """A log as m27 wrote it before schema version 2: named rows, no layouts table."""
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute(
            "CREATE TABLE events (seq INTEGER PRIMARY KEY, kind TEXT NOT NULL,"
            " version INT NOT NULL, at REAL NOT NULL, payload TEXT NOT NULL)"
        )
        conn.execute("CREATE TABLE cursors (name TEXT PRIMARY KEY, seq INTEGER NOT NULL)")
        conn.execute("INSERT INTO meta VALUES ('schema_version', '1')")
        conn.execute("INSERT INTO cursors VALUES ('notify', 2)")
        conn.executemany(
            "INSERT INTO events (seq, kind, version, payload, at) VALUES (?, ?, ?, ?, ?)",
            [(i, *encode(ev), ev.at) for i, ev in enumerate(events, start=1)],
        )
    conn.close()


def test_an_old_log_is_migrated_and_its_named_rows_read_beside_new_ones(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    old = [sample_event(cls) for cls in ALL]
    _old_log(path, old)
    new = [sample_event(cls) for cls in reversed(ALL)]
    with SqliteEventStore(path) as store:
        assert store.get_cursor("notify") == 2
        store.append(new[:10])
        store.append(new[10:])
        records = store.read()
        assert [r.seq for r in records] == list(range(1, 2 * len(ALL) + 1))
        assert [r.event for r in records] == old + new
        for again, original in zip(records, old + new, strict=True):
            _same(again.event, original)
        assert [r.event for r in store.follow(after=len(ALL) - 1, timeout=0)] == old[-1:] + new
    payloads = [payload for *_, payload in _rows(path)]
    assert all(p.startswith("{") for p in payloads[: len(ALL)])
    assert all(p.startswith("[") for p in payloads[len(ALL) :])
    with sqlite3.connect(path) as conn:
        (version,) = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        recorded = conn.execute("SELECT kind, version, fields FROM layouts").fetchall()
    conn.close()
    assert int(version) == SCHEMA_VERSION == 3
    assert {(k, v): tuple(json.loads(f)) for k, v, f in recorded} == current_layouts()


def test_a_log_without_the_run_column_gets_it_filled_when_opened(tmp_path: Path) -> None:
    """A version-2 log (before the ``run`` column): opened, each row gets its run, so
    ``read_runs`` finds the events it already held; a row of a kind this m27 does not
    know keeps none, and the read that meets it still fails, naming it."""
    path = tmp_path / "events.db"
    runs = [
        dataclasses.replace(sample_event(cls), run_id=f"r{i % 3}")
        for i, cls in enumerate(ALL)
        if issubclass(cls, RunEvent)
    ]
    node = [sample_event(cls) for cls in ALL if not issubclass(cls, RunEvent)]
    with SqliteEventStore(path) as store:
        store.append(runs + node)
        before = store.read()
    with sqlite3.connect(path) as conn:  # what version 2 wrote
        conn.execute("DROP INDEX events_by_run")
        conn.execute("ALTER TABLE events DROP COLUMN run")
        conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    conn.close()
    with SqliteEventStore(path) as store:
        assert store.read() == before
        r1 = [r for r in before if getattr(r.event, "run_id", None) == "r1"]
        assert r1 and store.read_runs(["r1"]) == r1
        assert store.read_runs([], outline=True) == [
            r for r in before if not isinstance(r.event, RunEvent) or r.event.kind in run_kinds()
        ]
    with sqlite3.connect(path) as conn:
        (version,) = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        nulls = conn.execute("SELECT count(*) FROM events WHERE run IS NULL").fetchone()[0]
    conn.close()
    assert int(version) == 3 and nulls == len(node)
    with sqlite3.connect(path) as conn:  # a newer m27's kind in a version-2 log
        conn.execute("DROP INDEX events_by_run")
        conn.execute("ALTER TABLE events DROP COLUMN run")
        conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
        conn.execute("INSERT INTO events VALUES (1000, 'FutureThing', 1, 1.0, '[1.0,\"r1\"]')")
    conn.close()
    with SqliteEventStore(path) as store:
        assert store.read_runs(["r1"]) == r1
        with pytest.raises(UnknownEventError, match="seq 1000"):
            store.read_runs([], outline=True)


def test_rows_an_older_m27_appends_without_their_run_are_filled_before_a_read(
    tmp_path: Path,
) -> None:
    """An agent of the m27 before the ``run`` column, not restarted after an upgrade,
    appends rows without it: ``read_runs`` fills them in first (and when it cannot, as
    with the file locked by a writer, reads the whole log), so no run loses its end."""
    path = tmp_path / "events.db"
    submitted = dataclasses.replace(sample_event(RunSubmitted), run_id="r1")
    ended = dataclasses.replace(sample_event(RunSucceeded), run_id="r1")
    granted = dataclasses.replace(sample_event(LeaseGranted), run_id="r1")
    with SqliteEventStore(path) as store:
        store.append([submitted])
        with sqlite3.connect(path) as conn:  # as the older m27 writes them
            conn.executemany(
                "INSERT INTO events (seq, kind, version, at, payload) VALUES (?, ?, ?, ?, ?)",
                [
                    (seq, *encode(ev)[:2], ev.at, encode(ev)[2])
                    for seq, ev in ((2, granted), (3, ended))
                ],
            )
        conn.close()
        with SqliteEventStore(path, busy_timeout=0.05) as blocked:
            with sqlite3.connect(path, isolation_level=None) as lock:  # a writer holds it
                lock.execute("BEGIN IMMEDIATE")
                assert [r.event for r in blocked.read_runs(["r1"])] == [submitted, granted, ended]
                lock.execute("ROLLBACK")
            lock.close()
        assert [r.event for r in store.read_runs(["r1"])] == [submitted, granted, ended]
        assert [r.event for r in store.read_runs([], outline=True)] == [submitted, ended]
    with sqlite3.connect(path) as conn:
        runs = conn.execute("SELECT run FROM events ORDER BY seq").fetchall()
    conn.close()
    assert runs == [("r1",)] * 3


def test_a_layout_recorded_in_another_order_is_read_by_name_and_not_written(
    tmp_path: Path,
) -> None:
    """What a later m27 that reorders or adds fields meets: the file's layout decides."""
    path = tmp_path / "events.db"
    SqliteEventStore(path).close()
    with sqlite3.connect(path) as conn:  # an older m27 wrote GuestResumed as (gpu, step, ...)
        conn.execute(
            "UPDATE layouts SET fields = ? WHERE kind = 'GuestResumed'",
            (json.dumps(["gpu", "step", "run_id", "at"]),),
        )
        conn.execute(  # and GpuLost before it had `uuid` and `reason` (they take defaults)
            "UPDATE layouts SET fields = ? WHERE kind = 'GpuLost'", (json.dumps(["at", "gpu"]),)
        )
    conn.close()
    _insert(path, (1, "GuestResumed", 1, '[3,"md","r",5.0]'), (2, "GpuLost", 1, "[6.0,2]"))
    with SqliteEventStore(path) as store:
        store.append([GuestResumed(at=7.0, run_id="r", step="md", gpu=1)])
        assert [r.event for r in store.read()] == [
            GuestResumed(at=5.0, run_id="r", step="md", gpu=3),
            GpuLost(at=6.0, gpu=2),
            GuestResumed(at=7.0, run_id="r", step="md", gpu=1),
        ]
    assert _rows(path)[2][3].startswith("{")  # this m27's order is not the file's: named


def test_a_big_int_in_a_positional_row_comes_back_exact(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    SqliteEventStore(path).close()
    _insert(path, (1, "GpuLost", 1, f'[1.0,{2**70},"GPU-x","gone"]'))
    with SqliteEventStore(path) as store:
        [record] = store.read()
    assert record.event == GpuLost(at=1.0, gpu=2**70, uuid="GPU-x", reason="gone")
    assert type(record.event.gpu) is int  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        ("[1.0,2,3]", "has 3 values, its layout has 4 fields"),
        ('[1.0,2,"u","r","extra"]', "has 5 values"),
        ("[1.0,2,", "not valid JSON"),
        ("[1.0, NaN, Infinity", "not valid JSON"),
        ("garbage", "not valid JSON"),
        ('"a string"', "JSON str, not an object"),
        ("[]", "has 0 values"),
    ],
    ids=["short", "long", "truncated", "truncated-nan", "not-json", "a-string", "empty"],
)
def test_a_garbled_row_fails_with_a_clear_error_naming_seq_and_file(
    tmp_path: Path, payload: str, match: str
) -> None:
    path = tmp_path / "events.db"
    with SqliteEventStore(path) as store:
        store.append([GpuLost(at=1.0, gpu=0)])
    _insert(path, (2, "GpuLost", 1, payload))
    with SqliteEventStore(path) as store:
        assert [r.event for r in store.read(limit=1)] == [GpuLost(at=1.0, gpu=0)]
        with pytest.raises(UnknownEventError, match=match) as info:
            store.read()
    assert info.value.context["seq"] == 2
    assert info.value.context["kind"] == "GpuLost"
    assert str(path) in str(info.value)


def test_positional_rows_of_unknown_kinds_versions_or_layouts_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    cases = [
        ("GpuMelted", 1, "[1.0]", "unknown event kind 'GpuMelted'"),
        ("GpuLost", GpuLost.version + 1, "[1.0,0]", "schema version 2"),
    ]
    with SqliteEventStore(path) as store:  # opened before the rows, as a running agent is
        for seq, (kind, version, payload, match) in enumerate(cases, start=1):
            _insert(path, (seq, kind, version, payload))
            with pytest.raises(UnknownEventError, match=match) as info:
                store.read(after=seq - 1)
            assert info.value.context["seq"] == seq
    # the log's layouts are what decode_records reads positional rows by: none, no read
    layouts = Layouts({k: v for k, v in current_layouts().items() if k[0] != "GuestResumed"})
    with pytest.raises(UnknownEventError, match="records no layout"):
        decode_records([(1, "GuestResumed", 1, '[1.0,"r","s",0]')], layouts)


def test_a_garbled_layouts_table_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    SqliteEventStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE layouts SET fields = '{\"at\": 1}' WHERE kind = 'GpuLost'")
    conn.close()
    with pytest.raises(StoreError, match="garbled layout for GpuLost") as info:
        SqliteEventStore(path)
    assert info.value.context["file"] == str(path)


def test_decode_without_layouts_refuses_a_positional_payload() -> None:
    with pytest.raises(UnknownEventError, match="not an object"):
        decode("GpuLost", 1, '[1.0,0,"",""]')
    with pytest.raises(UnknownEventError, match="records no layout"):
        decode_records([(1, "GpuLost", 1, '[1.0,0,"",""]')])
    with pytest.raises(UnknownEventError, match="not valid JSON"):
        decode("GpuLost", 1, "{")
