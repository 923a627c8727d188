"""LAMMPS (`lmp`, `lmp_serial`, `lmp_mpi`): restart files through `-var` variables.

LAMMPS has no checkpoint-on-signal and no time-based restart option, so m27 and the input
script meet on a convention (see docs/engines.md):

- m27 passes ``-var m27_restart m27.restart``, ``-var m27_every_s <seconds>`` when
  `checkpoint:` has an interval, and ``-var m27_resume 1`` on a resume;
- the script writes ``restart <N steps> ${m27_restart}`` (one file, overwritten) and
  starts with ``if "${m27_resume} == 1" then "read_restart ${m27_restart}" else
  "read_data system.data"``.

Command-line `-var` values are index variables, so a script's own
``variable m27_resume index 0`` default is overridden by m27 and still runs by hand.
"""

from __future__ import annotations

from pathlib import Path

from m27.executors.engines._base import Argv, Recipe, RecipePlan

RESTART_FILE = "m27.restart"
#: the first bytes of a LAMMPS binary restart file
_MAGIC = b"LammpS RestartT"


class Lammps(Recipe):
    name = "lammps"
    programs: tuple[str, ...] = ("lmp", "lmp_serial", "lmp_mpi", "lammps")

    def plan(self, argv: Argv, index: int, every: float | None) -> RecipePlan:
        extra: list[str] = ["-var", "m27_restart", RESTART_FILE]
        notes = [
            f"-var m27_restart {RESTART_FILE}: the input script writes `restart N ${{m27_restart}}`"
        ]
        if every is not None:
            extra += ["-var", "m27_every_s", f"{every:g}"]
            notes.append(f"-var m27_every_s {every:g}: the interval, for the script to use")
        notes.append("on resume: -var m27_resume 1 (the script runs read_restart ${m27_restart})")
        out = (*argv[: index + 1], *extra, *argv[index + 1 :])
        return RecipePlan(out, (RESTART_FILE,), ("-var", "m27_resume", "1"), "TERM", tuple(notes))

    def valid_file(self, path: Path) -> str | None:
        try:
            with open(path, "rb") as f:
                head = f.read(64)
        except OSError as exc:
            return f"cannot read: {exc}"
        if _MAGIC not in head:
            return "not a LAMMPS restart file (bad magic string)"
        return None
