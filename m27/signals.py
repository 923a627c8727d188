"""Signal handlers that take no lock: the work a signal asks for runs in a thread of its own.

Python runs a signal handler in the main thread between two bytecodes of whatever that
thread is doing, including the handler of the signal before. ``threading.Event.set`` takes
a lock; when a second signal arrives while the first handler holds it, the nested handler
waits forever for a lock its own thread holds. That is not rare: a Slurm step gets TERM
from slurmstepd and the forwarded TERM from its batch script within microseconds (the
preemption test hung 1 run in 5 that way, the step SIGKILLed before it could checkpoint),
and people press Ctrl-C twice. So a handler here only puts the signal's number on a
``queue.SimpleQueue``; a daemon thread takes it and does the work (set an event, append an
event, ...), where taking locks is safe.

The handler installed is the queue's own ``put``, a method written in C, not a Python
function: Python checks for signals between the bytecodes of a handler too, so a burst
of signals ran a Python handler inside itself, a frame deeper each time, until a
RecursionError killed the step (CI: 3 processes sent 6,000 TERM and USR1 each on a loaded
machine). ``put`` runs no bytecode, so a handler never runs inside another, and it is
reentrant (Python's documentation says so: it may interrupt itself and take no lock
that deadlocks). It is called as ``put(signum, frame)``: ``frame`` lands in its ``block``
argument, which a SimpleQueue ignores.

A leaf (imports nothing from m27): the Slurm step API (``m27.executors.slurm``) and the
long-running commands (``m27.cli``) use it.
"""

from __future__ import annotations

import queue
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, cast

__all__ = ["STOP_SIGNALS", "SignalRelay", "stop_event", "watch_stop"]

#: What asks a step to stop and save: m27 (`m27 cancel`, a `timeout:`, a preempting tier:
#: TERM) and Slurm (USR1 `signal_before` seconds before the time limit, TERM on scancel
#: or preemption).
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGUSR1)


class SignalRelay:
    """A signal handler (:meth:`install` it, or call it) that runs `on_signal` elsewhere.

    `on_signal(signum)` runs in the daemon thread ``m27-signals``, once per signal received,
    in the order received. :meth:`close` ends the thread once it has run what is queued.
    """

    def __init__(self, on_signal: Callable[[int], object]) -> None:
        self._on_signal = on_signal
        self._queue: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        #: what :meth:`install` installs: the queue's C ``put`` (see the module's docs)
        self.handler = cast("Callable[[int, FrameType | None], Any]", self._queue.put)
        self._closed = False
        self._thread = threading.Thread(target=self._relay, name="m27-signals", daemon=True)
        self._thread.start()

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        """Relay `signum` (for a Python handler of its own that passes some signals on)."""
        if not self._closed:
            self._queue.put(signum)

    def install(self, signals: Iterable[int]) -> dict[int, object]:
        """Handle `signals` with this relay; returns the handlers it replaced."""
        return {int(s): signal.signal(s, self.handler) for s in signals}

    def close(self) -> None:
        """Stop relaying (the handlers stay installed; what they queue is not run)."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
        self._thread.join(5)

    def _relay(self) -> None:
        while (signum := self._queue.get()) is not None:
            self._on_signal(signum)


def stop_event(signals: Iterable[int]) -> threading.Event:
    """An event that `signals` set: for a main loop to check or wait on (``stop.wait(t)``).

    The event is set from the relay thread, microseconds after the handler ran, so a loop
    that checks ``is_set()`` sees it on its next round; waiting on it never misses it.
    Asked again for the same signals while its handlers are still installed, it returns
    the same event, set if the stop has come: a library and the program's own loop that
    both ask both see it (a second relay took the first one's handlers, and the first
    event was never set).
    """
    wanted = frozenset(int(s) for s in signals)
    with _stops_lock:
        known = _stops.get(wanted)
        if known is not None:
            relay, event = known
            handlers = [signal.getsignal(s) for s in wanted]
            if all(h is relay.handler for h in handlers):
                return event
            if not any(h is relay.handler for h in handlers):
                relay.close()  # no signal reaches it any more: end its thread
        event = threading.Event()
        relay = SignalRelay(lambda _signum: event.set())
        relay.install(wanted)
        _stops[wanted] = (relay, event)
        return event


#: the relay and event :func:`stop_event` made per set of signals
_stops: dict[frozenset[int], tuple[SignalRelay, threading.Event]] = {}
_stops_lock = threading.Lock()


def watch_stop(signals: Iterable[int] = STOP_SIGNALS) -> threading.Event:
    """An event set when the step is asked to stop, for its main loop to check: save a
    checkpoint then and exit. Call it from the main thread, before the loop::

        stop = m27.watch_stop()
        for i in range(start, n):
            advance(state)
            ck.maybe_save(state, i)
            if stop.is_set():
                ck.save(state, i); ck.close()
                sys.exit(75)

    m27 waits ``checkpoint_grace`` (default 60 s) for a step with ``checkpoint:`` to exit
    before it sends SIGKILL. Without this a Python step dies at the signal (its default
    action), and a resume goes back to its last periodic checkpoint.
    """
    return stop_event(signals)
