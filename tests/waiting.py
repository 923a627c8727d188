"""The one way a test waits: for a condition, bounded, never for a length of time.

A test that sleeps and then asserts passes on an idle laptop and fails on a loaded CI box;
a test that asserts a duration measures the machine, not the code. Every wait in the
suite goes through :func:`wait_until`: it returns as soon as the condition holds, so a
generous `timeout` costs nothing when things go well, and it fails the test with what was
awaited when the condition never comes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 30.0,
    interval: float = 0.01,
    what: str = "",
    explain: Callable[[], str] | None = None,
) -> T:
    """Poll `predicate` until it returns something truthy and return that value.

    Fails the test after `timeout` seconds (the last value is shown). `interval` is the
    pause between polls; the timeout is a bound for a broken run, not a speed claim, so
    make it large (tens of seconds) on anything that starts a process. `explain`, when
    given, is called on a timeout and its text added to the failure: what a failure on a
    CI machine needs to be understood from its output alone (a log's tail, a state).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            name = what or getattr(predicate, "__name__", "the condition")
            why = f"\n{explain()}" if explain is not None else ""
            pytest.fail(f"timed out after {timeout:g} s waiting for {name} (last: {value!r}){why}")
        time.sleep(interval)
