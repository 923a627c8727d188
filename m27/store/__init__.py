"""Where events are kept: the EventStore protocol and its backends.

``sqlite.py`` is the default (one WAL-mode file per node, shared by every process of the
node); ``memory.py`` is for unit tests. Both pass the same contract suite
(tests/unit/test_store_contract.py).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol

from m27._exceptions import StoreError
from m27.events import Event, Recorded, encode


class EventStore(Protocol):
    """An append-only, gapless, totally ordered log of events."""

    def append(self, events: Sequence[Event]) -> int:
        """Append all of `events` atomically (all or none); return the last sequence number."""
        ...

    def read(self, after: int = 0, limit: int | None = None) -> list[Recorded]:
        """Events with sequence > `after`, in order (at most `limit`)."""
        ...

    def read_runs(
        self, runs: Collection[str], *, outline: bool = False, after: int = 0
    ) -> list[Recorded]:
        """The events after `after` of `runs`, in order; with `outline` also every run's
        own (:func:`m27.events.run_kinds`: submitted, ended, ...) and the node's (those of
        no run). A fold of them is exact for `runs` and lists every other run without its
        steps' progress: what a command that shows a few runs needs, without the whole log."""
        ...

    def last_seq(self) -> int:
        """The highest sequence number stored (0 when empty)."""
        ...

    def follow(self, after: int, timeout: float) -> list[Recorded]:
        """Like `read`, but waits up to `timeout` seconds for at least one new event."""
        ...

    def get_cursor(self, name: str) -> int:
        """A named durable position in the log (0 if never set), for tailers."""
        ...

    def set_cursor(self, name: str, seq: int) -> None:
        """Move a named cursor durably."""
        ...

    def close(self) -> None: ...


def _encode(ev: Event) -> tuple[str, int, str]:
    """:func:`m27.events.encode`, or a StoreError naming the kind: every backend refuses
    an event it could not give back (a live object in a field) before storing anything."""
    try:
        return encode(ev)
    except (TypeError, ValueError) as exc:
        kind = type(ev).__name__
        raise StoreError(f"cannot encode event {kind}: {exc}", kind=kind) from exc
