"""Injected time: code asks a Clock, tests move a FakeClock instead of sleeping."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Wall time for records, monotonic time for intervals, and a sleep that tests can skip."""

    def now(self) -> float:
        """Seconds since the epoch (recorded in events)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for timeouts and intervals)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait; a fake clock advances instead."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class FakeClock:
    """A clock that only moves when told to: `sleep` and `advance` move both readings."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._mono = 0.0
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
            self._mono += seconds

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))
