"""GROMACS `gmx mdrun`: `-cpt` minutes, `<deffnm>.cpt`, `-cpi` to resume, SIGTERM.

mdrun checkpoints every `-cpt` minutes (and at the end) by writing a new file and renaming
it into place, and on SIGTERM/SIGINT/SIGUSR1 at the next neighbour-search step, then exits.
`-cpi x.cpt` resumes and, by default, appends to the outputs the checkpoint names
(.log, .edr, .xtc, ...). GROMACS then truncates each output to the length the checkpoint
recorded, after checking the MD5 of the (up to) 1 MiB before that point: outputs that
only grew since (they are append-only) pass; outputs that are missing, shorter or
different do not, and appending would fail. :meth:`Gromacs.resume_args` checks exactly
that before the resume and falls back to `-noappend` (new `.part000N.` files, nothing
lost, nothing duplicated) when the outputs do not match.

`-multidir A B ...` (an MPI mdrun under `mpirun -np N`) runs one simulation in each folder:
each writes its own checkpoint there, all are captured together (with `-replex`, only once
every one has written its new file), and `-cpi x.cpt` resumes each from its own.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import struct
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from m27.executors.engines._base import (
    Argv,
    Note,
    Recipe,
    RecipePlan,
    engine_index,
    minutes,
    option,
)
from m27.units import format_duration

#: XDR ints at the start and the end of every complete .cpt (GROMACS's CPT_MAGIC1/2).
CPT_MAGIC1 = 171817
CPT_MAGIC2 = 171819
#: mdrun options that set its thread count: given by the user, m27 adds no -nt.
_THREAD_OPTIONS = ("-nt", "-ntmpi", "-ntomp")
#: GROMACS checksums at most this many bytes before each recorded output offset.
CHECKSUM_SPAN = 1 << 20


@dataclass(frozen=True)
class OutputRecord:
    """One output file as a checkpoint records it."""

    name: str
    offset: int
    checksum_size: int
    checksum: str


def _mdrun_at(argv: Argv, index: int) -> int | None:
    """Where `mdrun` is in a command whose program is at `index`: the program itself
    (`mdrun_mpi`), or the first word after `gmx` and its own flags (`gmx -quiet mdrun`,
    `gmx -nobackup mdrun`: the flags before the subcommand take no value); None when the
    command is another gmx tool (`gmx grompp`)."""
    if os.path.basename(argv[index]).startswith("mdrun"):
        return index
    at = index + 1
    while at < len(argv) and argv[at].startswith("-"):
        at += 1
    return at if at < len(argv) and argv[at] == "mdrun" else None


#: What `mdrun -rerun` does with `-cpt` (measured, GROMACS 2022: `-cpt 0.001` over a whole
#: rerun wrote no .cpt)
_RERUN = "writes no checkpoint when it recomputes a trajectory's frames"


def _rerun(argv: Argv, at: int) -> bool:
    return "-rerun" in argv[at + 1 :]


class Gromacs(Recipe):
    name = "gromacs"
    programs: tuple[str, ...] = ("gmx", "gmx_mpi", "gmx_d", "gmx_mpi_d", "mdrun", "mdrun_mpi")

    def matches(self, argv: Argv, index: int) -> bool:
        return _mdrun_at(argv, index) is not None

    def plan(self, argv: Argv, index: int, every: float | None) -> RecipePlan:
        at = _mdrun_at(argv, index) or index
        if _rerun(argv, at):  # no checkpoint to watch, nor to resume from (warnings)
            return RecipePlan(argv, (), (), "TERM", (f"-rerun: mdrun {_RERUN}",))
        notes: list[str] = []
        cpo = option(argv, "-cpo", at)
        deffnm = option(argv, "-deffnm", at)
        cpt = cpo or (f"{deffnm}.cpt" if deffnm else "state.cpt")
        dirs = multidir(argv, at)
        files = tuple(f"{d.rstrip('/')}/{cpt}" for d in dirs) or (cpt,)
        if dirs:
            notes.append(_multidir_note(argv[index], dirs, cpt, "-replex" in argv))
        given = option(argv, "-cpt", at)
        out = argv
        if given is not None:
            notes.append(_given_interval(given, every, cpt))
        elif every is not None:
            out = (*argv[: at + 1], "-cpt", minutes(every), *argv[at + 1 :])
            m = minutes(every)
            written = f"{cpt.removesuffix('.cpt')}_stepN.cpt" if "-cpnum" in argv else cpt
            notes.append(f"-cpt {m}: mdrun writes {written} every {m} min")
        else:
            notes.append(f"no interval: mdrun writes {cpt} at its default -cpt 15 (minutes)")
        if (maxh := option(argv, "-maxh", at)) is not None:
            notes.append(
                f"-maxh {maxh}: mdrun stops after {maxh} h, before its last step, and exits 0; "
                "m27 counts that attempt failed, and a resume or `retries:` goes on from its "
                "checkpoint (m27's own checkpoints and Slurm's time-limit signal make -maxh "
                "unneeded)"
            )
        cpi = option(argv, "-cpi", at)
        if cpi is not None:
            resume: tuple[str, ...] = ()
            notes.append(f"-cpi {cpi} is in the command: mdrun resumes by itself")
        else:
            resume = ("-cpi", cpt)
            how = "as new part files" if "-noappend" in argv else "appending to its outputs"
            notes.append(f"on resume: -cpi {cpt} ({how})")
        return RecipePlan(out, files, resume, "TERM", tuple(notes))

    def warnings(self, argv: Argv, workdir: Path) -> tuple[str, ...]:
        index = engine_index(argv, self.programs)
        at = None if index is None else _mdrun_at(argv, index)
        if at is None:
            return ()
        if _rerun(argv, at):
            return (
                f"checkpoint: has no effect: `mdrun -rerun` {_RERUN}, so a resume reruns the "
                "trajectory from its first frame",
            )
        if "-cpnum" in argv[at + 1 :]:
            cpt = self.plan(argv, at, None).files[0].rsplit("/", 1)[-1]
            return (
                f"checkpoint: captures nothing: with -cpnum mdrun writes "
                f"{cpt.removesuffix('.cpt')}_stepN.cpt files and never {cpt} (measured), "
                "so there is nothing to capture or resume from; remove -cpnum (m27 keeps its "
                "recent captures: `m27 checkpoints`)",
            )
        return ()

    def together(self, argv: Argv) -> bool:
        """Replicas that exchange (`-multidir ... -replex`) checkpoint at one moment, each
        its own file (measured, GROMACS 2022: at steps 5 apart, 2425 and 2420, and mdrun
        resumes them so): a set caught between their renames, one new and one from the
        checkpoint before, is not one. Independent simulations (`-multidir` alone) write
        each on its own clock, and any set of their files resumes."""
        return "-replex" in argv and bool(multidir(argv))

    def threads(self, argv: Argv, index: int, n: int) -> tuple[Argv, str]:
        """``-nt n`` after `mdrun`: it starts one thread per hardware thread of the node
        whatever its affinity mask (measured with GROMACS 2022: under ``taskset -c 1`` it
        ran 2 threads on that one core; ``OMP_NUM_THREADS=1`` gave 2 thread-MPI ranks).
        An MPI build (`gmx_mpi`) has no ``-nt``: its ranks read ``OMP_NUM_THREADS``."""
        at = _mdrun_at(argv, index) or index
        if "_mpi" in os.path.basename(argv[index]):
            return argv, "no -nt for an MPI mdrun (its ranks read OMP_NUM_THREADS)"
        given = next((a for a in argv[at + 1 :] if a in _THREAD_OPTIONS), None)
        if given is not None:
            return argv, f"mdrun's own {given} kept"
        return (*argv[: at + 1], "-nt", str(n), *argv[at + 1 :]), f"mdrun -nt {n}"

    def valid_file(self, path: Path) -> str | None:
        if not path.name.endswith(".cpt"):
            return None
        try:
            with open(path, "rb") as f:
                head = f.read(4)
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - 4))
                tail = f.read(4)
        except OSError as exc:
            return f"cannot read: {exc}"
        if size < 8 or int.from_bytes(head, "big") != CPT_MAGIC1:
            return "not a GROMACS checkpoint (bad magic number)"
        if int.from_bytes(tail, "big") != CPT_MAGIC2:
            return "incomplete GROMACS checkpoint (no footer: torn or still being written)"
        return None

    def recorded_step(self, name: str, data: bytes | memoryview) -> int | None:
        return cpt_step(data) if name.endswith(".cpt") else None

    def resume_args(self, argv: Argv, workdir: Path, resume: Argv, note: Note) -> Argv:
        cpt = option(resume, "-cpi")
        if cpt is None or "-noappend" in argv or "-noappend" in resume:
            return resume
        program = next((a for a in argv if os.path.basename(a).startswith("gmx")), "gmx")
        bad: list[str] = []
        names: list[str] = []
        for folder in [workdir / d for d in multidir(argv)] or [workdir]:
            where = "" if folder == workdir else f"{folder.relative_to(workdir).as_posix()}/"
            records = read_outputs(program, folder / cpt)
            if records is None:
                note(f"could not read the output list of {where}{cpt}; letting mdrun check it")
                return resume
            bad += [f"{where}{r.name}: {why}" for r in records if (why := mismatch(folder, r))]
            names += [f"{where}{r.name}" for r in records]
        if bad:
            note(
                f"outputs do not match {cpt} ({'; '.join(bad)}): resuming with -noappend "
                "(mdrun writes new .partNNNN files)"
            )
            return (*resume, "-noappend")
        note(f"outputs match {cpt}: mdrun appends to {', '.join(names)}")
        return resume


def multidir(argv: Argv, start: int = 0) -> tuple[str, ...]:
    """The folders of `mdrun -multidir A B ...` (every word after it up to the next
    option), each simulation's own; () without it."""
    for i in range(start, len(argv)):
        if argv[i] == "-multidir":
            rest = argv[i + 1 :]
            end = next((k for k, a in enumerate(rest) if a.startswith("-")), len(rest))
            return tuple(rest[:end])
    return ()


def _multidir_note(program: str, dirs: Sequence[str], cpt: str, replex: bool) -> str:
    """What m27 does with `-multidir`: each simulation writes `cpt` in its own folder (mdrun
    runs each in its folder, so `-cpi` names the file as it is in each)."""
    shown = ", ".join(f"{d.rstrip('/')}/{cpt}" for d in dirs[:3])
    if len(dirs) > 3:
        shown += f" and {len(dirs) - 3} more"
    said = f"-multidir: {len(dirs)} simulations, each writes its own {cpt} ({shown})"
    if replex:
        said += "; with -replex they are captured only once all have written theirs"
    else:
        said += "; captured together, each at its own step"
    if "_mpi" not in os.path.basename(program):
        said += f"; {os.path.basename(program)} without MPI stops: -multidir needs gmx_mpi"
    return said


def _given_interval(given: str, every: float | None, cpt: str) -> str:
    """What the command's own `-cpt` means, said plainly: it is kept, and a negative value
    (mdrun then writes no checkpoint at all) or one far from `checkpoint:` went unnoticed
    behind "kept" while the step's declared interval promised otherwise."""
    said = f"-cpt {given} is in the command"
    try:
        value = float(given)
    except ValueError:
        return f"{said}: not a number of minutes, so mdrun stops at once with an error"
    instead = f"; remove it and m27 sets -cpt {minutes(every)}" if every is not None else ""
    if value < 0 or math.isnan(value) or math.isinf(value):
        return f"{said}: mdrun writes no {cpt} while it runs, so a crash loses the run{instead}"
    if value == 0:
        return f"{said}: mdrun writes {cpt} at every step it can, which slows a large system"
    kept = f"{said}: kept, mdrun writes {cpt} every {given} min"
    if every is not None and abs(value * 60 - every) >= 1:
        kept += f", not every {format_duration(every)} as checkpoint: says"
    return kept


def cpt_step(data: bytes | memoryview) -> int | None:
    """The MD step a .cpt was written at, read from its XDR header; None if it is not one.

    The header is GROMACS's ``do_cpt_header``: the magic int, six strings (version, three
    unused build fields, program, time), the file version, then fields each added in a
    known file version (double precision 13, host 12, atoms, T-coupling groups,
    Nose-Hoover chains 10, barostat chains 11, lambda states 14, integrator, simulation
    part 3) and the step, an int64 from version 5. Only the header is read: no `gmx dump`
    (a process, a second) for a number the listings show.
    """
    at = 0

    def ints(n: int) -> tuple[int, ...]:
        nonlocal at
        values = struct.unpack_from(f">{n}i", data, at)
        at += 4 * n
        return values

    try:
        if ints(1)[0] != CPT_MAGIC1:
            return None
        for _ in range(6):
            (length,) = ints(1)
            if not 0 <= length <= 1024:
                return None
            at += (length + 3) & ~3  # XDR pads strings to four bytes
        (version,) = ints(1)
        if version < 1:
            return None
        if version >= 13:
            ints(1)
        if version >= 12:
            (length,) = ints(1)
            if not 0 <= length <= 1024:
                return None
            at += (length + 3) & ~3
        later = [(0, 2), (10, 1), (11, 1), (14, 1), (0, 1), (3, 1)]  # (since version, ints)
        for since, n in later:
            if version >= since:
                ints(n)
        if version >= 5:
            (step,) = struct.unpack_from(">q", data, at)
        else:
            (step,) = ints(1)
    except struct.error:  # shorter than its header
        return None
    return step if step >= 0 else None


_FIELD = re.compile(
    r"^(output filename|file_offset_high|file_offset_low|file_checksum_size|"
    r"file_checksum) = (.*)$"
)


def read_outputs(program: str, cpt: Path) -> list[OutputRecord] | None:
    """The outputs a checkpoint names, via `gmx dump -cp` (None if it cannot be read)."""
    try:
        done = subprocess.run(
            [program, "-quiet", "dump", "-cp", str(cpt)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return parse_outputs(done.stdout)


def parse_outputs(dump: str) -> list[OutputRecord]:
    records: list[OutputRecord] = []
    current: dict[str, str] = {}
    for line in dump.splitlines():
        m = _FIELD.match(line.strip())
        if not m:
            continue
        key, value = m.group(1), m.group(2).strip()
        if key == "output filename" and current:
            records.append(_record(current))
            current = {}
        current[key] = value
        if key == "file_checksum":
            records.append(_record(current))
            current = {}
    return records


def _record(fields: dict[str, str]) -> OutputRecord:
    high = int(fields.get("file_offset_high", "0"))
    low = int(fields.get("file_offset_low", "0")) % (1 << 32)
    return OutputRecord(
        name=fields.get("output filename", ""),
        offset=(high << 32) + low,
        checksum_size=int(fields.get("file_checksum_size", "-1")),
        checksum=fields.get("file_checksum", ""),
    )


def mismatch(workdir: Path, record: OutputRecord) -> str | None:
    """Why mdrun could not append to this output (None: it can)."""
    path = workdir / record.name
    try:
        size = path.stat().st_size
    except OSError:
        return "missing"
    if size < record.offset:
        return f"{size} bytes, the checkpoint needs {record.offset}"
    if record.checksum_size <= 0 or not record.checksum:
        return None
    start = record.offset - record.checksum_size
    with open(path, "rb") as f:
        f.seek(start)
        digest = hashlib.md5(f.read(record.checksum_size), usedforsecurity=False).hexdigest()
    return None if digest == record.checksum else "checksum differs"


#: What mdrun prints when it ends before its last step and still exits 0: at `-maxh`
#: (measured, GROMACS 2022: `Step 15325: Run time exceeded 0.002 hours, will terminate the
#: run within 25 steps`, the hours as `%.3f`: `0.000` for -maxh 0.0005; no confout .gro
#: written), or on a signal m27 did not send.
_MAXH = re.compile(r"Step (\d+): Run time exceeded \S+ hours, will terminate the run")
_SIGNALLED = re.compile(r"Received the (\w+) signal, stopping within")


def stopped_early(lines: Sequence[str], *, signalled: bool = True) -> str | None:
    """Why an mdrun that exited 0 did not run to its last step, from its output (None: it
    did, as far as its output says). A step that stopped at `-maxh` was counted a success:
    the analysis after it ran on a part of the trajectory."""
    for line in reversed(lines):
        if m := _MAXH.search(line):
            return (
                f"mdrun stopped at -maxh, its run time limit, at step {m[1]}, before its last step"
            )
        if signalled and (m := _SIGNALLED.search(line)):
            return f"mdrun stopped on SIG{m[1]}, which m27 did not send, before its last step"
    return None


#: The headings of GROMACS's error block (gmx_fatal, GMX_THROW of an InvalidInputError).
_ERROR_HEADS = ("Fatal error:", "Error in user input:", "Inconsistency in user input:")


def error_said(lines: Sequence[str]) -> str | None:
    """What GROMACS's last error block in `lines` says, on one line; None without one.

    A failed mdrun or grompp ends with a block between dashed lines (program, source file,
    then the heading and the message, then a link to the docs): the step's failure said
    only `exited with code 1`, and the phone the same."""
    for start in range(len(lines) - 1, -1, -1):
        if lines[start].strip() in _ERROR_HEADS:
            break
    else:
        return None
    text, indent = "", -1
    for line in lines[start + 1 :]:
        if line.startswith("For more information and tips") or line.startswith("-----"):
            break
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        # a wrapped line keeps its paragraph's indent; a deeper or shallower one is the
        # next part (`Invalid input values` / `  In option s` / `    Required ...`)
        joint = " " if depth == indent or text.endswith((":", ".")) else ": "
        text = f"{text}{joint}{line.strip()}" if text else line.strip()
        indent = depth
    return text or None
