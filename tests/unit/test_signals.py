"""m27.signals: handlers that take no lock, so signals in a burst never deadlock a process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from m27.signals import SignalRelay, stop_event

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Waits on the event in its main loop (as the exporter does), then keeps waiting while the
#: rest of the burst arrives. With a handler that calls Event.set() itself, a signal that
#: lands while the previous handler holds the event's lock hangs it (7 runs in 10 here);
#: with a handler written in Python, each signal ran it inside the one before until a
#: RecursionError ended the process (1 run in 6 beside three CPU hogs, and in CI).
CHILD = """
import signal, sys
from {module} import {function}
stop = {function}([signal.SIGUSR1, signal.SIGTERM])
print("ready", flush=True)
while not stop.wait(0.001):
    pass
for _ in range(3000):
    stop.wait(0.0001)
print("stopped", flush=True)
sys.stdin.read()  # exit once the burst is over: the interpreter's exit restores SIG_DFL
"""


@pytest.mark.parametrize(
    ("module", "function"),
    [
        ("m27.signals", "stop_event"),
        ("m27.executors.slurm", "watch_preemption"),
        ("m27", "watch_stop"),
    ],
)
def test_a_burst_of_signals_sets_the_stop_event_and_never_hangs_the_process(
    module: str, function: str
) -> None:
    code = CHILD.format(module=module, function=function)
    env = {**os.environ, "PYTHONPATH": ROOT}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(3)
    ]
    try:
        for child in children:
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
        for i in range(3000):
            for child in children:
                child.send_signal(signal.SIGUSR1 if i % 2 else signal.SIGTERM)
        for child in children:
            out, _ = child.communicate(timeout=60)  # a deadlock waits forever, not 60 s
            assert (child.returncode, out) == (0, "stopped\n")
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


@pytest.fixture
def usr1_restored() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, previous)


def test_the_relay_runs_the_work_in_its_own_thread_in_the_order_signals_came(
    usr1_restored: None,
) -> None:
    seen: list[tuple[int, str]] = []
    done = threading.Event()

    def on_signal(signum: int) -> None:
        seen.append((signum, threading.current_thread().name))
        if len(seen) == 3:
            done.set()

    def relays() -> int:
        return sum(t.name == "m27-signals" for t in threading.enumerate())

    before = relays()
    relay = SignalRelay(on_signal)
    previous = relay.install([signal.SIGUSR1])
    assert list(previous) == [signal.SIGUSR1] and signal.getsignal(signal.SIGUSR1) is relay.handler
    relay(signal.SIGUSR2, None)  # called directly, as another handler may
    os.kill(os.getpid(), signal.SIGUSR1)
    relay(signal.SIGINT, None)
    assert done.wait(10)
    assert seen == [
        (signal.SIGUSR2, "m27-signals"),
        (signal.SIGUSR1, "m27-signals"),
        (signal.SIGINT, "m27-signals"),
    ]
    relay.close()
    assert relays() == before  # its thread has ended
    relay(signal.SIGUSR1, None)  # after close: run nowhere, raises nothing


def test_stop_event_is_set_by_its_signal(usr1_restored: None) -> None:
    stop = stop_event([signal.SIGUSR1])
    assert not stop.is_set()
    os.kill(os.getpid(), signal.SIGUSR1)
    assert stop.wait(10)


def _no_watcher() -> None:
    """TERM and USR1 as a fresh process has them: a stop event an earlier test made (and
    set) is no longer installed, so watch_stop() makes a new one."""
    for s in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(s, signal.SIG_DFL)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_watch_stop_is_set_by_what_m27_and_slurm_send_a_step(signum: signal.Signals) -> None:
    """TERM (`m27 cancel`, a timeout, preemption, scancel) and USR1 (Slurm's warning before
    a time limit), with no arguments: what a step's loop calls."""
    import m27

    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        _no_watcher()
        stop = m27.watch_stop()
        assert not stop.is_set()
        os.kill(os.getpid(), signum)
        assert stop.wait(10)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def test_watch_stop_asked_twice_gives_one_event_that_the_signal_sets() -> None:
    """A library and the program's own loop both call it: both see the stop. A second
    call made a second relay that took the signals, and the first event was never set.
    Once someone else takes the signals, the next call installs anew and the old relay's
    thread ends."""
    import m27

    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        _no_watcher()
        first, second = m27.watch_stop(), m27.watch_stop()
        assert first is second
        os.kill(os.getpid(), signal.SIGUSR1)
        assert first.wait(10)
        threads = sum(t.name == "m27-signals" for t in threading.enumerate())
        for s, handler in previous.items():
            signal.signal(s, handler)
        third = m27.watch_stop()
        assert third is not first and not third.is_set()
        assert sum(t.name == "m27-signals" for t in threading.enumerate()) == threads
        os.kill(os.getpid(), signal.SIGTERM)
        assert third.wait(10)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
