"""The process's own side of the step API: its channel, resolved once from
``M27_CHANNEL``, and the two calls a step's code makes, ``m27.io_wait()`` and
``m27.gate()`` (the page and its protocol: :mod:`m27.step._channel`)."""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Final

from m27._exceptions import M27Error
from m27.step._channel import Channel

__all__ = ["gate", "io_wait"]

# -- the process's own channel, resolved once from M27_CHANNEL --------------------------

_channel: Channel | None = None
_resolved = False
_resolve_lock = threading.Lock()


def _step_channel() -> Channel | None:
    global _channel, _resolved
    if _resolved:
        return _channel
    with _resolve_lock:
        if not _resolved:
            path = os.environ.get("M27_CHANNEL", "")
            if path:
                try:
                    _channel = Channel.open(path)
                    _channel.mark_owner()
                    atexit.register(_exiting, _channel, os.getpid())
                except M27Error as exc:
                    # A step's computation is worth more than its telemetry: say it once
                    # and run as if outside the agent (the agent then pauses by signal).
                    print(f"m27: M27_CHANNEL ignored: {exc}", file=sys.stderr)
            _resolved = True
    return _channel


def _exiting(channel: Channel, pid: int) -> None:
    """At interpreter exit the step computes no more: it counts as waiting on I/O from
    here on (its page keeps saying so once the process is gone), so the GPU goes to a
    guest while the process finishes and its runner records the end and releases the
    lease (tens of milliseconds, more on a loaded node), not after. Atexit handlers run
    after the non-daemon threads have ended; a forked child that exits through atexit
    does not speak for its parent."""
    if channel is _channel and os.getpid() == pid:
        channel.enter_io()


def _reset_step_channel() -> None:
    """Forget the resolved channel (tests and forked children that change M27_CHANNEL)."""
    global _channel, _resolved
    with _resolve_lock:
        if _channel is not None:
            _channel.close()
        _channel, _resolved = None, False


def _after_fork_in_child() -> None:
    # A lock held by another thread at fork time would never be released in the child;
    # the child keeps the shared page (its I/O is the step's I/O) with a fresh lock.
    if _channel is not None:
        _channel._lock = threading.Lock()
        _channel._acquire = _channel._lock.acquire
        _channel._release = _channel._lock.release


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class _IoWait:
    __slots__ = ()

    def __enter__(self) -> None:
        channel = _channel if _resolved else _step_channel()
        if channel is not None:
            channel.enter_io()

    def __exit__(self, *exc_info: object) -> None:  # an exception leaves the I/O too
        channel = _channel if _resolved else _step_channel()
        if channel is not None:
            channel.exit_io()


_IO_WAIT: Final = _IoWait()


def io_wait() -> _IoWait:
    """``with m27.io_wait(): save(frame)`` — "this process is reading or writing, not computing".

    While any such block is open the agent may lend this step's GPU to a guest. Blocks
    nest and may be entered from several threads; the process counts as waiting on I/O
    while at least one is open. Costs well under a microsecond (benchmarks/bench_step_api.py).
    """
    return _IO_WAIT


def gate(timeout: float | None = None) -> bool:
    """Wait until the agent lets this step compute; True at once outside the agent.

    A ready-tier (guest) step calls it after loading its data, and may call it again at
    any safe point (each iteration): the agent then pauses it there instead of by signal.
    Returns False only when ``timeout`` seconds passed with the gate still closed.
    """
    channel = _channel if _resolved else _step_channel()
    if channel is None:
        return True
    return channel.wait_gate(timeout)
