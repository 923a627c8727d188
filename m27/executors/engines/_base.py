"""The small interface every engine recipe implements."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

#: A command line, program first, as the recipes read and write it.
Argv = tuple[str, ...]
#: Where a recipe says what it decided at resume time (a line for the step's log).
Note = Callable[[str], None]


@dataclass(frozen=True)
class RecipePlan:
    """What a recipe makes of one command line."""

    argv: tuple[str, ...]
    files: tuple[str, ...]
    resume: tuple[str, ...]
    signal: str
    notes: tuple[str, ...] = ()


class Recipe(Protocol):
    """One engine: how it is named, how it checkpoints, how it resumes.

    A recipe class may subclass this to take the defaults: every command of its programs
    is the checkpointing mode (:meth:`matches`), and it resumes with the plan's resume
    arguments as they are (:meth:`resume_args`).
    """

    #: short name shown by `m27 validate` ("gromacs")
    name: str
    #: program basenames that start the engine (`gmx`, `gmx_mpi`, `lmp`, ...)
    programs: tuple[str, ...]
    #: whether the program writes a checkpoint when it gets the plan's signal (mdrun does;
    #: LAMMPS and CP2K do not, so a cancel or a time limit goes back to the last capture)
    saves_at_stop: bool = True

    def matches(self, argv: Argv, index: int) -> bool:
        """Whether the command at `argv[index]` is the checkpointing mode of the engine."""
        return True

    def plan(self, argv: Argv, index: int, every: float | None) -> RecipePlan:
        """The command with the engine's checkpoint options, its files and resume args."""
        ...

    def valid_file(self, path: Path) -> str | None:
        """Why `path` is not a complete checkpoint file (None: it looks complete)."""
        ...

    def recorded_step(self, name: str, data: bytes | memoryview) -> int | None:
        """The simulation step a checkpoint file `name` holding `data` was written at, as
        the engine records it (None: not known). Listings and events show it, since only
        the program knows how far its own checkpoint got."""
        return None

    def warnings(self, argv: Argv, workdir: Path) -> tuple[str, ...]:
        """What in the files the command reads (run from `workdir`) keeps its checkpoints
        from working, for `m27 validate`; nothing when the files cannot be read (an
        earlier step may write them)."""
        return ()

    def resume_args(self, argv: Argv, workdir: Path, resume: Argv, note: Note) -> Argv:
        """The resume arguments to use now that the capture is back in `workdir`."""
        return resume

    def unfinished(self, argv: Argv, workdir: Path) -> str | None:
        """Why the program, which exited 0, did not reach its last step, as the checkpoint
        files it left in `workdir` say (CP2K at its WALLTIME: the restart file at step 30
        of 200); None when it did, or when they cannot say."""
        return None

    def together(self, argv: Argv) -> bool:
        """Whether the files of one checkpoint are written together and only make one
        together (replicas that exchange: `mdrun -multidir ... -replex`): a set in which
        some are new and others still the last capture's is then not captured.
        Independent files: False."""
        return False

    def threads(self, argv: Argv, index: int, n: int) -> tuple[Argv, str]:
        """The command for a step given `n` cores (m27.gpu.cpus), and what was done, for
        the step's log: an engine that counts the node's cores, not its affinity mask,
        gets its thread option here. The default leaves the command as it is
        (``OMP_NUM_THREADS`` is set for every such step)."""
        return argv, ""


def engine_index(argv: Sequence[str], programs: Sequence[str]) -> int | None:
    """Where the engine's program is in `argv` (after `mpirun -np 4`, `srun`, `env X=1`)."""
    for index, arg in enumerate(argv):
        if os.path.basename(arg) in programs:
            return index
    return None


def option(argv: Sequence[str], name: str, start: int = 0) -> str | None:
    """The value after the last `name` in argv[start:], or None."""
    value = None
    for i in range(start, len(argv) - 1):
        if argv[i] == name:
            value = argv[i + 1]
    return value


def minutes(seconds: float) -> str:
    """300 -> '5', 3 -> '0.05', 10 -> '0.166667' (GROMACS reads -cpt as real minutes)."""
    return f"{seconds / 60:.6g}"
