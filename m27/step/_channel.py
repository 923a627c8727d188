"""What a step's own code tells the agent: ``m27.io_wait()`` and ``m27.gate()``.

The two calls sit on a step's hot path (an MD loop may save a frame every few
milliseconds), so they never talk to a server. The agent gives each step a small file,
the *channel*, and passes its path in ``M27_CHANNEL``; the step maps it into memory and
the calls are plain writes and reads of that shared page: no system call while the gate is
open, no lock shared with another process.

Layout (128 bytes, native byte order, version 2)::

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
    64 i32 borrowing      step: 1 while computing on a follow pass (until its next I/O wait
                          or block at the gate)
    72 f64 yield_until    step: while a primary yields (below), the time.monotonic() at
                          which it stops yielding; 0 otherwise

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

*Yield* (``gate_closed`` <= -1, a primary's gate): the gate is open unless a guest named
in the sidecar ``<channel>.yield`` is *borrowing* (computing on a follow pass, neither in
its own I/O wait nor at its gate) at the primary's first ``gate()`` call after an I/O
wait; then the primary waits there until that guest enters its own I/O wait or reaches
its gate, at most the bound on the sidecar's first line from the end of the primary's I/O
wait (``yield_until`` on the primary's page), and the guest goes on through its gate
meanwhile. The agent sets it only where the policy says the guests
rank as high as the primary (:attr:`m27.policy.Decision.yield_to`): a guest whose compute
phase ends a few milliseconds after its primary's I/O wait then ends that phase, instead
of being stopped for a whole cycle and doing its own I/O in step with the primary's.

``time.monotonic`` is CLOCK_MONOTONIC, shared by every process of a Linux machine, so the
agent can compare ``io_since`` with its own monotonic clock.

At interpreter exit (``atexit``, after the non-daemon threads have ended) a step's
process enters I/O for good: the process computes no more, and the GPU is a guest's while
it finishes and its lease is released.

Outside the agent (``M27_CHANNEL`` unset) both calls cost one attribute test and do
nothing: the same script runs by hand, under the agent, or in a test.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from pathlib import Path
from typing import Final

from m27._exceptions import M27Error

__all__ = ["CHANNEL_SIZE", "Channel"]

CHANNEL_SIZE: Final = 128
_MAGIC: Final = 0x4337324D  # b"M27C" little-endian
_VERSION: Final = 2
# indices into the int32 (I), float64 (D) and uint64 (Q) views of the page
_I_MAGIC, _I_VERSION, _I_DEPTH, _I_GATE, _I_AT_GATE, _I_PID = 0, 1, 2, 3, 4, 5
_I_BORROW = 16
_D_IO_SINCE, _D_IO_SECONDS, _D_GATE_SECONDS, _D_YIELD_UNTIL = 3, 4, 7, 9
_Q_IO_COUNT, _Q_GATE_CALLS = 5, 6

# gate() polls the page: it starts at 0.5 ms and backs off to 5 ms, so a guest resumes
# within ~5 ms of the agent opening the gate (a tenth of the default 50 ms io_timeout tick)
# and a guest parked for hours wakes 200 times a second at most.
_POLL_FIRST: Final = 0.0005
_POLL_MAX: Final = 0.005
# A following guest polls its primary's page at a fixed 1 ms: it is the one guest per GPU
# that runs next, and a hinted I/O wait must reach it within milliseconds.
_POLL_FOLLOW: Final = 0.001
# A yielding primary polls its guests' pages every 0.5 ms: it waits a few milliseconds.
_POLL_YIELD: Final = 0.0005
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
        # yield mode (a primary's gate): the guests it yields to and the bound
        self._yield_value = 0  # step side: the gate value the sidecar was loaded for
        self._yield_to: tuple[Channel, ...] = ()
        self._yield_bound = 0.0
        self._may_yield = False  # step side: from leaving an I/O wait to the next pass
        self._yield_paths: tuple[str, ...] = ()  # agent side: what it wrote
        self._yield_set_bound = 0.0
        self._yield_seq = 0
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
        try:
            tmp.write_bytes(bytes(page))
            os.replace(tmp, target)
        except OSError:  # a full disk: leave no half-written file behind
            tmp.unlink(missing_ok=True)
            raise
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

    def following(self, primary: str | os.PathLike[str] | None = None) -> bool:
        """True while the gate follows a primary's I/O (see the module docstring); with
        `primary`, the one whose channel is there (as set on this side)."""
        if self._i[_I_GATE] < _FOLLOW_FIRST:
            return False
        return primary is None or os.fspath(primary) == self._follow_target

    def follow_due(self) -> bool:
        """True while the gate follows with a deadline (set here) that has passed: the
        step may be computing on it."""
        at = self._follow_at
        return self.following() and at is not None and _monotonic() >= at

    @property
    def yield_path(self) -> Path:
        """The sidecar that names the guests a yielding primary waits for."""
        return self.path.with_name(self.path.name + ".yield")

    def set_yield(self, guests: tuple[str | os.PathLike[str], ...], bound: float) -> None:
        """Open the gate, except that right after an I/O wait the step waits (at most
        `bound` seconds) while one of `guests` (channel paths) computes on a follow pass
        (see the module docstring); cheap to repeat."""
        paths = tuple(os.fspath(g) for g in guests)
        current = self._i[_I_GATE]
        if current < 0 and paths == self._yield_paths and bound == self._yield_set_bound:
            return
        side = self.yield_path
        tmp = side.with_name(f".{side.name}.{os.getpid()}.tmp")
        tmp.write_text("\n".join([repr(float(bound)), *paths]))
        os.replace(tmp, side)
        self._yield_paths, self._yield_set_bound = paths, bound
        self._yield_seq = min(self._yield_seq, current, 0) - 1
        self._i[_I_GATE] = self._yield_seq

    def yields(self) -> bool:
        """True while the gate is in yield mode (set by :meth:`set_yield`)."""
        return self._i[_I_GATE] < 0

    def yielding(self) -> bool:
        """True from the moment the step left an I/O wait, in yield mode, until it passes
        its gate or the bound ends: a borrowing guest may go on computing meanwhile."""
        return self._d[_D_YIELD_UNTIL] > _monotonic()

    def borrowing(self) -> bool:
        """True while the step computes on a follow pass (not in I/O, not at its gate)."""
        i = self._i
        return i[_I_BORROW] != 0 and i[_I_DEPTH] <= 0 and i[_I_AT_GATE] == 0

    def at_gate(self) -> bool:
        """True while the step is blocked in ``gate()``."""
        return self._i[_I_AT_GATE] != 0

    def uses_gate(self) -> bool:
        """True once the step has called ``gate()``: it can be paused cooperatively."""
        return self._q[_Q_GATE_CALLS] > 0 or self.at_gate()

    def passed_gate(self) -> bool:
        """True once the step has gone through its gate (it has computed past it)."""
        calls = self._q[_Q_GATE_CALLS]
        return calls > 1 or (calls == 1 and not self.at_gate())

    def gate_seconds(self) -> float:
        return float(self._d[_D_GATE_SECONDS])

    def pid(self) -> int | None:
        pid = self._i[_I_PID]
        return pid or None

    def close(self) -> None:
        self._drop_follow()
        self._drop_yield()
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
        ints[_I_BORROW] = 0  # a guest's compute phase ends at its own I/O wait
        self._q[_Q_IO_COUNT] += 1
        self._release()

    def exit_io(self) -> None:
        self._acquire()
        ints = self._i
        depth = ints[_I_DEPTH] - 1
        if depth <= 0:
            depth = 0
            d = self._d
            now = _monotonic()
            d[_D_IO_SECONDS] += now - d[_D_IO_SINCE]
            value = ints[_I_GATE]
            if value < 0:  # a primary that yields: its window opens as it leaves the wait
                if value != self._yield_value:
                    self._load_yield(value)
                self._may_yield = True
                d[_D_YIELD_UNTIL] = now + self._yield_bound
        ints[_I_DEPTH] = depth
        self._release()

    def _passes(self) -> bool:
        """Whether the gate lets the step through now (open, or following a primary that
        is in I/O while every guest ahead is in its own)."""
        ints = self._i
        value = ints[_I_GATE]
        if value < _FOLLOW_FIRST:
            self._follow_value = 0  # the next follow, whatever its value, is loaded afresh
            if value < 0:
                return self._yield_passes(value)
            return value == 0
        if value != self._follow_value:
            self._load_follow(value)
        primary = self._follow
        if primary is not None:
            if primary._i[_I_DEPTH] > 0:
                for guest in self._ahead:
                    if guest._i[_I_DEPTH] <= 0:
                        return False
                ints[_I_BORROW] = 1
                return True
            if ints[_I_BORROW] and primary._d[_D_YIELD_UNTIL] > _monotonic():
                return True  # the primary waits for this compute phase to end
        if self._follow_due is not _NEVER and _monotonic() >= self._follow_due:
            ints[_I_BORROW] = 1
            return True
        return False

    def _yield_passes(self, value: int) -> bool:
        """A primary's gate in yield mode: see the module docstring."""
        if not self._may_yield:
            return True
        if value != self._yield_value:
            self._load_yield(value)
        if not any(guest.borrowing() for guest in self._yield_to):
            return self._end_yield()  # no guest is in the middle of a compute phase
        return _monotonic() >= self._d[_D_YIELD_UNTIL] and self._end_yield()

    def _end_yield(self) -> bool:
        self._may_yield = False  # once per I/O wait: computing, it yields no more
        if self._d[_D_YIELD_UNTIL] != 0.0:
            self._d[_D_YIELD_UNTIL] = 0.0
        return True

    def _drop_yield(self) -> None:
        for ch in self._yield_to:
            ch.close()
        self._yield_to = ()

    def _load_yield(self, value: int) -> None:
        self._drop_yield()
        self._yield_value, self._yield_bound = value, 0.0
        try:
            lines = self.yield_path.read_text().split("\n")
            bound = float(lines[0])
        except (OSError, ValueError):
            return  # the sidecar is gone or torn: an open gate, no yield
        opened: list[Channel] = []
        for path in (p.strip() for p in lines[1:]):
            try:
                if path:
                    opened.append(Channel.open(path, writable=False))
            except M27Error:
                continue  # that guest is gone: it computes no more
        self._yield_to, self._yield_bound = tuple(opened), max(0.0, bound)

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
        ints = self._i
        ints[_I_BORROW] = 0
        ints[_I_AT_GATE] = 1
        delay = _POLL_FIRST
        try:
            while not self._passes():
                if timeout is not None and time.monotonic() - start >= timeout:
                    return False
                if ints[_I_GATE] < 0:  # yielding: to the end of the bound at most
                    time.sleep(max(0.0, min(_POLL_YIELD, self._d[_D_YIELD_UNTIL] - _monotonic())))
                elif ints[_I_GATE] >= _FOLLOW_FIRST:
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
