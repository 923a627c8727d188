"""Run one step's command to its end: environment, live output, limits, events, retries.

The Prefect task of a step calls :func:`run_step` once it holds its lease. Everything that
happens to the process is recorded in the event log (``StepStarted``, ``StepFailed``,
``StepSucceeded``, ``StepCancelled``), so the agent, ``m27 status`` and the notifier see a
step the same way whether or not the flow process is still alive. Process-group handling
and output pumping live in :mod:`m27.executors._proc`; see docs/runner.md for the promises.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import socket
import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from m27 import liveness
from m27._exceptions import M27Error, RunnerError
from m27.clock import Clock, SystemClock
from m27.config import m27_home
from m27.events import Event, StepCancelled, StepFailed, StepStarted, StepSucceeded
from m27.executors import _proc
from m27.executors._guard import SelfCheckpoint, open_guard
from m27.paths import join_under
from m27.store import EventStore

log = logging.getLogger(__name__)

#: Lines of output kept in :attr:`StepResult.log_tail`.
TAIL_LINES = 50
#: Lines (and at most this many characters) of output copied into a ``StepFailed`` event.
EVENT_TAIL_LINES = 20
EVENT_TAIL_CHARS = 4000

#: Variables that describe one step; inherited values are dropped so a step started from
#: inside another m27 step does not write into its parent's checkpoints.
STEP_VARS = (
    "M27_RUN_ID",
    "M27_STEP",
    "M27_ATTEMPT",
    "M27_CHECKPOINT_DIR",
    "M27_CHECKPOINT_INTERVAL",
    "M27_RESUME_FROM",
)

_RETRY_SLICE_S = 0.5


@dataclass(frozen=True)
class StepLaunch:
    """Everything needed to start one step; ``argv`` is already rendered (no shell)."""

    run_id: str
    step: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: Path | None = None
    timeout: float | None = None
    retries: int = 0
    outputs: tuple[str, ...] = ()
    gpus: tuple[int, ...] = ()
    checkpoint_dir: Path | None = None
    checkpoint_interval: float | None = None
    log_path: Path | None = None
    grace: float = 10.0
    retry_delay: float = 0.0
    #: a program that checkpoints itself: its files are guarded (m27.executors._guard)
    self_checkpoint: SelfCheckpoint | None = None

    def __post_init__(self) -> None:
        ctx = {"run_id": self.run_id, "step": self.step}
        if not self.argv or not self.argv[0]:
            raise RunnerError("a step needs a command", **ctx)
        if self.timeout is not None and self.timeout <= 0:
            raise RunnerError(f"timeout must be positive, got {self.timeout}", **ctx)
        if self.retries < 0:
            raise RunnerError(f"retries must be 0 or more, got {self.retries}", **ctx)
        if self.grace < 0 or self.retry_delay < 0:
            raise RunnerError("grace and retry_delay must be 0 or more", **ctx)


@dataclass(frozen=True)
class StepResult:
    """How the step ended, after all attempts."""

    ok: bool
    attempts: int
    exit_code: int | None
    signal: int | None
    duration_s: float
    reason: str
    log_tail: str
    cancelled: bool = False


@dataclass(frozen=True)
class AttemptEnd:
    """How one attempt ended."""

    ok: bool
    reason: str
    exit_code: int | None = None
    signal: int | None = None
    retryable: bool = True
    cancelled: bool = False


def _home() -> Path:
    # Absolute: the child may run in another working directory.
    return m27_home().absolute()


def default_log_path(run_id: str, step: str) -> Path:
    """``$M27_HOME/runs/<run>/<step>.log``, where ``m27 logs`` looks."""
    return join_under(_home(), "runs", run_id, f"{step}.log")


def resolve_argv(argv: tuple[str, ...]) -> tuple[str, ...]:
    """A bare ``python``/``python3`` means this interpreter.

    The pyenv shim costs ~80 ms per start and may resolve to another interpreter than the
    one m27 (and the step's imports) were installed into.
    """
    if argv[0] in ("python", "python3") and sys.executable:
        return (sys.executable, *argv[1:])
    return argv


def child_env(launch: StepLaunch, attempt: int, resume_from: str | None) -> dict[str, str]:
    """os.environ, then the step's own env, then the m27 variables (which win)."""
    env = {k: v for k, v in os.environ.items() if k not in STEP_VARS}
    env.update(launch.env)
    env["M27_RUN_ID"] = launch.run_id
    env["M27_STEP"] = launch.step
    env["M27_ATTEMPT"] = str(attempt)
    env["M27_HOME"] = str(_home())
    if launch.checkpoint_dir is not None:
        env["M27_CHECKPOINT_DIR"] = str(launch.checkpoint_dir)
    if launch.checkpoint_interval is not None:
        env["M27_CHECKPOINT_INTERVAL"] = repr(float(launch.checkpoint_interval))
    if resume_from is not None:
        env["M27_RESUME_FROM"] = resume_from
    else:
        env.pop("M27_RESUME_FROM", None)
    # A step without GPUs gets an empty list so CUDA cannot pick one behind the agent's back.
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in launch.gpus)
    return env


class Sink:
    """Where one attempt's lines go: the log file, the tail and the caller's callback.

    A failing callback or a full disk is logged once and then ignored: losing log lines is
    better than abandoning a process that may have days of work in it.
    """

    def __init__(self, file: IO[str] | None, on_line: Callable[[str, str], None] | None) -> None:
        self.file = file
        self.on_line = on_line
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._warned: set[str] = set()

    def write(self, text: str) -> None:
        if self.file is None:
            return
        try:
            self.file.write(text)
        except OSError as exc:
            self._warn("log", f"cannot write the step log: {exc}")

    def emit(self, stream: str, lines: list[str]) -> None:
        """Lines reach the file (flushed, for `m27 logs -f`) before the slower callback."""
        self.tail.extend(lines)
        self.write("".join(line + "\n" for line in lines))
        self.flush()
        if self.on_line is not None:
            for line in lines:
                try:
                    self.on_line(stream, line)
                except Exception as exc:
                    self._warn("on_line", f"on_line callback failed: {exc!r}")

    def note(self, line: str) -> None:
        """A line from m27 itself (spawn errors), shown like the step's stderr."""
        self.emit("stderr", [f"m27: {line}"])

    def flush(self) -> None:
        if self.file is None:
            return
        try:
            self.file.flush()
        except OSError as exc:
            self._warn("log", f"cannot write the step log: {exc}")

    def _warn(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning("%s", message)


def run_step(
    launch: StepLaunch,
    store: EventStore,
    *,
    clock: Clock | None = None,
    on_line: Callable[[str, str], None] | None = None,
    cancel: threading.Event | None = None,
    resume_from: Callable[[], str | None] | None = None,
) -> StepResult:
    """Run the step with its retries; record every attempt; never leave a process behind.

    Thread-safe: the flow calls this from one thread per running step. `on_line` is called
    on the calling thread, once per line, in the order the lines were read.
    """

    def attempts(clock: Clock, sink: Sink, log_path: Path) -> Callable[[int], AttemptEnd]:
        return lambda n: _attempt(launch, store, clock, sink, n, log_path, cancel, resume_from)

    return run_in_step_log(launch, store, clock, on_line, cancel, attempts)


def run_in_step_log(
    launch: StepLaunch,
    store: EventStore,
    clock: Clock | None,
    on_line: Callable[[str, str], None] | None,
    cancel: threading.Event | None,
    attempts: Callable[[Clock, Sink, Path], Callable[[int], AttemptEnd]],
) -> StepResult:
    """The step preamble every executor shares (local processes, Slurm jobs), then
    :func:`run_attempts`: the step's log (``launch.log_path`` or :func:`default_log_path`,
    appended across attempts) and its checkpoint directory are made first.

    `attempts(clock, sink, log_path)` builds the executor's one-attempt function; an
    ``OSError`` or an :class:`~m27.M27Error` there (bad ``slurm:`` options), or while
    making the log, ends the step at once as "cannot prepare the step" (not retried).
    """
    clock = clock or SystemClock()
    started = clock.monotonic()
    log_path = launch.log_path or default_log_path(launch.run_id, launch.step)
    sink = Sink(None, on_line)
    try:
        one_attempt = attempts(clock, sink, log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if launch.checkpoint_dir is not None:
            launch.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        log_file = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed below
    except (OSError, M27Error) as exc:
        end = AttemptEnd(False, f"cannot prepare the step: {exc}", retryable=False)
        return finish_attempt(launch, store, clock, sink, end, 1, started, 0.0, will_retry=False)
    with log_file:
        sink.file = log_file
        return run_attempts(launch, store, clock, sink, started, cancel, one_attempt)


def run_attempts(
    launch: StepLaunch,
    store: EventStore,
    clock: Clock,
    sink: Sink,
    started: float,
    cancel: threading.Event | None,
    one_attempt: Callable[[int], AttemptEnd],
) -> StepResult:
    """The retry loop every executor shares (local processes, Slurm jobs): run attempt
    1, 2, ... through `one_attempt` and record each, until one succeeds, the retries are
    spent, or `cancel` is set."""
    attempt = 0
    while True:
        if cancel is not None and cancel.is_set():
            return _cancelled(launch, store, clock, sink, attempt, started, None, None)
        attempt += 1
        sink.tail.clear()
        t0 = clock.monotonic()
        end = one_attempt(attempt)
        took = clock.monotonic() - t0
        if end.cancelled:
            sink.write(f"=== attempt {attempt} cancelled ===\n")
            sink.flush()
            return _cancelled(
                launch, store, clock, sink, attempt, started, end.exit_code, end.signal
            )
        will_retry = not end.ok and end.retryable and attempt <= launch.retries
        result = finish_attempt(launch, store, clock, sink, end, attempt, started, took, will_retry)
        if not will_retry:
            return result
        if _wait_retry(clock, launch.retry_delay, cancel):
            return _cancelled(launch, store, clock, sink, attempt, started, None, None)


def begin_attempt(
    launch: StepLaunch,
    sink: Sink,
    attempt: int,
    resume_from: Callable[[], str | None] | None,
) -> tuple[tuple[str, ...], str | None] | AttemptEnd:
    """What every executor does first: frame the attempt in the log, find the checkpoint
    to resume from and check the step's workdir. Returns (argv, resume path), or the
    attempt's end if that failed."""
    argv = resolve_argv(launch.argv)
    # One line even when an argument holds newlines (python -c scripts), for `m27 logs`.
    command = shlex.join(argv).replace("\n", "\\n")
    sink.write(f"=== attempt {attempt}: {command} ===\n")
    sink.flush()
    try:
        resume = resume_from() if resume_from is not None else None
    except Exception as exc:
        sink.note(f"resume_from failed: {exc!r}")
        return AttemptEnd(False, f"resume_from failed: {exc!r}", retryable=False)
    if launch.workdir is not None and not launch.workdir.is_dir():
        sink.note(f"workdir not found: {launch.workdir}")
        why = f"workdir not found: {launch.workdir}"
        return AttemptEnd(False, why, exit_code=126, retryable=False)
    return argv, resume


def _attempt(
    launch: StepLaunch,
    store: EventStore,
    clock: Clock,
    sink: Sink,
    attempt: int,
    log_path: Path,
    cancel: threading.Event | None,
    resume_from: Callable[[], str | None] | None,
) -> AttemptEnd:
    opened = begin_attempt(launch, sink, attempt, resume_from)
    if isinstance(opened, AttemptEnd):
        return opened
    g = open_guard(launch, opened[0], store, clock, sink.note)
    argv, resume = g.argv, opened[1] or g.resume_path
    env = child_env(launch, attempt, resume)
    cwd = launch.workdir
    try:
        proc = _proc.spawn(argv, env, cwd)
    except OSError as exc:
        code, reason = _spawn_error(argv[0], cwd, exc)
        sink.note(reason)
        return AttemptEnd(False, reason, exit_code=code, retryable=False)
    try:
        store.append(
            [
                StepStarted(
                    at=clock.now(),
                    run_id=launch.run_id,
                    step=launch.step,
                    attempt=attempt,
                    pid=proc.pid,
                    pgid=proc.pid,
                    command=argv,
                    gpus=launch.gpus,
                    log_path=str(log_path),
                    resume_from=resume,
                    host=socket.gethostname(),
                    pid_started=liveness.start_time(proc.pid),
                )
            ]
        )
        outcome = g.supervise(
            proc, timeout=launch.timeout, grace=launch.grace, cancel=cancel, emit=sink.emit
        )
    except BaseException:
        _proc.kill_now(proc)  # idempotent; supervise may already have done it
        raise
    return _judge(launch, outcome)


def _spawn_error(program: str, cwd: Path | None, exc: OSError) -> tuple[int, str]:
    """The shell's exit code and a reason a person can act on, for a command that never ran."""
    if isinstance(exc, FileNotFoundError):
        if "/" in program and ((cwd or Path.cwd()) / program).exists():
            # The file is there: its #! interpreter is what is missing (bash says the same).
            return 126, f"cannot execute {program}: bad interpreter"
        return 127, f"command not found: {program}"
    if isinstance(exc, PermissionError):
        return 126, f"permission denied: {program}"
    return 126, f"cannot execute {program}: {exc.strerror or exc}"


def _judge(launch: StepLaunch, outcome: _proc.Outcome) -> AttemptEnd:
    rc = outcome.returncode
    code, sig = (rc, None) if rc >= 0 else (None, -rc)
    if outcome.cancelled:
        return AttemptEnd(False, "cancelled", code, sig, cancelled=True)
    if outcome.timed_out:
        return AttemptEnd(False, f"timed out after {float(launch.timeout or 0)}s", code, sig)
    if sig is not None:
        return AttemptEnd(False, f"killed by {_signame(sig)}", code, sig)
    if code != 0:
        return AttemptEnd(False, f"exited with code {code}", code, sig)
    base = launch.workdir or Path.cwd()
    missing = [out for out in launch.outputs if not (base / out).exists()]
    if missing:
        return AttemptEnd(False, f"declared output missing: {', '.join(missing)}", code, sig)
    return AttemptEnd(True, "succeeded", code, sig)


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def finish_attempt(
    launch: StepLaunch,
    store: EventStore,
    clock: Clock,
    sink: Sink,
    end: AttemptEnd,
    attempt: int,
    started: float,
    took: float,
    will_retry: bool,
) -> StepResult:
    """Record how an attempt ended (``StepSucceeded``/``StepFailed``) in its log and the store.

    Public because the Slurm executor ends its attempts the same way.
    """
    ev: Event
    if end.ok:
        sink.write(f"=== attempt {attempt} succeeded ===\n")
        ev = StepSucceeded(
            at=clock.now(),
            run_id=launch.run_id,
            step=launch.step,
            attempt=attempt,
            duration_s=took,
            outputs=launch.outputs,
        )
    else:
        sink.write(f"=== attempt {attempt} failed: {end.reason} ===\n")
        ev = StepFailed(
            at=clock.now(),
            run_id=launch.run_id,
            step=launch.step,
            attempt=attempt,
            duration_s=took,
            reason=end.reason,
            exit_code=end.exit_code,
            signal=end.signal,
            log_tail=_event_tail(sink.tail),
            will_retry=will_retry,
        )
    sink.flush()
    store.append([ev])
    return StepResult(
        ok=end.ok,
        attempts=attempt,
        exit_code=end.exit_code,
        signal=end.signal,
        duration_s=clock.monotonic() - started,
        reason=end.reason,
        log_tail="\n".join(sink.tail),
    )


def _cancelled(
    launch: StepLaunch,
    store: EventStore,
    clock: Clock,
    sink: Sink,
    attempts: int,
    started: float,
    exit_code: int | None,
    sig: int | None,
) -> StepResult:
    store.append(
        [StepCancelled(at=clock.now(), run_id=launch.run_id, step=launch.step, reason="cancelled")]
    )
    return StepResult(
        ok=False,
        attempts=attempts,
        exit_code=exit_code,
        signal=sig,
        duration_s=clock.monotonic() - started,
        reason="cancelled",
        log_tail="\n".join(sink.tail),
        cancelled=True,
    )


def _event_tail(tail: deque[str]) -> str:
    text = "\n".join(list(tail)[-EVENT_TAIL_LINES:])
    return text[-EVENT_TAIL_CHARS:]


def _wait_retry(clock: Clock, delay: float, cancel: threading.Event | None) -> bool:
    """Sleep `delay` on the injected clock in short slices; True if cancelled meanwhile."""
    remaining = delay
    while remaining > 0:
        if cancel is not None and cancel.is_set():
            return True
        step = min(remaining, _RETRY_SLICE_S)
        clock.sleep(step)
        remaining -= step
    return cancel is not None and cancel.is_set()


__all__ = [
    "SelfCheckpoint",
    "StepLaunch",
    "StepResult",
    "child_env",
    "default_log_path",
    "open_guard",
    "resolve_argv",
    "run_step",
]
