"""What a step's own code tells the agent: ``m27.io_wait()`` and ``m27.gate()``.

The two calls sit on a step's hot path (an MD loop may save a frame every few
milliseconds), so they never talk to a server. The agent gives each step a small file,
the *channel*, and passes its path in ``M27_CHANNEL``; the step maps it into memory and
the calls are plain writes and reads of that shared page: no system call while the gate is
open, no lock shared with another process.

Layout (64 bytes, native byte order, version 1)::

    0  u32 magic "M27C"   4  u32 version
    8  i32 io_depth       step: nesting depth of io_wait blocks (> 0: doing I/O)
    12 i32 gate_closed    agent: 0 open, 1 closed, >= 2 follow the primary (below)
    16 i32 at_gate        step: 1 while blocked in gate()
    20 i32 pid            step: pid of the last process that opened the channel
    24 f64 io_since       step: time.monotonic() when io_depth went 0 -> 1
    32 f64 io_seconds     step: total seconds spent in completed I/O blocks
    40 u64 io_count       step: io_wait blocks entered (I/O shorter than a tick shows here)
    48 u64 gate_calls     step: gate() calls (> 0: the step pauses cooperatively)
    56 f64 gate_seconds   step: total seconds spent blocked at the gate

*Follow* (``gate_closed`` >= 2): the gate is open exactly while the primary on the same
GPU is inside ``io_wait()``. The agent writes the primary's channel path into the sidecar
``<channel>.follow`` and then a new value (2, 3, ...) into ``gate_closed``; the guest maps
the primary's page read-only when the value changes and reads its ``io_depth`` at every
``gate()`` call. So a hinted I/O wait reaches the guest in about a millisecond, without a
round trip through the agent, and the guest stops at its next ``gate()`` call when the
primary computes again. Only the one guest that would compute next follows; the others
stay closed.

A follow may also name guests *ahead* of this one (third and later lines of the sidecar,
their channel paths): then the gate opens only while the primary is in ``io_wait()`` and
every guest ahead is in its own. The agent chains the other guests of a GPU so behind
the standby (the first to compute in the primary's I/O): when the standby enters its own
I/O wait the next guest starts at its next poll, again without the agent, and it stops
at its next ``gate()`` call once a guest ahead computes again.

A follow may also carry a *deadline* (a second line in the sidecar, a ``time.monotonic()``
value): the gate opens once it has passed. The agent sets it behind a primary that gives
no hints, whose I/O wait is inferred from utilization: the deadline is ``io_timeout`` after
the first sample that saw the primary idle, so the guest starts at that moment by itself
instead of waiting for the agent's tick, and the agent takes the deadline back (a new
follow value) as soon as a sample shows the primary computing again.

``time.monotonic`` is CLOCK_MONOTONIC, shared by every process of a Linux machine, so the
agent can compare ``io_since`` with its own monotonic clock.

At interpreter exit (``atexit``, after the non-daemon threads have ended) a step's
process enters I/O for good: the process computes no more, and the GPU is a guest's while
it finishes and its lease is released.

Outside the agent (``M27_CHANNEL`` unset) both calls cost one attribute test and do
nothing: the same script runs by hand, under the agent, or in a test.
"""

from __future__ import annotations

import atexit
import mmap
import os
import sys
import threading
import time
from pathlib import Path
from typing import Final

from m27._exceptions import M27Error

__all__ = ["CHANNEL_SIZE", "Channel", "gate", "io_wait"]

CHANNEL_SIZE: Final = 64
_MAGIC: Final = 0x4337324D  # b"M27C" little-endian
_VERSION: Final = 1
# indices into the int32 (I), float64 (D) and uint64 (Q) views of the page
_I_MAGIC, _I_VERSION, _I_DEPTH, _I_GATE, _I_AT_GATE, _I_PID = 0, 1, 2, 3, 4, 5
_D_IO_SINCE, _D_IO_SECONDS, _D_GATE_SECONDS = 3, 4, 7
_Q_IO_COUNT, _Q_GATE_CALLS = 5, 6

# gate() polls the page: it starts at 0.5 ms and backs off to 5 ms, so a guest resumes
# within ~5 ms of the agent opening the gate (a tenth of the default 50 ms io_timeout tick)
# and a guest parked for hours wakes 200 times a second at most.
_POLL_FIRST: Final = 0.0005
_POLL_MAX: Final = 0.005
# A following guest polls its primary's page at a fixed 1 ms: it is the one guest per GPU
# that runs next, and a hinted I/O wait must reach it within milliseconds.
_POLL_FOLLOW: Final = 0.001
_FOLLOW_FIRST: Final = 2
_NEVER: Final = float("inf")
_monotonic = time.monotonic


class Channel:
    """One step's channel page, seen from either side.

    The agent ``create``s it before starting the step and reads ``io_waiting()`` /
    ``at_gate()`` and writes ``set_gate()``; the step opens the same file from
    ``M27_CHANNEL`` and writes the I/O and gate fields.
    """

    def __init__(self, path: Path, mm: mmap.mmap) -> None:
        self.path = path
        self._mm = mm
        view = memoryview(mm)
        self._i = view.cast("i")
        self._d = view.cast("d")
        self._q = view.cast("Q")
        self._view = view
        self._lock = threading.Lock()
        self._acquire = self._lock.acquire
        self._release = self._lock.release
        # follow mode: the gate value the target was loaded for, and the primary's page
        self._follow_value = 0
        self._follow: Channel | None = None
        self._ahead: tuple[Channel, ...] = ()  # step side: the guests ahead (see above)
        self._follow_target = ""
        self._follow_ahead: tuple[str, ...] = ()  # agent side: the paths it wrote
        self._follow_at: float | None = None  # agent side: the deadline it set
        self._follow_due = _NEVER  # step side: the deadline loaded with the follow
        self._follow_seq = 0
        if self._i[_I_MAGIC] != _MAGIC or self._i[_I_VERSION] != _VERSION:
            self.close()
            raise M27Error(f"{path} is not an m27 channel (version {_VERSION})", file=str(path))

    @classmethod
    def create(cls, path: str | os.PathLike[str], *, gate_open: bool = True) -> Channel:
        """Write a fresh channel file (atomically: a step never maps a half-written one)."""
        target = Path(path)
        page = bytearray(CHANNEL_SIZE)
        view = memoryview(page).cast("i")
        view[_I_MAGIC], view[_I_VERSION] = _MAGIC, _VERSION
        view[_I_GATE] = 0 if gate_open else 1
        view.release()
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_bytes(bytes(page))
        os.replace(tmp, target)
        return cls.open(target)

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, writable: bool = True) -> Channel:
        """Map an existing channel file; M27Error if it is missing or not a channel."""
        target = Path(path)
        try:
            with open(target, "r+b" if writable else "rb") as f:
                if os.fstat(f.fileno()).st_size != CHANNEL_SIZE:
                    raise M27Error(f"{target} is not an m27 channel (size)", file=str(target))
                access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
                mm = mmap.mmap(f.fileno(), CHANNEL_SIZE, access=access)
        except OSError as exc:
            raise M27Error(f"cannot open channel {target}: {exc}", file=str(target)) from exc
        return cls(target, mm)

    # -- agent side -------------------------------------------------------------------

    def io_waiting(self) -> bool:
        """True while the step is inside an ``io_wait()`` block."""
        return self._i[_I_DEPTH] > 0

    def io_since(self) -> float | None:
        """time.monotonic() when the current I/O block began; None when not in I/O."""
        return self._d[_D_IO_SINCE] if self._i[_I_DEPTH] > 0 else None

    def io_count(self) -> int:
        return int(self._q[_Q_IO_COUNT])

    def io_seconds(self) -> float:
        return float(self._d[_D_IO_SECONDS])

    def set_gate(self, open: bool) -> None:
        self._i[_I_GATE] = 0 if open else 1

    def gate_open(self) -> bool:
        return self._i[_I_GATE] == 0

    @property
    def follow_path(self) -> Path:
        """The sidecar that names the channel a following step reads."""
        return self.path.with_name(self.path.name + ".follow")

    def set_follow(
        self,
        primary: str | os.PathLike[str],
        *,
        at: float | None = None,
        ahead: tuple[str | os.PathLike[str], ...] = (),
    ) -> None:
        """Let the step compute exactly while the step whose channel is `primary` is in
        ``io_wait()`` (none: ``""``) and so is every guest whose channel is in `ahead`, or
        once ``time.monotonic()`` reaches `at`; cheap to repeat (the sidecar is rewritten
        only for a new target, deadline or guests ahead)."""
        target = os.fspath(primary)
        paths = tuple(os.fspath(a) for a in ahead)
        current = self._i[_I_GATE]
        if (
            current >= _FOLLOW_FIRST
            and target == self._follow_target
            and at == self._follow_at
            and paths == self._follow_ahead
        ):
            return
        side = self.follow_path
        tmp = side.with_name(f".{side.name}.{os.getpid()}.tmp")
        lines = [target] if at is None and not paths else [target, "" if at is None else repr(at)]
        tmp.write_text("\n".join([*lines, *paths]))
        os.replace(tmp, side)
        self._follow_target, self._follow_at, self._follow_ahead = target, at, paths
        # a value never used before by this page's writer, so the step reloads the target
        self._follow_seq = max(self._follow_seq, current, _FOLLOW_FIRST - 1) + 1
        self._i[_I_GATE] = self._follow_seq

    def following(self) -> bool:
        """True while the gate follows a primary's I/O (see the module docstring)."""
        return self._i[_I_GATE] >= _FOLLOW_FIRST

    def follow_due(self) -> bool:
        """True while the gate follows with a deadline (set here) that has passed: the
        step may be computing on it."""
        at = self._follow_at
        return self.following() and at is not None and _monotonic() >= at

    def at_gate(self) -> bool:
        """True while the step is blocked in ``gate()``."""
        return self._i[_I_AT_GATE] != 0

    def uses_gate(self) -> bool:
        """True once the step has called ``gate()``: it can be paused cooperatively."""
        return self._q[_Q_GATE_CALLS] > 0 or self.at_gate()

    def gate_seconds(self) -> float:
        return float(self._d[_D_GATE_SECONDS])

    def pid(self) -> int | None:
        pid = self._i[_I_PID]
        return pid or None

    def close(self) -> None:
        self._drop_follow()
        for view in (self._i, self._d, self._q, self._view):
            view.release()
        self._mm.close()

    # -- step side (the hot path) -----------------------------------------------------

    def enter_io(self) -> None:
        # acquire/release bound in __init__: a `with` block costs twice as much here
        self._acquire()
        ints = self._i
        depth = ints[_I_DEPTH]
        if depth <= 0:
            self._d[_D_IO_SINCE] = _monotonic()
            depth = 0
        ints[_I_DEPTH] = depth + 1
        self._q[_Q_IO_COUNT] += 1
        self._release()

    def exit_io(self) -> None:
        self._acquire()
        ints = self._i
        depth = ints[_I_DEPTH] - 1
        if depth <= 0:
            depth = 0
            self._d[_D_IO_SECONDS] += _monotonic() - self._d[_D_IO_SINCE]
        ints[_I_DEPTH] = depth
        self._release()

    def _passes(self) -> bool:
        """Whether the gate lets the step through now (open, or following a primary that
        is in I/O while every guest ahead is in its own)."""
        value = self._i[_I_GATE]
        if value < _FOLLOW_FIRST:
            self._follow_value = 0  # the next follow, whatever its value, is loaded afresh
            return value == 0
        if value != self._follow_value:
            self._load_follow(value)
        primary = self._follow
        if primary is not None and primary._i[_I_DEPTH] > 0:
            for guest in self._ahead:  # noqa: SIM110 (a loop: all() costs more on this path)
                if guest._i[_I_DEPTH] <= 0:
                    return False
            return True
        return self._follow_due is not _NEVER and _monotonic() >= self._follow_due

    def _drop_follow(self) -> None:
        for ch in (self._follow, *self._ahead):
            if ch is not None:
                ch.close()
        self._follow, self._ahead = None, ()

    def _load_follow(self, value: int) -> None:
        self._drop_follow()
        self._follow_value = value
        self._follow_due = _NEVER
        try:
            lines = self.follow_path.read_text().split("\n")
        except OSError:
            return  # the sidecar is gone: wait for the agent's next word
        target, at, ahead = lines[0], lines[1] if len(lines) > 1 else "", lines[2:]
        try:
            if at.strip():
                self._follow_due = float(at)
            target = target.strip()
            # the guests ahead first: a follow whose primary opened is complete
            opened: list[Channel] = []
            for path in (a.strip() for a in ahead):
                if path:
                    opened.append(Channel.open(path, writable=False))
                    self._ahead = tuple(opened)  # each closed by _drop_follow if one fails
            self._follow = Channel.open(target, writable=False) if target else None
        except (OSError, ValueError, M27Error):
            # the primary or a guest ahead is gone: closed until the agent's next word
            self._drop_follow()

    def wait_gate(self, timeout: float | None = None) -> bool:
        """Block while the gate is closed; False if ``timeout`` seconds passed first."""
        self._q[_Q_GATE_CALLS] += 1
        if self._i[_I_GATE] == 0 or self._passes():
            return True
        start = time.monotonic()
        self._i[_I_AT_GATE] = 1
        delay = _POLL_FIRST
        try:
            while not self._passes():
                if timeout is not None and time.monotonic() - start >= timeout:
                    return False
                if self._i[_I_GATE] >= _FOLLOW_FIRST:
                    # to the deadline itself when it comes before the next poll
                    time.sleep(max(0.0, min(_POLL_FOLLOW, self._follow_due - _monotonic())))
                else:
                    time.sleep(delay)
                    delay = min(delay * 2, _POLL_MAX)
            return True
        finally:
            self._i[_I_AT_GATE] = 0
            self._d[_D_GATE_SECONDS] += time.monotonic() - start

    def mark_owner(self) -> None:
        self._i[_I_PID] = os.getpid()


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
