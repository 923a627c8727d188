"""CP2K (`cp2k`, `cp2k.psmp`, ...): its restart file is the checkpoint, and the input.

CP2K writes ``<PROJECT>-1.restart`` every ``&MOTION &PRINT &RESTART &EACH MD n`` steps
(20 by default): a complete input file holding the positions, velocities, thermostat and
counters of that step. It has no time-based option and saves nothing on a signal, so
`checkpoint:` bounds how often m27 captures the file, as for LAMMPS.

Resuming runs the restored restart file as the input. Its ``STEPS`` counts from its
``STEP_START_VAL``, so run as it is a resume at step 400 of a 1,000-step run would go on to
step 1,400; m27 writes ``m27-resume.inp``, the restart file with ``STEPS`` set to what the
step's own input asks for (read from it, its ``@SET`` and ``--set`` values applied) less
the steps already done, and appends ``-i m27-resume.inp`` (CP2K reads the last ``-i``).
CP2K appends to its ``.ener``, ``.cell`` and ``.xyz`` files on the resume, so m27 first
cuts them after the restored step: the frames the attempt that died wrote after its last
capture would be there twice (docs/engines.md).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from m27.executors.engines._base import Argv, Note, Recipe, RecipePlan, option
from m27.paths import not_a_file

#: what CP2K writes (and rotates into `.bak-N` copies) every `&EACH MD n` steps
RESTART_GLOB = "*-1.restart"
#: the input a resume runs: the restored restart file, its STEPS set to the steps left
RESUME_INPUT = "m27-resume.inp"
#: the first line of every restart file CP2K writes
_HEAD = "# Version information for this restart file"
#: switches that make `cp2k` check or print instead of run (unless `-r`/`--run` too)
_NOT_A_RUN = ("-c", "--check", "-e", "--echo", "-h", "--help", "-v", "--version", "--xml")
#: options of `cp2k` that take a value
_VALUED = ("-i", "-o", "-E", "--set", "-mpi-mapping", "--mpi-mapping")
_STEP_START = re.compile(r"^\s*STEP_START_VAL\s+(\d+)\s*$", re.MULTILINE | re.IGNORECASE)
_VAR = re.compile(r"\$\{(\w+)\}|\$(\w+)")


class Cp2k(Recipe):
    name = "cp2k"
    programs: tuple[str, ...] = (
        "cp2k",
        "cp2k.psmp",
        "cp2k.popt",
        "cp2k.ssmp",
        "cp2k.sopt",
        "cp2k.sdbg",
        "cp2k.pdbg",
    )
    saves_at_stop = False

    def matches(self, argv: Argv, index: int) -> bool:
        words = argv[index + 1 :]
        return "-r" in words or "--run" in words or not any(w in _NOT_A_RUN for w in words)

    def plan(self, argv: Argv, index: int, every: float | None) -> RecipePlan:
        out = _with_input_option(argv, index)
        notes = [
            f"files: {RESTART_GLOB} (the restart file CP2K writes every `&MOTION &PRINT "
            "&RESTART &EACH MD n` steps, 20 unless the input says)",
            f"on resume: -i {RESUME_INPUT} (the restored restart file, with STEPS set to the "
            "steps the input has left)",
        ]
        return RecipePlan(out, (RESTART_GLOB,), ("-i", RESUME_INPUT), "TERM", tuple(notes))

    def warnings(self, argv: Argv, workdir: Path) -> tuple[str, ...]:
        """An input that writes no restart file mid-run gets no checkpoint, silently: a
        single-point calculation (`RUN_TYPE ENERGY`), or `&RESTART OFF`."""
        found = _input_words(argv, workdir)
        if found is None:
            return ()
        name, sections = found
        run_type = sections.get(("GLOBAL", "RUN_TYPE"), "ENERGY")  # CP2K's default
        if run_type in _SINGLE_POINT:
            return (
                f"checkpoint: has no effect: {name} is a single-point calculation (RUN_TYPE "
                f"{run_type}), which writes no restart file to resume from",
            )
        if sections.get(("MOTION", "PRINT", "&RESTART"), "ON") in _OFF:
            return (
                f"checkpoint: has no effect: {name} turns the restart file off (&RESTART "
                "OFF under &MOTION &PRINT), so there is nothing to capture",
            )
        return ()

    def valid_file(self, path: Path) -> str | None:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            return f"cannot read: {exc}"
        return incomplete(text)

    def recorded_step(self, name: str, data: bytes | memoryview) -> int | None:
        found = _STEP_START.search(bytes(data).decode("utf-8", errors="replace"))
        return int(found.group(1)) if found else None

    def unfinished(self, argv: Argv, workdir: Path) -> str | None:
        """An MD run that ended at its `WALLTIME` (or on a file named EXIT) exits 0 short
        of STEPS (measured, CP2K 2023.1: `*** MD run terminated - exceeded requested
        execution time` after step 4 of 200, and no restart file written then: its last is
        the one `&EACH MD n` wrote before). How far it got is the last row of its energy
        file, else its restart file's step. `argv` is the step's own command: a resume's
        STEPS are those left, while its files count from the start."""
        found = _input_words(argv, workdir)
        total = input_steps(argv, workdir)
        if found is None or found[1].get(("GLOBAL", "RUN_TYPE")) != "MD" or total is None:
            return None
        steps = [s for p in workdir.glob("*-1.ener") if (s := _last_row(p)) is not None]
        restarts = sorted(workdir.glob(RESTART_GLOB), key=lambda p: p.stat().st_mtime)
        saved = (
            self.recorded_step(restarts[-1].name, restarts[-1].read_bytes()) if restarts else None
        )
        done = max(steps, default=saved)
        if done is None or done >= total:
            return None
        kept = f"its restart file is at step {saved}" if saved is not None else "no restart file"
        return (
            f"CP2K stopped after MD step {done} of {total} ({kept}), before its last: its "
            "&GLOBAL WALLTIME, or a file named EXIT in its folder"
        )

    def resume_args(self, argv: Argv, workdir: Path, resume: Argv, note: Note) -> Argv:
        if option(resume, "-i") != RESUME_INPUT:
            return resume  # the step's own `resume:` wins
        restarts = sorted(workdir.glob(RESTART_GLOB), key=lambda p: p.stat().st_mtime)
        if not restarts:
            note(f"no {RESTART_GLOB} restored; CP2K starts from its input")
            return ()
        restart = restarts[-1]
        text = restart.read_text(encoding="utf-8", errors="replace")
        done = self.recorded_step(restart.name, text.encode())
        total = input_steps(argv, workdir)
        if _md_steps_line(text.splitlines()) is None:  # a geometry optimisation, say
            note(f"{restart.name} holds no &MD STEPS: CP2K goes on from it as it wrote it")
            shown = text
        elif done is None or total is None:
            note(
                f"could not read how many MD steps the input asks for; CP2K runs the STEPS "
                f"of {restart.name} again from its step"
            )
            shown = text
        else:
            left = max(0, total - done)
            shown = with_steps(text, left)
            note(f"{restart.name} is at step {done} of {total}: {RESUME_INPUT} runs {left} more")
        if done is not None:
            project = restart.name.removesuffix(RESTART_GLOB[1:])
            if trimmed := trim_outputs(workdir, project, done):
                note(
                    f"cut {', '.join(trimmed)} after step {done}: CP2K appends from step "
                    f"{done + 1}, so no frame is there twice"
                )
        tmp = workdir / f".{RESUME_INPUT}.tmp"
        tmp.write_text(shown, encoding="utf-8")
        os.replace(tmp, workdir / RESUME_INPUT)
        return resume


#: a trajectory frame's comment line: `i =       10, time = ...`
_FRAME = re.compile(rb"^\s*i\s*=\s*(\d+)")


def _last_row(path: Path) -> int | None:
    """The step of the last row of an energy (`.ener`) table; None when it has none."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            rows = [r.split() for r in f.read().splitlines()]
    except OSError:
        return None
    steps = [r[0] for r in rows if r and r[0].isdigit()]
    return int(steps[-1]) if steps else None


def trim_outputs(workdir: Path, project: str, done: int) -> list[str]:
    """Cut the project's energy, cell and trajectory files after step `done` (written by
    the attempt that died after the restored capture), in place; the names cut."""
    cut = []
    for path in sorted(workdir.glob(f"{project}-*1.*")):
        if path.suffix in (".ener", ".cell"):
            at = _first_after(path, done, table=True)
        elif path.suffix == ".xyz":
            at = _first_after(path, done, table=False)
        else:
            continue
        if at is not None:
            os.truncate(path, at)
            cut.append(path.name)
    return cut


def _first_after(path: Path, done: int, *, table: bool) -> int | None:
    """The offset of the first record of `path` past step `done`: a table row (its first
    column is the step) or an xyz frame (its atom count line, before `i = step`)."""
    try:
        with open(path, "rb") as f:
            at, before = 0, 0
            for line in f:
                if table:
                    words = line.split()
                    if words and words[0].isdigit() and int(words[0]) > done:
                        return at
                elif (frame := _FRAME.match(line)) and int(frame.group(1)) > done:
                    return before
                before, at = at, at + len(line)
    except OSError:
        return None
    return None


def incomplete(text: str) -> str | None:
    """Why `text` is not a whole CP2K restart file (None: it is). CP2K rewrites the file in
    place, so a copy taken mid-write stops inside a section."""
    if _HEAD not in text.split("\n", 1)[0]:
        return "not a CP2K restart file (no version header)"
    depth = 0
    ended = False
    for line in text.splitlines():
        word = line.split("!", 1)[0].split()[:1]
        if not word or not word[0].startswith("&"):
            continue
        if word[0].upper() == "&END":
            depth -= 1
            ended = ended or (depth == 0 and "FORCE_EVAL" in line.upper())
        else:
            depth += 1
    if depth != 0 or not ended:
        return "incomplete CP2K restart file (a section is not closed: torn or being written)"
    return None


def _keywords(lines: Sequence[str]) -> Iterator[tuple[int, tuple[str, ...], list[str]]]:
    """Each keyword line of a CP2K input (a line's index, the sections it is in, its words
    upper-cased), and each section's opening with its parameter (`&RESTART OFF`: under the
    path to it, words `["&RESTART", "OFF"]`); preprocessor lines (`@SET`) as they are."""
    path: tuple[str, ...] = ()
    for i, line in enumerate(lines):
        words = line.upper().split()
        if not words:
            continue
        if words[0] == "&END":
            path = path[:-1]
            continue
        yield i, path, words
        if words[0].startswith("&"):
            path = (*path, words[0][1:])


def _md_steps_line(lines: Sequence[str]) -> int | None:
    """Which of `lines` is the STEPS of the `&MOTION &MD` section (None: there is none)."""
    return next(
        (i for i, path, words in _keywords(lines) if words[0] == "STEPS" and path[-2:] == _MD),
        None,
    )


def with_steps(text: str, steps: int) -> str:
    """`text` with the STEPS of its `&MOTION &MD` section set to `steps`."""
    lines = text.splitlines(keepends=True)
    at = _md_steps_line(lines)
    if at is None:
        return text
    line = lines[at]
    lines[at] = line[: len(line) - len(line.lstrip())] + f"STEPS  {steps}\n"
    return "".join(lines)


def input_steps(argv: Sequence[str], workdir: Path) -> int | None:
    """The STEPS of the `&MOTION &MD` section of the input `argv` runs, with its `@SET`,
    `@INCLUDE` and `--set` values applied; None when it cannot be read for sure (no such
    keyword, an `@IF`, a variable without a value)."""
    found = _input_lines(argv, workdir)
    if found is None:
        return None
    values = {
        key.upper(): value
        for i, arg in enumerate(argv[:-1])
        if arg in ("-E", "--set") and "=" in argv[i + 1]
        for key, value in [argv[i + 1].split("=", 1)]
    }
    _, lines = found
    for i, path, words in _keywords(lines):
        if words[0] == "@SET" and len(words) >= 3:
            values[words[1]] = " ".join(lines[i].split()[2:])
        elif words[0].startswith("@"):
            return None  # @IF and friends: which branch runs is CP2K's to say
        elif words[0] == "STEPS" and path[-2:] == _MD and len(words) == 2:
            raw = lines[i].split()[1]
            value = _VAR.sub(lambda m: values.get((m.group(1) or m.group(2)).upper(), "?"), raw)
            return int(value) if value.isdigit() else None
    return None


#: the section whose STEPS a resume sets
_MD = ("MOTION", "MD")
#: run types that compute one point and write no restart file while they run
_SINGLE_POINT = frozenset({"ENERGY", "ENERGY_FORCE", "WAVEFUNCTION_OPTIMIZATION", "WFN_OPT"})
#: how an input turns a section off (`&RESTART OFF`)
_OFF = frozenset({"OFF", "F", "FALSE", ".FALSE.", "NO", "N"})


def _input_words(
    argv: Sequence[str], workdir: Path
) -> tuple[str, dict[tuple[str, ...], str]] | None:
    """The input `argv` runs and the values it sets, by section path (`("GLOBAL",
    "RUN_TYPE") -> "MD"`; a section's own parameter under `&NAME`: `("MOTION", "PRINT",
    "&RESTART") -> "OFF"`), upper-cased; None when it cannot be read for sure (an
    `@IF` could change any of it)."""
    found = _input_lines(argv, workdir)
    if found is None:
        return None
    name, lines = found
    values: dict[tuple[str, ...], str] = {}
    for _, path, words in _keywords(lines):
        if words[0].startswith("@") and words[0] != "@SET":
            return None
        if len(words) > 1 and words[0] != "@SET":  # a value with a variable matches nothing
            values[(*path, words[0])] = words[1]
    return name, values


def _input_lines(argv: Sequence[str], workdir: Path) -> tuple[str, list[str]] | None:
    """The name of the input `argv` runs and its lines (see :func:`_lines`), or None."""
    index = next((i for i, a in enumerate(argv) if os.path.basename(a) in Cp2k.programs), None)
    name = _input_name(argv, index) if index is not None else None
    lines = _lines(workdir / name, workdir, 0) if name else None
    return None if name is None or lines is None else (name, lines)


def _lines(path: Path, workdir: Path, depth: int) -> list[str] | None:
    """The input's lines without comments, `@INCLUDE`d files in place."""
    if depth > 8 or not_a_file(path) is not None:
        return None
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    out: list[str] = []
    for line in text.splitlines():
        line = re.split(r"[!#]", line, maxsplit=1)[0]
        words = line.split()
        if len(words) == 2 and words[0].upper() == "@INCLUDE":
            included = _lines(workdir / words[1].strip("'\""), workdir, depth + 1)
            if included is None:
                return None
            out += included
        else:
            out.append(line)
    return out


def _input_name(argv: Argv | Sequence[str], index: int) -> str | None:
    """The input file of the `cp2k` at `index`: `-i X`, else its last bare argument."""
    given = option(argv[index:], "-i")
    if given is not None:
        return given
    words = argv[index + 1 :]
    bare = [
        w
        for i, w in enumerate(words)
        if not w.startswith("-") and (i == 0 or words[i - 1] not in _VALUED)
    ]
    return bare[-1] if bare else None


def _with_input_option(argv: Argv, index: int) -> Argv:
    """`cp2k in.inp` as `cp2k -i in.inp`, so that the `-i` a resume appends is the last."""
    if option(argv[index:], "-i") is not None:
        return argv
    name = _input_name(argv, index)
    if name is None:
        return argv
    at = len(argv) - 1 - argv[::-1].index(name)
    return (*argv[:at], "-i", name, *argv[at + 1 :])


#: `input/input_parsing.F:255` on the box's last line: where in CP2K, not what
_SOURCE = re.compile(r"\s*[\w./-]+\.F:\d+\s*$")


def error_said(lines: Sequence[str]) -> str | None:
    """The message of CP2K's last `[ABORT]` box in `lines`, on one line (the art and the
    source location left out), or None: a failed run said only `exited with code 1`."""
    starts = [i for i, line in enumerate(lines) if "[ABORT]" in line]
    if not starts:
        return None
    words: list[str] = []
    for line in lines[starts[-1] + 1 :]:
        body = line.strip()
        if not body.startswith("*") or set(body) == {"*"}:
            break
        text = _SOURCE.sub("", body.strip("*")[9:]).strip()
        if text:
            words.append(text)
    return " ".join(words) or None
