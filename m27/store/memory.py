"""An in-process event store for tests and the simulator.

It keeps the same contract as the SQLite store (tests/unit/test_store_contract.py), down to
the encoding: every event is encoded and decoded on append, so an event that would not
survive the SQLite store fails here too, and what `read` returns is what a replay would see.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Sequence

from m27._exceptions import StoreError
from m27.events import Event, Recorded, decode
from m27.store import _encode
from m27.store._runs import belongs


class MemoryEventStore:
    """A thread-safe :class:`~m27.store.EventStore` held in a list; followers use a Condition."""

    def __init__(self) -> None:
        self._records: list[Recorded] = []
        self._cursors: dict[str, int] = {}
        self._changed = threading.Condition()
        self._closed = False

    def append(self, events: Sequence[Event]) -> int:
        decoded = [_round_trip(ev) for ev in events]  # all encode, or nothing is appended
        with self._changed:
            self._check_open()
            first = len(self._records) + 1
            self._records.extend(Recorded(first + i, ev) for i, ev in enumerate(decoded))
            self._changed.notify_all()
            return len(self._records)

    def read(self, after: int = 0, limit: int | None = None) -> list[Recorded]:
        with self._changed:
            self._check_open()
            return self._slice(after, limit)

    def read_runs(
        self, runs: Collection[str], *, outline: bool = False, after: int = 0
    ) -> list[Recorded]:
        return [r for r in self.read(after) if belongs(r.event, runs, outline)]

    def last_seq(self) -> int:
        with self._changed:
            self._check_open()
            return len(self._records)

    def follow(self, after: int, timeout: float, limit: int | None = None) -> list[Recorded]:
        with self._changed:
            self._check_open()
            self._changed.wait_for(
                lambda: self._closed or len(self._records) > after, max(0.0, timeout)
            )
            return [] if self._closed else self._slice(after, limit)

    def get_cursor(self, name: str) -> int:
        with self._changed:
            self._check_open()
            return self._cursors.get(name, 0)

    def set_cursor(self, name: str, seq: int) -> None:
        if seq < 0:
            raise StoreError(f"cursor {name!r} cannot move to {seq} (< 0)", cursor=name)
        with self._changed:
            self._check_open()
            self._cursors[name] = seq

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def __enter__(self) -> MemoryEventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _slice(self, after: int, limit: int | None) -> list[Recorded]:
        start = max(0, after)
        end = None if limit is None else start + max(0, limit)
        return self._records[start:end]

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("memory event store is closed")


def _round_trip(ev: Event) -> Event:
    return decode(*_encode(ev))
