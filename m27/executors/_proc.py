"""Process-group supervision under the runner: pump output, enforce limits, leave nothing behind.

The child runs in its own session, so its process group holds everything it started that did
not deliberately escape (``setsid``/daemonizing). Every stop signal goes to that group, and the
supervisor does not return while a live member remains: a step's ``sleep 1000`` grandchild
dies with it, and a leftover background process is stopped when the main process exits.

Output is pumped from both pipes with a selector on the calling thread rather than reader
threads, for two reasons: the caller's callbacks run on the caller's thread (Prefect's run
logger is bound to the task's context there), and stdout/stderr lines come out in the order
they were read, with no lock ordering to get wrong.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: A line longer than this many characters is emitted in pieces, so a child that never
#: writes a newline cannot grow the supervisor's memory without bound.
MAX_LINE = 65536
#: A progress line redrawn with carriage returns (`gmx mdrun -v`: `\rstep 1400, will
#: finish ...` for hours, one newline at the end) is shown at most this often meanwhile.
PROGRESS_EVERY_S = 5.0

#: How often the supervisor wakes to look at the deadline, the cancel flag and the group.
POLL_S = 0.05

#: After the group is gone, how long to keep reading pipes that are still open. Only a
#: process that escaped the group (it called setsid) can hold them; it is not waited for.
DRAIN_S = 1.0

_READ_SIZE = 65536


@dataclass(frozen=True)
class Outcome:
    """How a supervised process ended; ``returncode`` is Popen's (negative: killed by signal)."""

    returncode: int
    timed_out: bool
    cancelled: bool
    #: the stop signal the group outlived for the whole grace, so it got SIGKILL (None:
    #: it stopped in time, or was never asked to): a timeout's reason says so.
    ignored: signal.Signals | None = None
    #: seconds it was held (a guest paused while its GPU's primary computed): not counted
    #: against the timeout, and a timeout's reason says how long
    held: float = 0.0


class LineSplitter:
    """Bytes of one stream in, text lines out: tolerant of bad UTF-8 and split characters.

    A carriage return inside a line keeps only what follows it, as a terminal would show a
    progress bar, so ``10%\\r20%\\r30%\\n`` becomes one line ``30%``. While such a line is
    being redrawn, its latest complete state is also given out as a line of its own, at most
    every `progress_every` seconds of the `now` passed to :meth:`feed` (none without one):
    `gmx mdrun -v` redraws `step N, will finish ...` for days before its one newline, and
    nothing of it showed until the run ended. Only the text after the last carriage return
    is kept meanwhile, so a redrawn line holds no memory however long it runs.
    """

    def __init__(self, max_line: int = MAX_LINE, progress_every: float = PROGRESS_EVERY_S):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buf = ""
        self._max = max_line
        self._every = progress_every
        self._shown: str | None = None  # the progress line given out last
        self._shown_at: float | None = None

    def feed(self, data: bytes, now: float | None = None) -> list[str]:
        self._buf += self._decoder.decode(data)
        *lines, self._buf = self._buf.split("\n")
        out = [_clean(line) for line in lines]
        if lines:
            if out[0] == self._shown:
                out.pop(0)  # the redrawn line ended as it was last given out
            self._shown = None
        if "\r" in self._buf:
            *drawn, current = self._buf.split("\r")
            latest = next((d for d in reversed(drawn) if d.strip()), None)
            # what the line would show if it ended now; `abc\r` may be half of `abc\r\n`
            self._buf = "\r" + current if current or latest is None else f"\r{latest}\r"
            if latest is not None and latest != self._shown and self._due(now):
                out.append(latest)
                self._shown, self._shown_at = latest, now
        while len(self._buf) > self._max:
            out.append(_clean(self._buf[: self._max]))
            self._buf = self._buf[self._max :]
        return out

    def _due(self, now: float | None) -> bool:
        if now is None:
            return False
        return self._shown_at is None or now - self._shown_at >= self._every

    def finish(self) -> list[str]:
        """The partial last line (no trailing newline), if any."""
        rest = self._buf + self._decoder.decode(b"", final=True)
        self._buf = ""
        shown, self._shown = self._shown, None
        return [] if not rest or _clean(rest) == shown else [_clean(rest)]


def _clean(line: str) -> str:
    line = line.rstrip("\r")
    return line.rsplit("\r", 1)[-1] if "\r" in line else line


@contextlib.contextmanager
def pinned(cpus: Collection[int]) -> Iterator[str | None]:
    """This thread on `cpus` while the body starts a child, which inherits the mask: the
    program's first thread is already there (set on the child after its start, the
    threads it made first would keep every core). Linux's sched_setaffinity(0) is the
    calling thread's alone, so the rest of the process is untouched, and the old mask is
    put back after. Yields why the mask could not be set (the child then runs anywhere).
    """
    if not cpus:
        yield None
        return
    try:
        old = os.sched_getaffinity(0)
        os.sched_setaffinity(0, cpus)
    except (AttributeError, OSError) as exc:
        yield getattr(exc, "strerror", None) or str(exc)
        return
    try:
        yield None
    finally:
        os.sched_setaffinity(0, old)


def spawn(argv: Sequence[str], env: Mapping[str, str], cwd: Path | None) -> subprocess.Popen[bytes]:
    """Start `argv` without a shell, as the leader of a new session and process group."""
    return subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
        close_fds=True,
    )


def group_alive(pgid: int) -> bool:
    """Whether any process of the group is still running (zombies do not count).

    Zombies matter here: where PID 1 does not reap orphans (containers), a finished
    grandchild stays a zombie in the group forever and ``killpg(pgid, 0)`` keeps succeeding.
    """
    try:  # no process at all (the usual end): no need to read every process's stat
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send `sig` to the whole group; a group that is already gone is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def kill_now(proc: subprocess.Popen[bytes]) -> None:
    """Last resort on an error path: SIGKILL the group, reap the leader, close the pipes."""
    signal_group(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait()
    _close_pipes(proc)


def _close_pipes(proc: subprocess.Popen[bytes]) -> None:
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def supervise(
    proc: subprocess.Popen[bytes],
    *,
    timeout: float | None,
    grace: float,
    cancel: threading.Event | None,
    emit: Callable[[str, list[str]], None],
    stop_signal: signal.Signals = signal.SIGTERM,
    held: Callable[[], float] | None = None,
) -> Outcome:
    """Pump `proc`'s output to `emit` until it and its whole group are gone.

    On timeout or cancel the group gets `stop_signal` (SIGTERM unless the program
    checkpoints on another), then SIGKILL `grace` seconds later. When the leader exits on
    its own, members it left running get the same treatment. Real time is used on purpose:
    a deadline must pass in the world, not on a test's fake clock. `held()` (a guest's
    seconds paused so far) moves the timeout on by the time held since the start: a
    `timeout: 10m` guest held nine minutes while the primary computed was killed after one
    minute of running.
    `emit` gets the complete lines of each chunk read from one stream, as soon as it is read.
    """
    assert proc.stdout is not None and proc.stderr is not None
    pgid = proc.pid
    deadline = None if timeout is None else time.monotonic() + timeout
    held_before = held() if held is not None else 0.0
    held_now = 0.0
    sel = selectors.DefaultSelector()
    splitters: dict[int, tuple[str, LineSplitter]] = {}
    for name, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
        sel.register(pipe.fileno(), selectors.EVENT_READ)
        splitters[pipe.fileno()] = (name, LineSplitter())
    term_at: float | None = None
    killed_at: float | None = None
    gone_at: float | None = None
    alive, next_scan = True, 0.0
    timed_out = cancelled = False
    clean = False
    try:
        while True:
            now = time.monotonic()
            rc = proc.poll()
            # Scanned only once the leader is gone (until then the group is alive anyway),
            # and at most once per POLL_S however fast output arrives.
            if rc is not None and gone_at is None and now >= next_scan:
                alive, next_scan = group_alive(pgid), now + POLL_S
            if term_at is None:
                if rc is None and cancel is not None and cancel.is_set():
                    cancelled = True
                elif rc is None and deadline is not None and now >= deadline:
                    if held is not None:
                        held_now = held() - held_before
                    timed_out = now >= deadline + held_now
                if cancelled or timed_out or (rc is not None and alive):
                    signal_group(pgid, stop_signal if rc is None else signal.SIGTERM)
                    # A paused (SIGSTOPped) guest only acts on SIGTERM once it runs again.
                    signal_group(pgid, signal.SIGCONT)
                    term_at = now
            if term_at is not None and killed_at is None and now >= term_at + grace:
                signal_group(pgid, signal.SIGKILL)
                killed_at = now
            # A member stuck in uninterruptible sleep may outlive SIGKILL for a while; it is
            # not waited for forever.
            stuck = killed_at is not None and now >= killed_at + DRAIN_S
            if rc is not None and gone_at is None and (not alive or stuck):
                gone_at = now
            if gone_at is not None and (not splitters or now >= gone_at + DRAIN_S):
                break
            if not splitters and rc is None and term_at is None:
                # Both pipes are closed but the leader still runs (or is not reaped yet):
                # wait on the process itself, not a select() over nothing that would sleep
                # a whole POLL_S (up to 50 ms per short step).
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(POLL_S)
                continue
            for key, _ in sel.select(POLL_S):
                fd = int(key.fd)
                name, splitter = splitters[fd]
                data = os.read(fd, _READ_SIZE)
                if data:
                    lines = splitter.feed(data, now)
                else:
                    lines = splitter.finish()
                    sel.unregister(fd)
                    del splitters[fd]
                if lines:
                    emit(name, lines)
        for name, splitter in splitters.values():
            if lines := splitter.finish():
                emit(name, lines)
        clean = True
        ignored = None if killed_at is None else stop_signal
        return Outcome(proc.wait(), timed_out, cancelled, ignored, held_now)
    finally:
        sel.close()
        if clean:
            _close_pipes(proc)
        else:
            kill_now(proc)
