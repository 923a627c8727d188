"""What a step run is given and what it gives back: the launch, the results, the child's
environment and the sink its output lines go to (used by the local and Slurm executors).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol, TypedDict, runtime_checkable

from m27._exceptions import RunnerError
from m27.config import m27_home
from m27.executors._guard import SelfCheckpoint
from m27.paths import join_under, matches
from m27.units import cpu_list

# The runner's logger, as before this module was split out of m27.executors.local.
log = logging.getLogger("m27.executors.local")

#: Lines of output kept in :attr:`StepResult.log_tail`.
TAIL_LINES = 50

#: Variables that describe one step; inherited values are dropped so a step started from
#: inside another m27 step does not write into its parent's checkpoints.
STEP_VARS = (
    "M27_RUN_ID",
    "M27_STEP",
    "M27_ATTEMPT",
    "M27_CHECKPOINT_DIR",
    "M27_CHECKPOINT_INTERVAL",
    "M27_RESUME_FROM",
    "M27_CPUS",
)


class StepHead(TypedDict):
    """The fields every event about one step begins with (those of ``m27.events.StepEvent``)."""

    at: float
    run_id: str
    step: str


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
    #: the cores it runs on, its GPUs' share of the node's (m27.gpu.cpus); () = any
    cpus: tuple[int, ...] = ()
    checkpoint_dir: Path | None = None
    checkpoint_interval: float | None = None
    log_path: Path | None = None
    grace: float = 10.0
    retry_delay: float = 0.0
    #: the number of this call's first attempt (a leased step that gave its GPUs back for
    #: its ``retry_delay`` goes on counting where it stopped)
    first_attempt: int = 1
    #: the caller waits out ``retry_delay`` itself: a failed attempt with retries left
    #: ends the call (``StepResult.will_retry``), so the node's agent can lend the step's
    #: GPUs meanwhile (m27.node.lease.run_leased)
    delay_outside: bool = False
    #: a program that checkpoints itself: its files are guarded (m27.executors._guard)
    self_checkpoint: SelfCheckpoint | None = None

    def head(self, at: float) -> StepHead:
        """``at``, ``run_id`` and ``step`` of an event about this step, recorded at `at`:
        ``StepStarted(**launch.head(clock.now()), attempt=..., ...)``."""
        return {"at": at, "run_id": self.run_id, "step": self.step}

    def output_paths(self) -> dict[str, Path]:
        """Each declared output and where it is: outputs are relative to the step's
        workdir (the caller's working directory when it has none)."""
        base = self.workdir or Path.cwd()
        return {out: base / out for out in self.outputs}

    def missing_outputs(self) -> list[str]:
        """The declared outputs an attempt that exited 0 did not leave behind; a pattern
        (`frames/*.png`) is missing when nothing matches it."""
        return [out for out, path in self.output_paths().items() if not matches(path)]

    def produced_outputs(self) -> tuple[str, ...]:
        """Absolute paths of the outputs as they are now: each pattern's matches, in order,
        or the pattern itself when it matches more than :data:`MATCHES_KEPT` (the paths go
        into an event, and a folder of 100,000 frames is not worth a row of them)."""
        found: list[str] = []
        for path in self.output_paths().values():
            these = matches(path)
            found += these if len(these) <= MATCHES_KEPT else [str(path)]
        return tuple(found)

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
        if self.first_attempt < 1:
            raise RunnerError(f"first_attempt must be 1 or more, got {self.first_attempt}", **ctx)


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
    #: the last attempt failed and another comes after ``retry_delay``, which the caller
    #: waits out (``StepLaunch.delay_outside``)
    will_retry: bool = False


@runtime_checkable
class Requeueing(Protocol):
    """A stop flag that can tell a requeue from a cancel: the step's lease was lost (a
    GPU vanished, the agent took it back), so it stops to ask again instead of ending."""

    def requeue_reason(self) -> str | None: ...


def requeue_reason(cancel: threading.Event | None) -> str | None:
    """Why the step stops to ask again (`GPU 0 lost`), or None for a cancel or no stop."""
    return cancel.requeue_reason() if isinstance(cancel, Requeueing) else None


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


def resolve_argv(argv: tuple[str, ...], step_path: str | None = None) -> tuple[str, ...]:
    """A bare ``python``/``python3`` means this interpreter, unless the step's own
    ``env: PATH`` puts a folder holding one before the PATH m27 inherited.

    The pyenv shim costs ~80 ms per start and may resolve to another interpreter than the
    one m27 (and the step's imports) were installed into, so the inherited PATH is not
    searched. A folder the step adds (``PATH: /opt/conda/envs/mda/bin:$PATH``) is the
    user choosing an environment: its Python runs, as a shell would run it.
    """
    if argv[0] not in ("python", "python3"):
        return argv
    if step_path:
        inherited = set(os.environ.get("PATH", os.defpath).split(os.pathsep))
        for folder in step_path.split(os.pathsep):
            if folder in inherited:
                break
            if not folder:  # the current folder: the step's own, not ours; not searched
                continue
            candidate = os.path.join(folder, argv[0])
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return (candidate, *argv[1:])
    if sys.executable:
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
    if launch.cpus:
        # OpenMP programs start one thread per core of the machine, not of their mask; the
        # step's own env: says otherwise if it wants to. Under `mpirun -np 4` each rank
        # gets its part of the cores.
        env["M27_CPUS"] = str(len(launch.cpus))
        if "OMP_NUM_THREADS" not in launch.env:
            env["OMP_NUM_THREADS"] = str(max(1, len(launch.cpus) // mpi_ranks(launch.argv)))
        # Open MPI's mpirun binds its ranks to cores 0, 1, ... of the node whatever mask it
        # starts in (measured, Open MPI 4.1.4: under `taskset -c 1`, rank 0 ran on core 0),
        # so the MPI steps of two GPUs shared cores. Its cpu_set keeps the ranks in the
        # share, even with the command's own --bind-to core; unless the step or the
        # environment sets it. (Other MPIs keep the mask they start in, or say otherwise.)
        # Not with cores this process may not use (taken offline, outside a `taskset` of
        # `m27 run`): mpirun then exits 1 without a word, where the step ran before.
        if set(launch.cpus) <= os.sched_getaffinity(0):
            env.setdefault(OMPI_CPU_SET, cpu_list(launch.cpus))
    return env


#: Open MPI's setting (an MCA parameter) of the cores its ranks may run on.
OMPI_CPU_SET = "OMPI_MCA_hwloc_base_cpu_set"


#: Programs that start MPI ranks, and their options that say how many.
_MPI_LAUNCHERS = ("mpirun", "mpiexec", "orterun", "srun")
_RANK_OPTIONS = ("-np", "-n", "--np", "--ntasks")


def mpi_launched(argv: Sequence[str]) -> bool:
    """Whether `argv` starts with an MPI launcher (`mpirun`, `mpiexec`, `srun`)."""
    return bool(argv) and os.path.basename(argv[0]) in _MPI_LAUNCHERS


def mpi_ranks(argv: Sequence[str]) -> int:
    """How many processes `mpirun -np 4 prog` (or `mpiexec -n`, `srun --ntasks=4`) starts
    on this node; 1 for a command that is not started by an MPI launcher or does not say."""
    if not mpi_launched(argv):
        return 1
    for i, arg in enumerate(argv[1:], start=1):
        name, eq, value = arg.partition("=")
        if name in _RANK_OPTIONS:
            text = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            return int(text) if text.isdigit() and int(text) > 0 else 1
    return 1


class Sink:
    """Where one attempt's lines go: the log file, the tail and the caller's callback.

    A failing callback or a full disk is logged once and then ignored: losing log lines is
    better than abandoning a process that may have days of work in it.
    """

    def __init__(
        self, file: IO[str] | None, on_lines: Callable[[str, list[str]], None] | None
    ) -> None:
        self.file = file
        self.on_lines = on_lines
        #: the step log's path, named when it cannot be written
        self.path = ""
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._warned: set[str] = set()
        #: the output readers and the checkpoint file watcher's notes emit from their threads
        self._emitting = threading.RLock()

    def write(self, text: str) -> None:
        if self.file is None:
            return
        try:
            self.file.write(text)
        except OSError as exc:
            self._log_failed(exc)

    def emit(self, stream: str, lines: list[str]) -> None:
        """Lines reach the file (flushed, for `m27 logs -f`) before the slower callback.

        The callback gets the lines of one read as one list: the child's pipe is read on
        this thread, so a per-line callback (a Prefect log record, a console write each)
        held a chatty program at ~10,000 lines/s, blocked on its full pipe."""
        with self._emitting:
            self.tail.extend(lines)
            self.write("".join(line + "\n" for line in lines))
            self.flush()
            if self.on_lines is not None:
                try:
                    self.on_lines(stream, lines)
                except Exception as exc:
                    self._warn("on_lines", f"on_lines callback failed: {exc!r}")

    def note(self, line: str) -> None:
        """A line from m27 itself (spawn errors), shown like the step's stderr."""
        self.emit("stderr", [f"m27: {line}"])

    def flush(self) -> None:
        if self.file is None:
            return
        try:
            self.file.flush()
        except OSError as exc:
            self._log_failed(exc)

    def _log_failed(self, exc: OSError) -> None:
        where = f" {self.path}" if self.path else ""
        self._warn(
            "log",
            f"cannot write the step log{where}: {exc.strerror or exc}; the step goes on, but"
            " its output from here on is not kept there",
        )

    def _warn(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning("%s", message)


#: A pattern's matches recorded in ``StepSucceeded.outputs`` (more: the pattern itself).
MATCHES_KEPT = 100
