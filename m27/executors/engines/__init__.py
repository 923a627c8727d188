"""Recipes for programs that checkpoint themselves (GROMACS, LAMMPS, CP2K, ...).

A step's `checkpoint:` says how often and, optionally, which files and resume arguments.
A recipe knows one engine's command line: it turns the interval into the engine's own
option (`gmx mdrun` gets `-cpt 5` for 300s), names the files the engine writes, the
arguments that resume from them and the signal it checkpoints on. What the step says
explicitly always wins over the recipe. :func:`plan_checkpoint` is what the flow and
`m27 validate` call; the runner uses the resulting :class:`CheckpointPlan`.

Python programs need no recipe: `m27.Checkpointer` reads `M27_CHECKPOINT_INTERVAL` and
`M27_RESUME_FROM` itself (see docs/engines.md for OpenMM and PyTorch).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from m27.executors.engines import cp2k, gromacs, lammps
from m27.executors.engines._base import Recipe, RecipePlan, engine_index
from m27.executors.engines.cp2k import Cp2k
from m27.executors.engines.gromacs import Gromacs
from m27.executors.engines.lammps import Lammps
from m27.paths import not_a_file

#: Signals a program may checkpoint on (the name without SIG).
SIGNALS = ("TERM", "USR1", "INT")

#: Recipes in the order they are tried; :func:`register` adds one.
RECIPES: list[Recipe] = [Gromacs(), Lammps(), Cp2k()]


def register(recipe: Recipe) -> None:
    """Add a recipe (tried before the built-in ones)."""
    RECIPES.insert(0, recipe)


def recipe_named(name: str | None) -> Recipe | None:
    return next((r for r in RECIPES if r.name == name), None) if name else None


@dataclass(frozen=True)
class CheckpointPlan:
    """What `checkpoint:` does for one step, once the recipe (if any) has had its say."""

    recipe: str | None
    every: float | None
    #: the command to start (the recipe's options added, e.g. `-cpt 5`)
    argv: tuple[str, ...]
    #: globs, relative to the workdir, that m27 captures when they change
    files: tuple[str, ...]
    #: arguments added when the step resumes from a restored capture
    resume: tuple[str, ...]
    #: what the program checkpoints on before a stop (cancel, preemption, time limit)
    signal: str
    #: lines for `m27 validate`: what the recipe did and why
    notes: tuple[str, ...] = ()

    @property
    def guards_files(self) -> bool:
        return bool(self.files)


def plan_checkpoint(
    argv: Sequence[str],
    every: float | None,
    *,
    files: Sequence[str] = (),
    resume: Sequence[str] | None = None,
    signal: str | None = None,
    shell: bool = False,
) -> CheckpointPlan:
    """The plan for a step whose command is `argv` (rendered, no shell unless `shell`)."""
    argv = tuple(argv)
    recipe: Recipe | None = None
    found: RecipePlan | None = None
    if not shell:
        for candidate in RECIPES:
            index = engine_index(argv, candidate.programs)
            if index is not None and candidate.matches(argv, index):
                recipe, found = candidate, candidate.plan(argv, index, every)
                break
    notes = list(found.notes) if found else []
    if files and found and found.files:
        notes.append(f"files: {', '.join(files)} (from checkpoint.files, not the recipe)")
    return CheckpointPlan(
        recipe=recipe.name if recipe else None,
        every=every,
        argv=found.argv if found else argv,
        files=tuple(files) or (found.files if found else ()),
        resume=tuple(resume) if resume is not None else (found.resume if found else ()),
        signal=signal or (found.signal if found else "TERM"),
        notes=tuple(notes),
    )


def with_threads(argv: Sequence[str], n: int) -> tuple[tuple[str, ...], str]:
    """`argv` for a step given `n` cores: the engine's thread option added where its recipe
    knows one (`gmx mdrun -nt n`), and what was done ("" for none)."""
    argv = tuple(argv)
    for recipe in RECIPES:
        index = engine_index(argv, recipe.programs)
        if index is not None and recipe.matches(argv, index):
            threads = getattr(recipe, "threads", None)  # a registered recipe may lack it
            return threads(argv, index, n) if threads is not None else (argv, "")
    return argv, ""


class StepLike(Protocol):
    """The fields of a validated spec Step that decide its checkpoint plan."""

    @property
    def argv(self) -> tuple[str, ...]: ...
    @property
    def shell(self) -> bool: ...
    @property
    def checkpoint(self) -> float | None: ...
    @property
    def checkpoint_files(self) -> tuple[str, ...]: ...
    @property
    def checkpoint_resume(self) -> tuple[str, ...] | None: ...
    @property
    def checkpoint_signal(self) -> str | None: ...


def plan_for_step(step: StepLike) -> CheckpointPlan | None:
    """The plan of a step that has `checkpoint:`; None for one without (no recipe then)."""
    has = step.checkpoint is not None or step.checkpoint_files or step.checkpoint_signal
    if not has and step.checkpoint_resume is None:
        return None
    return plan_checkpoint(
        step.argv,
        step.checkpoint,
        files=step.checkpoint_files,
        resume=step.checkpoint_resume,
        signal=step.checkpoint_signal,
        shell=step.shell,
    )


_CHECKPOINTER = re.compile(r"\bCheckpointer\b")
_WATCH_STOP = re.compile(r"\b(?:watch_stop|watch_preemption)\b")


def uses_checkpointer(argv: Sequence[str], workdir: Path) -> bool:
    """Heuristic for `m27 validate`: does the command run Python that uses m27.Checkpointer?

    Looks at `python -c` code, `.py` files named in the command and the modules of
    `python -m`; a program it cannot read counts as not using it.
    """
    return any(_CHECKPOINTER.search(code) for code in _python_code(argv, workdir))


def saves_at_stop(argv: Sequence[str], workdir: Path) -> bool:
    """The same heuristic for `m27.watch_stop()` (or Slurm's `watch_preemption()`): does
    the Python the command runs notice a stop signal, so that it can save first?"""
    return any(_WATCH_STOP.search(code) for code in _python_code(argv, workdir))


def _python_code(argv: Sequence[str], workdir: Path) -> Iterator[str]:
    """The Python source the command runs, as far as it can be read: `-c` code, `.py`
    files, the modules of `-m`, and `/bin/sh -c` text."""
    for i, arg in enumerate(argv):
        if i > 0 and argv[i - 1] == "-c":
            yield arg
        candidates: list[Path] = []
        if arg.endswith(".py"):
            candidates.append(Path(arg))
        if i > 0 and argv[i - 1] == "-m":
            candidates.append(Path(*arg.split(".")).with_suffix(".py"))
            candidates.append(Path(*arg.split("."), "__main__.py"))
        for candidate in candidates:
            path = candidate if candidate.is_absolute() else workdir / candidate
            if not_a_file(path) is not None:  # a pipe would wait for a writer forever
                continue
            try:
                yield path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue


def error_said(lines: Sequence[str]) -> str | None:
    """What an engine's error message at the end of a failed step's output says, on one
    line, at most ERROR_SAID_MAX characters (GROMACS's error block, LAMMPS's `ERROR:`
    line, CP2K's `[ABORT]` box); None when there is none. A failure said only `exited
    with code 1`."""
    lines = list(lines)  # (a runner's tail is a deque)
    for said in (gromacs.error_said(lines), lammps.error_said(lines), cp2k.error_said(lines)):
        if said:
            return said if len(said) <= ERROR_SAID_MAX else said[: ERROR_SAID_MAX - 3] + "..."
    return None


def stopped_early(
    lines: Sequence[str],
    *,
    signalled: bool = True,
    recipe: str | None = None,
    argv: Sequence[str] = (),
    workdir: Path | None = None,
) -> str | None:
    """Why an engine that exited 0 stopped before its end, from the end of its output
    (`mdrun -maxh`, LAMMPS's `timer timeout`), else from the files its `recipe` left in
    `workdir` (CP2K's WALLTIME, LAMMPS's log file; `argv` is the step's own command); None
    when neither says so. `signalled=False`: a stop on a signal is not counted (a Slurm
    batch script sends one itself, then requeues)."""
    lines = list(lines)  # (a runner's tail is a deque)
    found = recipe_named(recipe)
    check = getattr(found, "unfinished", None)  # a registered recipe may lack it
    try:
        said = gromacs.stopped_early(lines, signalled=signalled) or lammps.stopped_early(
            lines, workdir if isinstance(found, Lammps) else None
        )
        if said is None and check is not None:
            said = check(tuple(argv), workdir or Path.cwd())
    except OSError:  # a file gone meanwhile: the step's own end stands
        said = None
    return said


#: The most of an engine's error a step's failure reason quotes (the log has all of it).
ERROR_SAID_MAX = 300


__all__ = [
    "ERROR_SAID_MAX",
    "RECIPES",
    "SIGNALS",
    "CheckpointPlan",
    "Recipe",
    "RecipePlan",
    "StepLike",
    "error_said",
    "plan_checkpoint",
    "plan_for_step",
    "recipe_named",
    "register",
    "saves_at_stop",
    "stopped_early",
    "uses_checkpointer",
    "with_threads",
]
