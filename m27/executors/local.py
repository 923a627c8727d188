"""Run one step's command to its end: environment, live output, limits, events, retries.

The Prefect task of a step calls :func:`run_step` once it holds its lease. Everything that
happens to the process is recorded in the event log (``StepStarted``, ``StepFailed``,
``StepSucceeded``, ``StepCancelled``), so the agent, ``m27 status`` and the notifier see a
step the same way whether or not the flow process is still alive. Process-group handling
and output pumping live in :mod:`m27.executors._proc`, the launch, results, child environment
and output sink in :mod:`m27.executors._launch`; see docs/runner.md for the promises.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import socket
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from m27 import liveness
from m27._exceptions import M27Error
from m27.clock import Clock, SystemClock
from m27.events import (
    Event,
    StepCancelled,
    StepFailed,
    StepRequeued,
    StepStarted,
    StepSucceeded,
)
from m27.executors import _proc
from m27.executors._guard import Guarded, SelfCheckpoint, open_guard, stopped_early_end
from m27.executors._launch import (
    OMPI_CPU_SET,
    AttemptEnd,
    Sink,
    StepLaunch,
    StepResult,
    child_env,
    default_log_path,
    mpi_launched,
    requeue_reason,
    resolve_argv,
)
from m27.executors.engines import error_said, with_threads
from m27.paths import is_pattern, not_runnable
from m27.store import EventStore
from m27.units import cpu_list, format_duration

log = logging.getLogger(__name__)

#: Lines (and at most this many characters) of output copied into a ``StepFailed`` event.
EVENT_TAIL_LINES = 20
EVENT_TAIL_CHARS = 4000

_RETRY_SLICE_S = 0.5


def run_step(
    launch: StepLaunch,
    store: EventStore,
    *,
    clock: Clock | None = None,
    on_lines: Callable[[str, list[str]], None] | None = None,
    cancel: threading.Event | None = None,
    resume_from: Callable[[], str | None] | None = None,
    held: Callable[[], float] | None = None,
) -> StepResult:
    """Run the step with its retries; record every attempt; never leave a process behind.

    Thread-safe: the flow calls this from one thread per running step. `on_lines(stream,
    lines)` gets the complete lines of each read, in order, one call at a time: on the
    calling thread, or for a note of the checkpoint file watcher (``no checkpoint after
    ...``) on the watcher's. `held()`: the seconds a guest has been held so far (its
    lease follows GuestPaused/GuestResumed), which its `timeout:` does not count.
    """

    def attempts(clock: Clock, sink: Sink, log_path: Path) -> Callable[[int], AttemptEnd]:
        return lambda n: _attempt(
            launch, store, clock, sink, n, log_path, cancel, resume_from, held
        )

    return run_in_step_log(launch, store, clock, on_lines, cancel, attempts)


def run_in_step_log(
    launch: StepLaunch,
    store: EventStore,
    clock: Clock | None,
    on_lines: Callable[[str, list[str]], None] | None,
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
    sink = Sink(None, on_lines)
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
        sink.file, sink.path = log_file, str(log_path)
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
    attempt = launch.first_attempt - 1
    while True:
        if cancel is not None and cancel.is_set():
            return _cancelled(launch, store, clock, sink, attempt, started, None, None, cancel)
        attempt += 1
        sink.tail.clear()
        t0 = clock.monotonic()
        end = one_attempt(attempt)
        took = clock.monotonic() - t0
        if end.cancelled:
            why = requeue_reason(cancel)  # its GPU was lost: it starts again, not an end
            ended = f"stopped: {why}; requeued" if why is not None else "cancelled"
            sink.write(f"=== attempt {attempt} {ended} ===\n")
            sink.flush()
            return _cancelled(
                launch, store, clock, sink, attempt, started, end.exit_code, end.signal, cancel
            )
        will_retry = not end.ok and end.retryable and attempt <= launch.retries
        result = finish_attempt(launch, store, clock, sink, end, attempt, started, took, will_retry)
        if not will_retry:
            return result
        if launch.delay_outside and launch.retry_delay > 0:
            return replace(result, will_retry=True)
        if wait_retry(clock, launch.retry_delay, cancel):
            return _cancelled(launch, store, clock, sink, attempt, started, None, None, cancel)


def begin_attempt(
    launch: StepLaunch,
    sink: Sink,
    attempt: int,
    resume_from: Callable[[], str | None] | None,
) -> tuple[tuple[str, ...], str | None] | AttemptEnd:
    """What every executor does first: frame the attempt in the log, find the checkpoint
    to resume from, check the step's workdir and create its outputs' folders. Returns
    (argv, resume path), or the attempt's end if that failed."""
    argv = resolve_argv(launch.argv, launch.env.get("PATH"))
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
        # `workdir: replicas/{{SEED}}` is made as an output's folder is (`mkdir -p` was
        # what every such pipeline needed first, or its step failed `workdir not found`)
        if (failed := _make(launch.workdir, f"the workdir {launch.workdir}", sink)) is not None:
            return failed
        sink.note(f"made the workdir {launch.workdir}")
    for out, path in launch.output_paths().items():
        # Like Snakemake: `output: out/x.txt` needs no `mkdir out` first (a shell
        # redirection or an engine's -o would fail on a missing folder).
        if is_pattern(str(path.parent)):
            continue  # `frames/*/x.png`: which folders is the program's to say
        if (failed := _make(path.parent, f"the folder of output {out}", sink)) is not None:
            return failed
    return argv, resume


def _make(folder: Path, what: str, sink: Sink) -> AttemptEnd | None:
    """`mkdir -p folder`; the attempt's end, said in its log, when it cannot be made."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = f"cannot create {what}: {exc.strerror or exc}"
        sink.note(why)
        return AttemptEnd(False, why, exit_code=126, retryable=False)
    return None


def _attempt(
    launch: StepLaunch,
    store: EventStore,
    clock: Clock,
    sink: Sink,
    attempt: int,
    log_path: Path,
    cancel: threading.Event | None,
    resume_from: Callable[[], str | None] | None,
    held: Callable[[], float] | None = None,
) -> AttemptEnd:
    opened = begin_attempt(launch, sink, attempt, resume_from)
    if isinstance(opened, AttemptEnd):
        return opened
    g = open_guard(launch, opened[0], store, clock, sink.note)
    argv, resume = g.argv, opened[1] or g.resume_path
    did = ""
    pin: tuple[int, ...] = ()
    if launch.cpus:
        # Bound to its cores only when m27 set the program's thread count (`mdrun -nt`): a
        # program that starts a thread per core of the node (mdrun in a script) runs many
        # times slower on a few of them (measured: 1.7 instead of 100 ns/day).
        threaded, did = with_threads(argv, len(launch.cpus))
        pin = launch.cpus if threaded != argv else ()
        argv = threaded
    env = child_env(launch, attempt, resume)
    cwd = launch.workdir
    try:
        with _proc.pinned(pin) as unpinned:
            proc = _proc.spawn(argv, env, cwd)
    except OSError as exc:
        code, reason = _spawn_error(argv[0], cwd, exc)
        sink.note(reason)
        return AttemptEnd(False, reason, exit_code=code, retryable=False)
    if launch.cpus:
        omp = env.get("OMP_NUM_THREADS", "")
        if mpi_launched(argv) and (cpu_set := env.get(OMPI_CPU_SET)):  # where it matters
            did = ", ".join(filter(None, (did, f"{OMPI_CPU_SET}={cpu_set}")))
        sink.note(_cores_said(launch.cpus, bool(pin), unpinned, did, omp))
    try:
        store.append(
            [
                StepStarted(
                    **launch.head(clock.now()),
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
            proc,
            timeout=launch.timeout,
            grace=launch.grace,
            cancel=cancel,
            emit=sink.emit,
            held=held,
        )
    except BaseException:
        _proc.kill_now(proc)  # idempotent; supervise may already have done it
        raise
    return _judge(launch, outcome, sink.tail, g)


def _cores_said(
    cpus: tuple[int, ...], bound: bool, unpinned: str | None, did: str, omp: str
) -> str:
    """The step log's line on the cores of a GPU step (m27.gpu.cpus); `omp` is the step's
    OMP_NUM_THREADS (its own `env:` may set it)."""
    n = len(cpus)
    said = f"OMP_NUM_THREADS={omp}, M27_CPUS={n}" + (f", {did}" if did else "")
    cores = ("cores " if n > 1 else "core ") + cpu_list(cpus)
    if not bound:
        return (
            f"its GPUs' share of the node's cores is {cores} (gpu_cpus in [performance]): "
            f"{said}; not bound to them, as m27 sets no thread option of this program"
        )
    if unpinned is not None:
        return f"cannot bind it to {cores} ({unpinned}): it may run on any core; {said}"
    return f"on {cores}, its GPUs' share of the node's (gpu_cpus in [performance]): {said}"


def _spawn_error(program: str, cwd: Path | None, exc: OSError) -> tuple[int, str]:
    """The shell's exit code and a reason a person can act on, for a command that never ran."""
    if isinstance(exc, FileNotFoundError):
        if "/" in program and ((cwd or Path.cwd()) / program).exists():
            # The file is there: its #! interpreter is what is missing (bash says the same).
            return 126, f"cannot execute {program}: bad interpreter"
        if "/" not in program and ((cwd or Path.cwd()) / program).is_file():
            # as a shell, a bare name is looked up on PATH only, not in the current folder
            return 127, f"command not found: {program} (the workdir has it: write ./{program})"
        return 127, f"command not found: {program}"
    found = (cwd or Path.cwd()) / program if "/" in program else shutil.which(program, os.F_OK)
    why = not_runnable(found, program) if found is not None else None
    if isinstance(exc, PermissionError):
        return 126, f"permission denied: {program}" + (f": {why}" if why else "")
    if why is not None:
        return 126, f"cannot execute {program}: {why}"
    return 126, f"cannot execute {program}: {exc.strerror or exc}"


def _judge(
    launch: StepLaunch, outcome: _proc.Outcome, tail: Sequence[str], g: Guarded
) -> AttemptEnd:
    rc = outcome.returncode
    code, sig = (rc, None) if rc >= 0 else (None, -rc)
    if outcome.cancelled:
        return AttemptEnd(False, "cancelled", code, sig, cancelled=True)
    if outcome.timed_out:
        why = f"timed out after {format_duration(launch.timeout or 0)}"
        if outcome.held >= 0.5:  # the time held was not counted: say it ran that long
            why += f" of running (and {format_duration(outcome.held)} held as a guest)"
        if outcome.ignored is not None:  # say why it took `grace` longer than the timeout
            why += (
                f"; it did not stop on {outcome.ignored.name} within"
                f" {format_duration(launch.grace)}, so it was killed (SIGKILL)"
            )
        return AttemptEnd(False, why, code, sig)
    if sig == signal.SIGKILL:  # m27 kills only on a timeout or cancel: most often the OOM killer
        return AttemptEnd(False, "killed by SIGKILL (out of memory? see `dmesg`)", code, sig)
    if sig is not None:
        return AttemptEnd(False, f"killed by {_signame(sig)}", code, sig)
    if code != 0:
        said = error_said(tail)  # GROMACS's or LAMMPS's own words for why
        why = f"exited with code {code}" + (f": {said}" if said else "")
        return AttemptEnd(False, why, code, sig)
    if (early := stopped_early_end(launch, tail, g)) is not None:  # its checkpoint: the way on
        return AttemptEnd(False, early[0], 0, retryable=early[1])
    if missing := launch.missing_outputs():
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
        # absolute: a step's outputs are relative to its own workdir, which the readers of
        # the log (`m27 status`, the run summary, its plots) do not know
        outputs = launch.produced_outputs()
        ev = StepSucceeded(
            **launch.head(clock.now()), attempt=attempt, duration_s=took, outputs=outputs
        )
    else:
        sink.write(f"=== attempt {attempt} failed: {end.reason} ===\n")
        ev = StepFailed(
            **launch.head(clock.now()),
            attempt=attempt,
            duration_s=took,
            reason=end.reason,
            exit_code=end.exit_code,
            signal=end.signal,
            log_tail=_event_tail(sink.tail),
            will_retry=will_retry,
            retry_delay=launch.retry_delay if will_retry else 0.0,
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
    cancel: threading.Event | None,
) -> StepResult:
    return record_cancelled(
        launch, store, clock, attempts, clock.monotonic() - started, "\n".join(sink.tail),
        exit_code, sig, requeued=requeue_reason(cancel),
    )  # fmt: skip


def record_cancelled(
    launch: StepLaunch,
    store: EventStore,
    clock: Clock,
    attempts: int,
    took: float,
    log_tail: str = "",
    exit_code: int | None = None,
    sig: int | None = None,
    *,
    requeued: str | None = None,
) -> StepResult:
    """Record that the step was cancelled (after `attempts` attempts) and say so; or, with
    `requeued` (why its lease was lost: `GPU 0 lost`), that it was stopped to ask again:
    not an end, so not ``StepCancelled``."""
    head = launch.head(clock.now())
    if requeued is not None:
        store.append([StepRequeued(**head, attempt=attempts, reason=requeued)])
    else:
        store.append([StepCancelled(**head, reason="cancelled")])
    return StepResult(
        ok=False,
        attempts=attempts,
        exit_code=exit_code,
        signal=sig,
        duration_s=took,
        reason=requeued or "cancelled",
        log_tail=log_tail,
        cancelled=True,
    )


def _event_tail(tail: deque[str]) -> str:
    text = "\n".join(list(tail)[-EVENT_TAIL_LINES:])
    return text[-EVENT_TAIL_CHARS:]


def wait_retry(clock: Clock, delay: float, cancel: threading.Event | None) -> bool:
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
    "AttemptEnd",
    "Guarded",
    "SelfCheckpoint",
    "Sink",
    "StepLaunch",
    "StepResult",
    "child_env",
    "default_log_path",
    "open_guard",
    "record_cancelled",
    "resolve_argv",
    "run_step",
    "stopped_early_end",
    "wait_retry",
]
