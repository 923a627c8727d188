"""LAMMPS (`lmp`, `lmp_serial`, `lmp_mpi`): restart files through `-var` variables.

LAMMPS has no checkpoint-on-signal and no time-based restart option, so m27 and the input
script meet on a convention (see docs/engines.md):

- m27 passes ``-var m27_restart m27.restart``, ``-var m27_every_s <seconds>`` when
  `checkpoint:` has an interval, and ``-var m27_resume 1`` on a resume;
- the script runs ``run <N> upto pre no post no every <M> "write_restart ${m27_restart}"``
  (one file, rewritten every M steps) and starts with ``if "${m27_resume} == 1" then
  "read_restart ${m27_restart}"``.

Not LAMMPS's ``restart M ${m27_restart}``: with one file name it appends the step
(``m27.restart.1000``, ``m27.restart.2000``, ...), so no file of the declared name ever
appears. Command-line `-var` values are index variables, so a script's own
``variable m27_resume index 0`` default is overridden by m27 and still runs by hand.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from pathlib import Path

from m27.executors.engines._base import Argv, Recipe, RecipePlan, option
from m27.paths import not_a_file

RESTART_FILE = "m27.restart"
#: the first bytes of a LAMMPS binary restart file (and, since format revision 1, its last)
_MAGIC = b"LammpS RestartT\0"
#: header entries (flag, value) before the step: strings, ints, and the step itself
_STRINGS, _INTS, _NTIMESTEP = {0, 4}, {1, 2, 3, 48}, 5


class Lammps(Recipe):
    name = "lammps"
    programs: tuple[str, ...] = ("lmp", "lmp_serial", "lmp_mpi", "lammps")
    saves_at_stop = False

    def plan(self, argv: Argv, index: int, every: float | None) -> RecipePlan:
        extra: list[str] = ["-var", "m27_restart", RESTART_FILE]
        notes = [
            f"-var m27_restart {RESTART_FILE}: the input script runs "
            '`run N upto pre no post no every M "write_restart ${m27_restart}"`'
        ]
        if every is not None:
            extra += ["-var", "m27_every_s", f"{every:g}"]
            notes.append(f"-var m27_every_s {every:g}: the interval, for the script to use")
        notes.append("on resume: -var m27_resume 1 (the script runs read_restart ${m27_restart})")
        out = (*argv[: index + 1], *extra, *argv[index + 1 :])
        return RecipePlan(out, (RESTART_FILE,), ("-var", "m27_resume", "1"), "TERM", tuple(notes))

    def warnings(self, argv: Argv, workdir: Path) -> tuple[str, ...]:
        """A script that does not follow the convention gets no checkpoint, silently: the
        `-var` values reach LAMMPS and nothing uses them."""
        script = option(argv, "-in") or option(argv, "-i")
        if script is None:
            return ()
        code = _script_code(script, workdir)
        if code is None:
            return ()
        guide = "(docs/engines.md, LAMMPS)"
        if "m27_restart" not in code:
            return (
                f"checkpoint: has no effect: {script} never uses ${{m27_restart}}; it must run "
                f'`run N upto every M "write_restart ${{m27_restart}}"` for m27 to capture '
                f"anything {guide}",
            )
        if "m27_resume" not in code:
            return (
                f"{script} never reads ${{m27_resume}}: a resume starts the run over; it must "
                f'`if "${{m27_resume}} == 1" then "read_restart ${{m27_restart}}"` {guide}',
            )
        return ()

    def valid_file(self, path: Path) -> str | None:
        try:
            with open(path, "rb") as f:
                head = f.read(64)
                size = f.seek(0, 2)
                f.seek(max(0, size - len(_MAGIC)))
                tail = f.read()
        except OSError as exc:
            return f"cannot read: {exc}"
        if not head.startswith(_MAGIC):
            return "not a LAMMPS restart file (bad magic string)"
        revision = _revision(head)
        if revision is not None and revision >= 1 and tail != _MAGIC:
            # write_restart rewrites the file in place; the magic string ends a whole one
            return "incomplete LAMMPS restart file (no closing magic string: torn or being written)"
        return None

    def recorded_step(self, name: str, data: bytes | memoryview) -> int | None:
        return restart_step(data)

    def unfinished(self, argv: Argv, workdir: Path) -> str | None:
        """A run stopped by the script's `timer timeout` exits 0 with the rest of its run
        (and every later `run`) skipped; LAMMPS says so in its log file, which a step run
        with `-screen none` has alone."""
        log = option(argv, "-log") or option(argv, "-l") or "log.lammps"
        path = Path(log) if Path(log).is_absolute() else workdir / log
        if log == "none" or not_a_file(path) is not None:
            return None
        with open(path, "rb") as f:  # the warning comes at most a few runs' output before the end
            f.seek(max(0, f.seek(0, 2) - _LOG_TAIL))
            tail = f.read().decode("utf-8", errors="replace").splitlines()
        return stopped_early(tail, workdir)


def _order(data: bytes | memoryview) -> str | None:
    """The byte order the file was written in (its endian int is 1 in the writer's)."""
    for order in "<>":
        if struct.unpack_from(f"{order}i", data, len(_MAGIC))[0] == 1:
            return order
    return None


def _revision(head: bytes) -> int | None:
    try:
        order = _order(head)
        return None if order is None else int(struct.unpack_from(f"{order}i", head, 20)[0])
    except struct.error:
        return None


def _script_code(script: str, workdir: Path, depth: int = 0) -> str | None:
    """The code of `script` and of the files it `include`s (LAMMPS reads both relative to
    its working directory); None when one of them cannot be read, so nothing is claimed."""
    path = Path(script) if Path(script).is_absolute() else workdir / script
    if depth > 8 or not_a_file(path) is not None:
        return None
    try:
        code = _code(path.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return None
    parts = [code]
    for line in code.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == "include":
            included = _script_code(words[1], workdir, depth + 1)
            if included is None:
                return None
            parts.append(included)
    return "\n".join(parts)


def _code(script: str) -> str:
    """The script without its comments (a `#` outside quotes to the end of the line), so
    that a commented-out `write_restart ${m27_restart}` does not count."""
    lines = []
    for line in script.splitlines():
        quote = ""
        for at, char in enumerate(line):
            if quote:
                quote = "" if char == quote else quote
            elif char in "\"'":
                quote = char
            elif char == "#":
                line = line[:at]
                break
        lines.append(line)
    return "\n".join(lines)


def restart_step(data: bytes | memoryview) -> int | None:
    """The timestep a LAMMPS binary restart file was written at (None: not one).

    After the magic string, the endian int and the format revision, write_restart's
    header is (flag, value) entries: the version and unit style as strings, the sizes of
    LAMMPS's integer types, then ``NTIMESTEP`` (flag 5) as a 64-bit int. Entries are
    read by flag, so an added one of those kinds in between is skipped."""
    try:
        if bytes(data[: len(_MAGIC)]) != _MAGIC or (order := _order(data)) is None:
            return None
        at = len(_MAGIC) + 8
        for _ in range(16):
            (flag,) = struct.unpack_from(f"{order}i", data, at)
            at += 4
            if flag == _NTIMESTEP:
                (step,) = struct.unpack_from(f"{order}q", data, at)
                return int(step) if step >= 0 else None
            if flag in _STRINGS:
                (length,) = struct.unpack_from(f"{order}i", data, at)
                if not 0 <= length <= 1024:
                    return None
                at += 4 + length
            elif flag in _INTS:
                at += 4
            else:
                return None
    except struct.error:
        return None
    return None


#: What LAMMPS prints when its `timer timeout` stops a run, and it still exits 0 (measured,
#: LAMMPS 20220623: `WARNING: Wall time limit reached (src/timer.cpp:238)`, then the
#: `every` segment's commands run, so the restart file is at the step it stopped at).
_TIMEOUT = "WARNING: Wall time limit reached"
#: How much of a log file's end is read for it
_LOG_TAIL = 256 * 1024


def stopped_early(lines: Sequence[str], workdir: Path | None = None) -> str | None:
    """Why a LAMMPS run that exited 0 did not run to its end, from its output or log (None:
    it did, as far as they say). With `workdir`, the restart file there names the step."""
    if not any(line.startswith(_TIMEOUT) for line in lines):
        return None
    step = None
    if workdir is not None and not_a_file(workdir / RESTART_FILE) is None:
        with open(workdir / RESTART_FILE, "rb") as f:
            step = restart_step(f.read(4096))
    kept = f"its restart file is at step {step}" if step is not None else "no m27 restart file"
    return (
        f"LAMMPS stopped at its `timer timeout`, its wall-time limit ({kept}), before the "
        "end of its input script"
    )


def error_said(lines: Sequence[str]) -> str | None:
    """LAMMPS's last `ERROR: ...` line in `lines` (without where in its source it was
    raised), or None: a failed run said only `exited with code 1`."""
    for line in reversed(lines):
        if line.startswith(("ERROR: ", "ERROR on proc ")):
            return _SOURCE.sub("", line).strip()
    return None


#: `(src/input.cpp:274)` at the end of a LAMMPS error line: where, not what
_SOURCE = re.compile(r"\s*\((?:src/)?[\w./-]+\.(?:cpp|h):\d+\)\s*$")
