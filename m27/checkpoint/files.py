"""Capturing a program's own checkpoint files into the differential store, and restoring them.

Programs such as GROMACS write their checkpoints themselves. While such a step runs, the
runner's :class:`FileGuard` polls the declared globs; a file set is captured when it
changed since the last capture and looks *complete* (the engine's own validity check
passes, or without one the same size and mtime on two polls in a row; and it did not
change while being read), at most once per checkpoint interval, through the same
:class:`~m27.checkpoint.Checkpointer` as arrays: each file is a byte array, so only
changed chunks are written (zstd, atomic manifest, xxh3 per chunk), the commit is a
``CheckpointWritten`` event with ``source="files"``, and retention keeps the last N.
:func:`restore_files` puts the newest capture that passes its hash checks back into the
workdir: a torn or corrupt capture is skipped and the previous one used.

Capturing runs on the runner's thread, never in the program: a poll is a few ``stat``
calls, and a capture reads files the program has finished writing.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

import numpy as np

from m27._exceptions import CheckpointError
from m27.checkpoint._checkpointer import Checkpointer
from m27.checkpoint._format import manifests
from m27.checkpoint._reader import load
from m27.checkpoint._report import Reporter
from m27.checkpoint.saves import STARTUP_SLACK_S
from m27.clock import Clock, SystemClock
from m27.events import CheckpointRestored
from m27.store import EventStore
from m27.units import format_duration

log = logging.getLogger("m27.checkpoint")

#: State key prefix of a captured file; the rest is its path relative to the workdir.
FILE_KEY = "file:"

#: (size, mtime_ns, inode): what "unchanged" means for a file between polls.
Signature = tuple[int, int, int]

#: Name prefix of a file being restored (it keeps its suffix, for the engine's check).
RESTORE_PREFIX = ".m27-restore."

Validator = Callable[[Path], str | None]
#: The engine's own step recorded in a checkpoint file (its name, its bytes), or None.
StepReader = Callable[[str, bytes | memoryview], int | None]


#: The folder, inside a step's checkpoint directory, that holds its file captures.
CAPTURES = "files"


def capture_dir(checkpoint_dir: Path) -> Path:
    """Where a step's file captures live: beside its array checkpoints, never mixed."""
    return checkpoint_dir / CAPTURES


@dataclass(frozen=True)
class Restored:
    """A capture put back into the workdir."""

    path: Path
    files: tuple[str, ...]
    #: the step the program's own checkpoint records (GROMACS's MD step), when known
    engine_step: int | None = None


def _engine_step(
    files: Mapping[str, bytes | memoryview], read_step: StepReader | None
) -> int | None:
    """The least step a file of the set records: how far every one of them got (a GROMACS
    run has one .cpt, `mdrun -multidir` one per simulation)."""
    if read_step is None:
        return None
    return min((s for n, d in files.items() if (s := read_step(n, d)) is not None), default=None)


def _signature(path: Path) -> Signature | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def matched(workdir: Path, patterns: Sequence[str]) -> list[str]:
    """Files under `workdir` that the globs match, relative and sorted."""
    found: set[str] = set()
    for pattern in patterns:
        for path in workdir.glob(pattern):
            if path.is_file() and not path.name.startswith(RESTORE_PREFIX):
                found.add(path.relative_to(workdir).as_posix())
    return sorted(found)


class FileGuard:
    """Watches one step's checkpoint files and captures each complete new version."""

    def __init__(
        self,
        directory: Path,
        workdir: Path,
        patterns: Sequence[str],
        *,
        store: EventStore | None,
        run_id: str,
        step: str,
        pipeline: str = "",
        validate: Validator | None = None,
        read_step: StepReader | None = None,
        together: bool = False,
        clock: Clock | None = None,
        keep_last: int | None = None,
        every: float | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.workdir = workdir
        self.patterns = tuple(patterns)
        self._validate = validate
        self._read_step = read_step
        self._together = together
        self._every = every or 0.0
        self._poll_every = 0.0
        self._last_capture: float | None = None
        clock = clock or SystemClock()
        self._clock = clock
        self._ckpt = Checkpointer(
            directory, interval=1.0, store=store, clock=clock, keep_last=keep_last, threads=1
        )
        reporter = Reporter(store, clock)
        reporter.run_id, reporter.step, reporter.pipeline = run_id, step, pipeline
        reporter.source = "files"
        self._reporter = reporter
        self._ckpt._reporter = reporter  # same package: events name the step, not the env
        self._last_poll: dict[str, Signature] = {}
        self._captured: dict[str, Signature] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.captures = 0
        self._lock = threading.Lock()
        self._warn = warn
        self._started: float | None = None
        self._said = False
        self._held: Callable[[], float] | None = None
        self._held_before = 0.0

    def baseline(self) -> None:
        """What the workdir holds before the program starts is not a new checkpoint.

        That is a capture just restored, or files another run left there: a fresh start of
        `gmx mdrun -deffnm simulation` in a folder holding last week's `simulation.cpt`
        captured it as this run's checkpoint a second after starting, and a resume after
        a crash then continued that other trajectory. Only versions the program writes
        from now on are captured.
        """
        with self._lock:
            names = matched(self.workdir, self.patterns)
            self._captured = {
                n: s for n in names if (s := _signature(self.workdir / n)) is not None
            }

    def poll(self, final: bool = False) -> bool:
        """One look; capture if the files changed and are complete. True if captured.

        Complete means: the engine's check passes (GROMACS's footer, LAMMPS's closing magic
        string) and the files did not change while being read; without such a check, also
        the same size and mtime on two polls in a row. A program that rewrites its file
        more often than m27 polls (LAMMPS writing every 200 steps of a small system) has
        a new version at every look: the two-poll rule alone never captured one until it
        exited. At most one capture per `every` (the step's checkpoint interval, less one
        poll, so a program writing at that interval is captured each time) keeps such a
        program from filling the store and Prefect with a capture a second.

        `final` (the program has exited): nothing writes any more, so one look is enough,
        and it is always taken.
        """
        with self._lock:
            names = matched(self.workdir, self.patterns)
            sigs = {n: s for n in names if (s := _signature(self.workdir / n)) is not None}
            stable = final or sigs == self._last_poll or self._validate is not None
            self._last_poll = sigs
            if not sigs or sigs == self._captured or not stable:
                return False
            if not final and self._too_soon():
                return False
            if self._together and self._part_written(sigs):
                return False
            return self._capture(sigs)

    def _part_written(self, sigs: Mapping[str, Signature]) -> list[str]:
        """The files still as the last capture (or the start) had them, or not there,
        while others are new: a set written together is not one yet."""
        present = [p for p in self.patterns if any(fnmatch(n, p) for n in sigs)]
        missing = [p for p in self.patterns if p not in present]
        return missing + [n for n, s in sigs.items() if self._captured.get(n) == s]

    def _too_soon(self) -> bool:
        if self._last_capture is None:
            return False
        return self._clock.monotonic() - self._last_capture < self._every - self._poll_every

    def _capture(self, sigs: dict[str, Signature]) -> bool:
        state: dict[str, object] = {}
        read: dict[str, bytes | memoryview] = {}
        for name in sorted(sigs):
            path = self.workdir / name
            if self._validate is not None and (why := self._validate(path)) is not None:
                log.info("not capturing %s yet: %s", path, why)
                return False
            try:
                data = path.read_bytes()
            except OSError as exc:
                log.info("not capturing %s yet: %s", path, exc)
                return False
            if _signature(path) != sigs[name]:
                return False  # it changed while we read it: next poll
            state[FILE_KEY + name] = np.frombuffer(data, dtype=np.uint8)
            read[name] = data
        state["m27_files"] = sorted(sigs)
        self._reporter.files = tuple(sorted(sigs))
        self._reporter.engine_step = _engine_step(read, self._read_step)
        try:
            self._ckpt.save(state, self.captures + 1)
            self._ckpt.flush()  # small files; the event names exactly these
        except CheckpointError as exc:
            log.warning("capturing %s failed: %s", ", ".join(sigs), exc)
            return False
        self._captured = sigs
        self.captures += 1
        self._last_capture = self._clock.monotonic()
        return True

    def start(self, every: float, held: Callable[[], float] | None = None) -> None:
        """Poll every `every` seconds on a thread until :meth:`stop`. `held()`: seconds
        the step has been held as a guest, which the "no checkpoint" notes leave out."""
        self._poll_every = every
        self._started = self._clock.monotonic()
        self._held = held
        self._held_before = held() if held is not None else 0.0

        def loop() -> None:
            while not self._stop.wait(every):
                try:
                    self.poll()
                    if self._warn is not None and (line := self.overdue()) is not None:
                        self._warn(line)
                except Exception as exc:  # a capture problem must never end the step
                    log.warning("checkpoint file watcher: %r", exc)

        self._thread = threading.Thread(target=loop, name="m27-capture", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop polling, capture what the program left (it has exited), close the store."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.poll(final=True)
            if self._warn is not None and (line := self.none_at_exit()) is not None:
                self._warn(line)
        finally:
            self._ckpt.close()

    def _waited(self) -> float | None:
        """Seconds since the program started, once it has had a checkpoint interval."""
        if self._said or self.captures or not self._every or self._started is None:
            return None
        waited = self._clock.monotonic() - self._started
        if self._held is not None:  # a guest held by the agent had no chance to write
            waited -= self._held() - self._held_before
        return waited if waited >= self._every else None

    def overdue(self) -> str | None:
        """Once, why nothing was captured, when the program has had time for two
        checkpoints (or one and three polls): its files are not there (a typo in
        `files:`, another folder), not complete, unchanged, or never still. Said while it
        runs, so that a crash days later is not how the typo is found. Not before
        :data:`STARTUP_SLACK_S` past one interval: an engine's interval counts from its
        own start (`mpirun` starting an MPI mdrun took 3 s, twice a 2 s `-cpt`)."""
        waited = self._waited()
        slack = max(3 * self._poll_every, STARTUP_SLACK_S)
        if waited is None or waited < max(2 * self._every, self._every + slack):
            return None
        self._said = True
        return (
            f"no checkpoint after {format_duration(waited)}: {self._why_none()}; a crash now "
            "loses all of this attempt's work"
        )

    def none_at_exit(self) -> str | None:
        """After the final look: a program that ran a checkpoint interval and left no file
        `files:` names (the likely typo), said once."""
        waited = self._waited()
        if waited is None or matched(self.workdir, self.patterns):
            return None
        self._said = True
        return f"no checkpoint was captured: {self._why_none()}"

    def _why_none(self) -> str:
        names = matched(self.workdir, self.patterns)
        if not names:
            wanted = ", ".join(self.patterns)
            return (
                f"no file in {self.workdir} matches {wanted} (check `files:`, and how often "
                "the program writes it)"
            )
        shown = ", ".join(names)
        with self._lock:
            sigs = {n: s for n in names if (s := _signature(self.workdir / n)) is not None}
            if sigs == self._captured:
                has = "has" if len(names) == 1 else "have"
                return f"{shown} {has} not changed since the step started"
            stale = self._part_written(sigs) if self._together else []
        if self._validate is not None:
            for name in names:
                if (why := self._validate(self.workdir / name)) is not None:
                    return f"{name} is not complete: {why}"
        if stale:
            return (
                f"{', '.join(stale)} not written since the step started, while the others "
                "were; files written together are captured only once each is new"
            )
        return (
            f"{shown} changed at every look (every {format_duration(self._poll_every)}); a "
            "file is captured once it holds still between two looks"
        )


def newer_than_captures(
    directories: Sequence[Path], workdir: Path, patterns: Sequence[str], validate: Validator
) -> bool:
    """Whether the program's files in `workdir` are complete and newer than every capture.

    That happens when the program wrote a checkpoint after the last capture and m27 was
    gone before it could capture it (kill -9 of `m27 run`, then the node service stopped
    the program with its checkpoint signal). Only with captures to resume from at all: a
    fresh start never picks up files left in the workdir.
    """
    found = [m for d in directories for m in manifests(d)]
    names = matched(workdir, patterns)
    if not found or not names:
        return False
    try:
        newest = max(m.stat().st_mtime_ns for m in found)
        oldest_file = min((workdir / n).stat().st_mtime_ns for n in names)
    except OSError:
        return False
    return oldest_file > newest and all(validate(workdir / n) is None for n in names)


def restore_files(
    directories: Sequence[Path],
    workdir: Path,
    *,
    validate: Validator | None = None,
    read_step: StepReader | None = None,
    note: Callable[[str], None] = log.warning,
    store: EventStore | None = None,
    run_id: str = "",
    step: str = "",
    clock: Clock | None = None,
) -> Restored | None:
    """Write the newest good capture found in `directories` (tried in order) into `workdir`.

    A capture whose manifest or chunks fail their hash check, or whose files fail
    `validate`, is never restored: the next older one is tried. Each file is written to a
    temporary name, fsynced and renamed over the old one.
    """
    for directory in directories:
        for manifest in reversed(manifests(directory)):
            try:
                _, state = load(manifest)
            except (CheckpointError, OSError, KeyError, TypeError, ValueError) as exc:
                note(f"capture {manifest} is damaged, not restored: {exc}")
                continue
            files = {k[len(FILE_KEY) :]: v for k, v in state.items() if k.startswith(FILE_KEY)}
            if not files:
                continue
            why = _write_all(workdir, files, validate)
            if why is not None:
                note(f"capture {manifest} is not usable, not restored: {why}")
                continue
            views = {n: np.asarray(d, dtype=np.uint8).data for n, d in files.items()}
            restored = Restored(manifest, tuple(sorted(files)), _engine_step(views, read_step))
            if store is not None:
                event = CheckpointRestored(
                    at=(clock or SystemClock()).now(),
                    run_id=run_id,
                    step=step,
                    path=str(manifest),
                    sim_step=0,
                    files=restored.files,
                    engine_step=restored.engine_step,
                )
                store.append([event])
            return restored
    return None


def _write_all(
    workdir: Path, files: dict[str, np.ndarray], validate: Validator | None
) -> str | None:
    """Stage every file, validate it, then rename all into place; why not, or None."""
    staged: list[tuple[Path, Path]] = []
    try:
        for name, data in files.items():
            target = workdir / name
            if ".." in Path(name).parts or Path(name).is_absolute():
                return f"{name!r} is outside the workdir"
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f"{RESTORE_PREFIX}{target.name}")
            with open(tmp, "wb") as f:
                f.write(np.asarray(data, dtype=np.uint8).tobytes())
                f.flush()
                os.fsync(f.fileno())
            staged.append((tmp, target))
            if validate is not None and (why := validate(tmp)) is not None:
                return f"{name}: {why}"
        for tmp, target in staged:
            os.replace(tmp, target)
        staged = []
        return None
    except OSError as exc:
        return str(exc)
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
