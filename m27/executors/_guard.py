"""The runner's side of a self-checkpointing program (GROMACS, LAMMPS, `files:`).

Before the program starts, the newest good capture of its files is restored into the
workdir and the resume arguments are added (the recipe may adjust them: GROMACS falls
back to `-noappend` when the outputs do not match the checkpoint). While it runs, a
:class:`~m27.checkpoint.files.FileGuard` thread captures each complete new version of its
files. A stop (cancel, lost GPU, timeout) sends the program its checkpoint signal and waits
the checkpoint grace before SIGKILL; what the program wrote is captured after it exits.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from m27.checkpoint.files import (
    FileGuard,
    capture_dir,
    matched,
    newer_than_captures,
    restore_files,
)
from m27.checkpoint.saves import SaveWatch
from m27.clock import Clock
from m27.executors import _proc
from m27.executors.engines import recipe_named, stopped_early
from m27.store import EventStore


@dataclass(frozen=True)
class SelfCheckpoint:
    """What the runner guards for a step whose program checkpoints itself."""

    files: tuple[str, ...]
    resume: tuple[str, ...] = ()
    signal: str = "TERM"
    recipe: str | None = None
    #: capture folders of the runs this one resumes, newest first (its own comes first)
    restore_from: tuple[Path, ...] = ()
    poll: float = 1.0
    pipeline: str = ""
    #: the step's checkpoint interval: at most one capture per interval while it runs
    every: float | None = None


@dataclass
class Guarded:
    """One attempt's view: the command to start and what watches its files."""

    argv: tuple[str, ...]
    resume_path: str | None = None
    guard: FileGuard | None = None
    stop_signal: signal.Signals = signal.SIGTERM
    poll: float = 1.0
    #: for a step that saves with m27.Checkpointer: says when it has saved nothing
    saves: SaveWatch | None = None

    def __post_init__(self) -> None:
        self._before = self.guard.captures if self.guard is not None else 0

    def captured(self) -> bool | None:
        """Whether a checkpoint of the program's files was captured since the attempt
        began (None: nothing watches its files)."""
        return None if self.guard is None else self.guard.captures > self._before

    def supervise(
        self,
        proc: subprocess.Popen[bytes],
        *,
        timeout: float | None,
        grace: float,
        cancel: threading.Event | None,
        emit: Callable[[str, list[str]], None],
        held: Callable[[], float] | None = None,
    ) -> _proc.Outcome:
        """:func:`_proc.supervise` with the file watcher running beside it."""
        with self.watching(held):
            return _proc.supervise(
                proc,
                timeout=timeout,
                grace=grace,
                cancel=cancel,
                emit=emit,
                stop_signal=self.stop_signal,
                held=held,
            )

    @contextmanager
    def watching(self, held: Callable[[], float] | None = None) -> Iterator[None]:
        """The file watcher runs inside the block; what is left is captured at its end.
        `held()` (a guest's seconds paused so far) is time its "no checkpoint after"
        notes do not count: a guest held by the agent makes no progress to save."""
        watchers = [w for w in (self.guard, self.saves) if w is not None]
        for watcher in watchers:
            watcher.start(self.poll, held)
        try:
            yield
        finally:
            for watcher in watchers:
                watcher.stop()


class _Launch(Protocol):
    """The parts of a StepLaunch this module reads."""

    @property
    def run_id(self) -> str: ...
    @property
    def step(self) -> str: ...
    @property
    def argv(self) -> tuple[str, ...]: ...
    @property
    def workdir(self) -> Path | None: ...
    @property
    def checkpoint_dir(self) -> Path | None: ...
    @property
    def self_checkpoint(self) -> SelfCheckpoint | None: ...
    @property
    def checkpoint_interval(self) -> float | None: ...


def open_guard(
    launch: _Launch,
    argv: tuple[str, ...],
    store: EventStore,
    clock: Clock,
    note: Callable[[str], None],
) -> Guarded:
    """Restore the newest good capture (adding the resume arguments), set up the watcher.

    A step with `checkpoint:` and no files to capture saves with m27.Checkpointer (or
    not at all): its watcher only says when no save came."""
    spec, checkpoint_dir, workdir = launch.self_checkpoint, launch.checkpoint_dir, launch.workdir
    run_id, step = launch.run_id, launch.step
    if spec is None or not spec.files or checkpoint_dir is None:
        every = launch.checkpoint_interval
        if checkpoint_dir is None or not every:
            return Guarded(argv)
        saves = SaveWatch(checkpoint_dir, every, clock=clock, warn=note)
        saves.baseline()
        return Guarded(argv, saves=saves)
    where = workdir or Path.cwd()
    recipe = recipe_named(spec.recipe)
    validate = recipe.valid_file if recipe is not None else None
    read_step = recipe.recorded_step if recipe is not None else None
    together = getattr(recipe, "together", None)  # a registered recipe may lack it
    own = capture_dir(checkpoint_dir)
    guard = FileGuard(
        own,
        where,
        spec.files,
        store=store,
        run_id=run_id,
        step=step,
        pipeline=spec.pipeline,
        validate=validate,
        read_step=read_step,
        together=together is not None and together(argv),
        clock=clock,
        every=spec.every,
        warn=note,
    )
    if validate is not None and newer_than_captures(
        [own, *spec.restore_from], where, spec.files, validate
    ):
        names = ", ".join(matched(where, spec.files))  # `water-1.restart`, not `*-1.restart`
        if guard.poll(final=True):
            note(f"{names} in the workdir: complete and newer than the last capture")
    restored = restore_files(
        [own, *spec.restore_from],
        where,
        validate=validate,
        read_step=read_step,
        note=note,
        store=store,
        run_id=run_id,
        step=step,
        clock=clock,
    )
    resume_path = None
    if restored is not None:
        resume = spec.resume
        if recipe is not None:
            resume = recipe.resume_args(argv, where, resume, note)
        at = f" (step {restored.engine_step})" if restored.engine_step is not None else ""
        note(
            f"restored {', '.join(restored.files)} from {restored.path}{at}; "
            f"resuming with: {shlex.join(resume) or '(no extra arguments)'}"
        )
        argv = (*argv, *resume)
        resume_path = str(restored.path)
    guard.baseline()  # neither restored nor stale files are this attempt's checkpoints
    sig = signal.Signals[f"SIG{spec.signal}"]
    return Guarded(argv, resume_path, guard, sig, spec.poll)


def stopped_early_end(
    launch: _Launch, tail: Sequence[str], g: Guarded, *, signalled: bool = True
) -> tuple[str, bool] | None:
    """Why an engine that exited 0 stopped before its end (:func:`stopped_early`), and
    whether another attempt can get further: only when a checkpoint of its files was
    captured during this one. Else the next attempt starts where this one did and stops at
    the same point (CP2K's WALLTIME before its `&EACH MD n` steps; `-maxh` on a step
    without `checkpoint:`), and `retries: 100` ran it a hundred times. None: it ran to
    its end, as far as its output and files say."""
    ckpt = launch.self_checkpoint
    said = stopped_early(
        tail, signalled=signalled, recipe=ckpt.recipe if ckpt else None,
        argv=launch.argv, workdir=launch.workdir,
    )  # fmt: skip
    if said is None:
        return None
    resume = f"`m27 run --resume {launch.run_id}` continues it"
    captured = g.captured()
    if captured:
        return f"{said}; {resume}", True
    if captured is None:
        why = "would start over and stop the same way: the step has no `checkpoint:`"
    else:
        why = "would stop the same way: it wrote no checkpoint since this one began"
    return f"{said}; another attempt {why}", False
