"""Small helpers shared by the runner tests (real child processes, a memory store)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from m27 import liveness
from m27.events import Event
from m27.executors.local import StepLaunch
from m27.store.memory import MemoryEventStore

PY = sys.executable


def launch(code: str, **kw: object) -> StepLaunch:
    return StepLaunch(run_id="r1", step="s1", argv=(PY, "-c", code), **kw)  # type: ignore[arg-type]


def events(store: MemoryEventStore) -> list[Event]:
    return [r.event for r in store.read()]


def of(store: MemoryEventStore, kind: type[Event]) -> list[Event]:
    return [e for e in events(store) if isinstance(e, kind)]


def running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie nobody reaps counts as gone)."""
    return liveness.alive(pid)


def collect(lines: list[tuple[str, str]]) -> Callable[[str, list[str]], None]:
    """An ``on_lines`` callback that keeps each line with its stream."""
    return lambda stream, batch: lines.extend((stream, line) for line in batch)
