"""The EventStore contract: one abstract suite, run against every backend.

A backend subclass provides only the ``store`` fixture. SQLite-only behaviour (files,
processes, schema) is tested in ``TestSqlite`` below the shared suite.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from m27._exceptions import StoreError, UnknownEventError
from m27.events import EVENT_TYPES, Event, GpuLost, RunEvent, RunSubmitted, run_kinds
from m27.store import EventStore
from m27.store.memory import MemoryEventStore
from m27.store.sqlite import SCHEMA_VERSION, SqliteEventStore, open_store
from tests.unit.event_samples import sample_event

REPO = Path(__file__).resolve().parents[2]


def lost(n: int, reason: str = "") -> GpuLost:
    return GpuLost(at=1000.0 + n, gpu=n, reason=reason)


def of_runs(runs: int) -> list[Event]:
    """Every kind once per run (run-level, step-level, and the node's own events)."""
    out = []
    for i in range(runs):
        for cls in EVENT_TYPES.values():
            ev = sample_event(cls)
            if isinstance(ev, RunEvent):
                ev = dataclasses.replace(ev, run_id=f"r{i}")
            out.append(ev)
    return out


class EventStoreContract:
    """Behaviour every EventStore backend promises."""

    @pytest.fixture
    def store(self) -> Iterator[EventStore]:
        raise NotImplementedError("a backend subclass provides the store fixture")

    def test_empty_store_has_nothing_to_read(self, store: EventStore) -> None:
        assert store.last_seq() == 0
        assert store.read() == []
        assert store.get_cursor("notifier") == 0

    def test_sequence_numbers_are_gapless_and_increasing(self, store: EventStore) -> None:
        assert store.append([lost(1)]) == 1
        assert store.append([lost(2), lost(3), lost(4)]) == 4
        assert store.append([lost(5)]) == 5
        records = store.read()
        assert [r.seq for r in records] == [1, 2, 3, 4, 5]
        assert [r.event for r in records] == [lost(i) for i in range(1, 6)]
        assert store.last_seq() == 5

    def test_empty_append_changes_nothing(self, store: EventStore) -> None:
        store.append([lost(1)])
        assert store.append([]) == 1
        assert store.last_seq() == 1

    def test_batch_with_unencodable_event_appends_nothing(self, store: EventStore) -> None:
        store.append([lost(1)])
        bad = RunSubmitted(
            at=1.0,
            run_id="r",
            pipeline="p",
            spec_path="p.yaml",
            steps=("a",),
            vars={"x": object()},  # type: ignore[dict-item]
        )
        with pytest.raises(StoreError, match="RunSubmitted"):
            store.append([lost(2), lost(3), bad, lost(4)])
        assert [r.seq for r in store.read()] == [1]
        # The failed batch burned no sequence numbers.
        assert store.append([lost(5)]) == 2
        assert [r.event for r in store.read()] == [lost(1), lost(5)]

    def test_read_after_and_limit(self, store: EventStore) -> None:
        store.append([lost(i) for i in range(1, 8)])
        assert [r.seq for r in store.read(after=3)] == [4, 5, 6, 7]
        assert [r.seq for r in store.read(after=3, limit=2)] == [4, 5]
        assert store.read(after=7) == []
        assert [r.seq for r in store.read(limit=1)] == [1]

    @pytest.mark.parametrize("cls", sorted(EVENT_TYPES.values(), key=lambda c: c.__name__))
    def test_every_event_type_round_trips(self, store: EventStore, cls: type[Event]) -> None:
        original = sample_event(cls)
        store.append([original])
        (record,) = store.read()
        assert record.event == original
        assert type(record.event) is cls
        for f in dataclasses.fields(cls):
            assert type(getattr(record.event, f.name)) is type(getattr(original, f.name))

    def test_follow_returns_events_already_there(self, store: EventStore) -> None:
        store.append([lost(1), lost(2)])
        assert [r.seq for r in store.follow(after=0, timeout=0.0)] == [1, 2]
        assert [r.seq for r in store.follow(after=1, timeout=5.0)] == [2]

    def test_follow_wakes_when_another_thread_appends(self, store: EventStore) -> None:
        store.append([lost(1)])
        started = threading.Event()

        def writer() -> None:
            started.wait()
            store.append([lost(2), lost(3)])

        thread = threading.Thread(target=writer)
        thread.start()
        started.set()
        got = store.follow(after=1, timeout=10.0)
        thread.join()
        assert [r.event for r in got][:1] == [lost(2)]
        assert [r.seq for r in store.read(after=1)] == [2, 3]

    def test_follow_times_out_with_nothing(self, store: EventStore) -> None:
        store.append([lost(1)])
        assert store.follow(after=1, timeout=0.02) == []

    def test_concurrent_appends_from_threads_stay_gapless(self, store: EventStore) -> None:
        def writer(base: int) -> None:
            for i in range(10):
                store.append([lost(base + i), lost(base + i + 500)])

        threads = [threading.Thread(target=writer, args=(k * 1000,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        records = store.read()
        assert [r.seq for r in records] == list(range(1, 81))
        gpus = [r.event.gpu for r in records]  # type: ignore[attr-defined]
        assert sorted(gpus) == sorted(
            k * 1000 + i + d for k in range(4) for i in range(10) for d in (0, 500)
        )
        # Each batch of two stays adjacent.
        assert all(gpus[i + 1] == gpus[i] + 500 for i in range(0, 80, 2))

    def test_cursors_start_at_zero_and_move(self, store: EventStore) -> None:
        store.append([lost(1), lost(2)])
        store.set_cursor("telegram", 2)
        store.set_cursor("bridge", 1)
        store.set_cursor("telegram", 1)
        assert store.get_cursor("telegram") == 1
        assert store.get_cursor("bridge") == 1
        assert store.get_cursor("other") == 0

    def test_negative_cursor_is_refused(self, store: EventStore) -> None:
        with pytest.raises(StoreError, match="cursor"):
            store.set_cursor("telegram", -1)

    def test_read_runs_gives_the_runs_named_and_with_outline_every_run_as_a_whole(
        self, store: EventStore
    ) -> None:
        events = of_runs(3)
        store.append(events)
        everything = store.read()
        named = store.read_runs(["r1", "r2"])
        assert named == [r for r in everything if getattr(r.event, "run_id", "") in ("r1", "r2")]
        outline = store.read_runs(["r1"], outline=True)
        assert outline == [
            r
            for r in everything
            if getattr(r.event, "run_id", "r1") == "r1" or r.event.kind in run_kinds()
        ]
        assert store.read_runs([]) == [] and store.read_runs(["nobody"]) == []
        after = everything[len(everything) // 2].seq
        later = [r for r in named if r.seq > after and r.event.run_id == "r2"]  # type: ignore[attr-defined]
        assert store.read_runs(["r2"], after=after) == later
        assert store.read_runs(["r0", "r1", "r2"], outline=True) == everything

    def test_read_runs_of_a_big_log_and_of_many_runs(self, store: EventStore) -> None:
        # past a read's chunk of rows, and past the runs a read names one by one
        events = [
            dataclasses.replace(sample_event(RunSubmitted), run_id=f"r{i}") for i in range(1200)
        ]
        store.append([*events, lost(1)])
        everything = store.read()
        assert store.read_runs([], outline=True) == everything
        many = [f"r{i}" for i in range(0, 1200, 2)]
        assert store.read_runs(many) == everything[0:1200:2]

    def test_closed_store_refuses_use(self, store: EventStore) -> None:
        store.close()
        with pytest.raises(StoreError, match="closed"):
            store.append([lost(1)])


class TestMemory(EventStoreContract):
    @pytest.fixture
    def store(self) -> Iterator[EventStore]:
        s = MemoryEventStore()
        yield s
        s.close()


def _child(code: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE, text=True
    )


_WRITER = """
import sys
from m27.events import GpuLost
from m27.store.sqlite import SqliteEventStore
store = SqliteEventStore(sys.argv[1])
proc, n = int(sys.argv[2]), int(sys.argv[3])
for i in range(0, n, 4):
    store.append([GpuLost(at=0.0, gpu=proc * 1000 + i + k) for k in range(4)])
store.close()
"""

_ENDLESS = """
import sys
from m27.events import GpuLost
from m27.store.sqlite import SqliteEventStore
store = SqliteEventStore(sys.argv[1])
i = 0
while True:
    store.append([GpuLost(at=0.0, gpu=i, reason=f"batch {i // 3}") for i in range(i, i + 3)])
    i += 3
"""


class TestSqlite(EventStoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[EventStore]:
        s = SqliteEventStore(tmp_path / "events.db")
        yield s
        s.close()

    def test_reopened_store_keeps_events_and_cursors(self, tmp_path: Path) -> None:
        path = tmp_path / "events.db"
        with SqliteEventStore(path) as first:
            first.append([lost(1), lost(2)])
            first.set_cursor("telegram", 2)
        with SqliteEventStore(path) as second:
            assert [r.event for r in second.read()] == [lost(1), lost(2)]
            assert second.get_cursor("telegram") == 2
            assert second.append([lost(3)]) == 3

    def test_file_is_in_wal_mode(self, tmp_path: Path) -> None:
        SqliteEventStore(tmp_path / "events.db").close()
        conn = sqlite3.connect(tmp_path / "events.db")
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.close()

    def test_open_store_uses_m27_home(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("M27_HOME", str(tmp_path / "home" / "nested"))
        with open_store() as store:
            store.append([lost(1)])
            assert store.path == tmp_path / "home" / "nested" / "events.db"
        assert (tmp_path / "home" / "nested" / "events.db").exists()

    def test_four_processes_append_concurrently_without_gaps(self, tmp_path: Path) -> None:
        path = tmp_path / "events.db"
        SqliteEventStore(path).close()
        children = [_child(_WRITER, str(path), str(p), "40") for p in range(4)]
        for child in children:
            assert child.wait(timeout=60) == 0
        with SqliteEventStore(path) as store:
            records = store.read()
        assert [r.seq for r in records] == list(range(1, 161))
        gpus = [r.event.gpu for r in records]  # type: ignore[attr-defined]
        assert sorted(gpus) == sorted(p * 1000 + i for p in range(4) for i in range(40))
        # Batches of four were never interleaved.
        assert all(gpus[i : i + 4] == list(range(gpus[i], gpus[i] + 4)) for i in range(0, 160, 4))

    def test_follow_wakes_when_another_process_appends(self, tmp_path: Path) -> None:
        path = tmp_path / "events.db"
        with SqliteEventStore(path) as store:
            child = _child(_WRITER, str(path), "7", "4")
            got = store.follow(after=0, timeout=30.0)
            assert child.wait(timeout=60) == 0
        assert [r.event for r in got] == [GpuLost(at=0.0, gpu=7000 + k) for k in range(4)]

    def test_kill_9_mid_append_loop_leaves_a_gapless_log_of_whole_batches(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "events.db"
        with SqliteEventStore(path) as store:
            child = _child(_ENDLESS, str(path))
            seen = 0
            while seen < 60:
                records = store.follow(after=seen, timeout=30.0)
                assert records, "the writer process appended nothing"
                seen = records[-1].seq
            os.kill(child.pid, signal.SIGKILL)
            assert child.wait(timeout=30) == -signal.SIGKILL
        with SqliteEventStore(path) as reopened:
            records = reopened.read()
            last = reopened.append([lost(1)])
        assert len(records) >= 60
        assert [r.seq for r in records] == list(range(1, len(records) + 1))
        assert len(records) % 3 == 0
        assert [r.event.gpu for r in records] == list(range(len(records)))  # type: ignore[attr-defined]
        assert last == len(records) + 1

    def test_unknown_kind_in_the_file_fails_loudly_with_its_seq(self, tmp_path: Path) -> None:
        path = tmp_path / "events.db"
        with SqliteEventStore(path) as store:
            store.append([lost(1)])
        conn = sqlite3.connect(path)
        conn.execute(
            "INSERT INTO events (seq, kind, version, at, payload)"
            " VALUES (2, 'GpuMelted', 1, 0, '{}')"
        )
        conn.commit()
        conn.close()
        with SqliteEventStore(path) as store:
            assert [r.seq for r in store.read(limit=1)] == [1]
            with pytest.raises(UnknownEventError, match="GpuMelted") as info:
                store.read()
        assert info.value.context["seq"] == 2
        assert str(path) in str(info.value)

    def test_newer_event_version_in_the_file_fails_loudly(self, tmp_path: Path) -> None:
        path = tmp_path / "events.db"
        SqliteEventStore(path).close()
        conn = sqlite3.connect(path)
        conn.execute(
            "INSERT INTO events (seq, kind, version, at, payload)"
            " VALUES (1, 'GpuLost', 99, 0, '{\"at\": 0, \"gpu\": 1}')"
        )
        conn.commit()
        conn.close()
        with SqliteEventStore(path) as store, pytest.raises(UnknownEventError, match="99"):
            store.read()

    def test_newer_schema_is_refused_naming_the_file(self, tmp_path: Path) -> None:
        path = tmp_path / "events.db"
        SqliteEventStore(path).close()
        conn = sqlite3.connect(path)
        conn.execute(
            "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),)
        )
        conn.commit()
        conn.close()
        with pytest.raises(StoreError, match="schema version") as info:
            SqliteEventStore(path)
        assert info.value.context["file"] == str(path)
        assert str(path) in str(info.value)

    def test_a_file_that_is_not_a_database_is_refused_naming_it(self, tmp_path: Path) -> None:
        path = tmp_path / "events.db"
        path.write_bytes(b"this is not sqlite" * 100)
        with pytest.raises(StoreError, match=r"events\.db"):
            SqliteEventStore(path)
