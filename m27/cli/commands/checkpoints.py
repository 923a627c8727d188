"""`m27 checkpoints`: list, verify and garbage-collect the checkpoints of a run's steps.

    m27 checkpoints RUN [STEP] [--json]        time, step, sim step, bytes, % changed, valid
    m27 checkpoints verify RUN [STEP]          every chunk's hash; exit 1 naming bad files
    m27 checkpoints gc RUN [STEP] [--keep N]   keep the newest N intact, drop unreferenced packs
    m27 checkpoints gc --done [--dry-run] [RUN]  delete the checkpoints of succeeded steps

RUN is a run id (a unique prefix, or `last`) under $M27_HOME/checkpoints, or a directory.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from m27 import runids, tables
from m27._exceptions import CorruptCheckpointError, RunError
from m27.checkpoint import Listed, checkpoints_home, load_settings, prune, scan, verify
from m27.checkpoint.files import CAPTURES, capture_dir
from m27.cli.commands import SUMMARY
from m27.cli.commands._ckpt_done import gc_done
from m27.cli.commands._common import made_by, print_json
from m27.paths import join_under
from m27.tables import Col
from m27.units import format_size

_ACTIONS = ("list", "verify", "gc")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "checkpoints",
        help=SUMMARY["checkpoints"],
        # argparse would write nargs="+" as "[verify|gc] RUN [STEP] [[verify|gc] ...]"
        usage="m27 checkpoints [-h] [--json] [--keep N] [verify|gc] RUN [STEP]\n"
        "       m27 checkpoints gc --done [--dry-run] [--json] [RUN]",
        description="List the checkpoints of RUN (all steps, or STEP; a `matrix:` entry's "
        "name: each step it made); `verify` checks every "
        "chunk's hash (exit 1 on corruption, naming the files); `gc` keeps the newest N intact "
        "checkpoints (every chunk read; a corrupt one is left but not counted) and deletes "
        "packs nothing references; `gc --done` deletes the checkpoints of every step that "
        "succeeded in a run that ended (of RUN alone, if given): nothing restores them. RUN "
        "is a run id, a unique prefix, `last`, or a checkpoint directory.",
    )
    p.add_argument("words", nargs="*", metavar="[verify|gc] RUN [STEP]")
    p.add_argument(
        "--done",
        nargs="?",
        const="",
        default=None,
        metavar="RUN",
        help="gc: delete the checkpoints of steps that succeeded (a resume skips them, "
        "--rerun starts them over); those of steps that failed, were cancelled or crashed, "
        "and of runs still running, stay",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="gc --done: say what would go, delete nothing"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--keep",
        type=int,
        default=None,
        metavar="N",
        help="gc: checkpoints to keep (default: keep_last from the config)",
    )
    p.set_defaults(func=run, intermixed_args=True)


def run(args: argparse.Namespace) -> int:
    words = list(args.words)
    if args.done is not None or args.dry_run:
        return _done(args, words)
    if not words:
        print("m27 checkpoints: expected [verify|gc] RUN [STEP]", file=sys.stderr)
        return 2
    if len(words) == 1 and words[0] in _ACTIONS[1:]:
        print(
            f"m27 checkpoints {words[0]}: give the run to {words[0]}: "
            f"`m27 checkpoints {words[0]} RUN [STEP]` (RUN: a run id, a unique prefix, `last`, "
            "or a checkpoint directory; `m27 runs` lists the runs)",
            file=sys.stderr,
        )
        return 2
    action = words.pop(0) if words[0] in _ACTIONS and len(words) > 1 else "list"
    if not 1 <= len(words) <= 2:
        print("m27 checkpoints: expected [verify|gc] RUN [STEP]", file=sys.stderr)
        return 2
    try:
        targets = _directories(words[0], words[1] if len(words) > 1 else None)
    except RunError as exc:
        print(f"m27 checkpoints: {exc}", file=sys.stderr)
        return 2
    if action != "gc" and args.keep is not None:
        print(
            f"m27 checkpoints: --keep goes with gc: m27 checkpoints gc {' '.join(words)} "
            f"--keep {args.keep}",
            file=sys.stderr,
        )
        return 2
    if action == "verify":
        return _verify(targets, args.json)
    if action == "gc":
        keep = args.keep if args.keep is not None else load_settings().keep_last
        if keep < 1:
            print("m27 checkpoints gc: --keep must be at least 1", file=sys.stderr)
            return 2
        return _gc(targets, keep, args.json)
    return _list(targets, args.json)


def _done(args: argparse.Namespace, words: list[str]) -> int:
    """`gc --done [RUN]` (`gc RUN --done` too); the other actions take neither option."""
    # `gc` must be said: `m27 checkpoints --done last` (a listing, as the user may have
    # meant) deleted checkpoints
    said_gc = words[:1] == ["gc"]
    if said_gc:
        words.pop(0)
    run = args.done or (words.pop(0) if words and said_gc else None)
    if args.done is None or not said_gc or words or args.keep is not None:
        print(
            "m27 checkpoints: --done and --dry-run go with gc alone: "
            "m27 checkpoints gc --done [--dry-run] [RUN]",
            file=sys.stderr,
        )
        return 2
    try:
        return gc_done(run, args.dry_run, args.json)
    except RunError as exc:
        print(f"m27 checkpoints: {exc}", file=sys.stderr)
        return 2


def _directories(run: str, step: str | None) -> list[tuple[str, Path]]:
    """(step name, directory) pairs to act on."""
    direct = Path(run)
    if direct.is_dir() and step is None and any(direct.glob("ckpt-*.json")):
        return [(direct.name, direct)]
    root = checkpoints_home()
    if root.exists() and not root.is_dir():  # it said "no run matches", which was untrue
        raise RunError(
            f"{root} is not a folder: m27 keeps every run's checkpoints in it; move it aside",
            file=str(root),
        )
    known = (
        sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
        if root.is_dir()
        else []
    )
    run_id = runids.resolve(run, [p.name for p in known])
    run_dir = join_under(root, run_id)
    if step is not None:
        # `STEP/files`, as the listing names a step's captures, picks those alone
        name, slash, part = step.partition("/")
        step_dir = join_under(run_dir, name) if not slash or part == CAPTURES else None
        if step_dir is not None and not step_dir.is_dir() and run_dir.is_dir() and not slash:
            # a `matrix:` entry's name: the checkpoints of each step it made
            made = made_by(name, sorted(p.name for p in run_dir.iterdir() if p.is_dir()))
            if made:
                return [t for m in made for t in _with_captures(m, join_under(run_dir, m))]
        if step_dir is not None and step_dir.exists() and not step_dir.is_dir():
            raise _not_a_folder(step_dir, name, run_id)  # it said "no checkpoints for step"
        if step_dir is None or not step_dir.is_dir():
            raise RunError(f"run {run_id} has no checkpoints for step {step!r}", run_id=run_id)
        return [t for t in _with_captures(name, step_dir) if not slash or t[0] == step]
    entries = sorted(run_dir.iterdir()) if run_dir.is_dir() else []
    for p in entries:
        if not p.is_dir():  # its listing said "no checkpoints", as if there had been none
            print(f"m27 checkpoints: {_not_a_folder(p, p.name, run_id)}", file=sys.stderr)
    return [t for p in entries if p.is_dir() for t in _with_captures(p.name, p)]


def _not_a_folder(path: Path, step: str, run_id: str) -> RunError:
    return RunError(
        f"{path} is not a folder: m27 keeps step {step}'s checkpoints in it; move it aside",
        file=str(path),
        run_id=run_id,
    )


def _with_captures(step: str, step_dir: Path) -> list[tuple[str, Path]]:
    """A step's array checkpoints, and the files it checkpoints itself (a GROMACS .cpt,
    captured by the runner) as ``STEP/files``."""
    captures = capture_dir(step_dir)
    extra = [(f"{step}/{CAPTURES}", captures)] if captures.is_dir() else []
    return [(step, step_dir), *extra]


def _row(step: str, entry: Listed) -> dict[str, Any]:
    info = entry.info
    # A capture of a program's own files counts captures in its `sim_step` (GROMACS's
    # first .cpt at MD step 3000 read `SIM STEP 1`): its step is the one the program
    # recorded in the file, when the engine's recipe can read it.
    captured = step == CAPTURES or step.endswith(f"/{CAPTURES}")
    sim_step = (info.engine_step if captured else info.sim_step) if info else None
    return {
        "step": step,
        "seq": entry.seq,
        "path": str(entry.path),
        "time": info.time if info else None,
        "sim_step": sim_step,
        "bytes_written": info.bytes_written + _size(entry.path) if info else None,
        "bytes_total": info.bytes_total if info else None,
        "percent_changed": round(info.percent_changed, 2) if info else None,
        "valid": entry.valid,
        "problem": entry.problem,
    }


def _size(path: Path) -> int:
    """A manifest's own bytes: the run's log line (`481B written`) counts them with the
    packs', and the listing says the same figure for the same checkpoint."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _list(targets: list[tuple[str, Path]], as_json: bool) -> int:
    rows = [_row(step, entry) for step, directory in targets for entry in scan(directory)]
    if as_json:
        print_json(rows)
        return 0
    if not rows:
        print("no checkpoints")
        return 0
    table = []
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["time"])) if r["time"] else "?"
        written = format_size(r["bytes_written"]) if r["bytes_written"] is not None else "?"
        changed = f"{r['percent_changed']:.1f}%" if r["percent_changed"] is not None else "?"
        valid = "ok" if r["valid"] else f"NO: {r['problem']}"
        sim = r["sim_step"] if r["sim_step"] is not None else ("?" if r["time"] is None else "-")
        table.append((r["step"], r["seq"], when, sim, written, changed, valid))
    cols = [Col("STEP", wrap=True), Col("#", right=True), Col("TIME"), Col("SIM STEP", right=True)]
    cols += [Col("WRITTEN", right=True), Col("CHANGED", right=True), Col("MANIFEST", wrap=True)]
    tables.show(cols, table)
    if sys.stdout.isatty():
        print("MANIFEST: manifest and packs present; `m27 checkpoints verify` reads every chunk")
    return 0


def _checking(entry: Listed) -> None:
    """On a terminal, what is being read now (a checkpoint of tens of GiB takes a minute
    at disk speed, and nothing was printed until every one was read): one line the next
    result overwrites."""
    if sys.stdout.isatty():
        size = f" (state {format_size(entry.info.bytes_total)})" if entry.info else ""
        print(f"checking {entry.path}{size}...", end="\r", flush=True)


def _said(line: str) -> None:
    """A result line, over the `checking ...` line on a terminal."""
    print("\x1b[2K" + line if sys.stdout.isatty() else line, flush=True)


def _verify(targets: list[tuple[str, Path]], as_json: bool) -> int:
    results = []
    for step, directory in targets:
        for entry in scan(directory):
            if not as_json:
                _checking(entry)
            try:
                verify(entry.path)
                problem = None
            except CorruptCheckpointError as exc:
                problem = str(exc)
                bad = getattr(exc, "file", str(entry.path))
            results.append(
                {
                    "step": step,
                    "path": str(entry.path),
                    "ok": problem is None,
                    "problem": problem,
                    "file": None if problem is None else bad,
                }
            )
            if not as_json:  # as each is read: a long verify shows how far it has come
                _said(
                    f"ok       {entry.path}"
                    if problem is None
                    else f"CORRUPT  {entry.path}: {problem}"
                )
    if as_json:
        print_json(results)
    else:
        bad_count = sum(not r["ok"] for r in results)
        print(f"{len(results) - bad_count} ok, {bad_count} corrupt")
    return 1 if any(not r["ok"] for r in results) else 0


def _gc(targets: list[tuple[str, Path]], keep: int, as_json: bool) -> int:
    removed: list[dict[str, Any]] = []
    corrupt: list[dict[str, Any]] = []

    def intact(entry: Listed) -> bool:
        """Counted toward --keep only when every chunk reads back: a checkpoint whose pack
        was damaged must not push out the older one a restore falls back to."""
        if not as_json:
            _checking(entry)
        try:
            verify(entry.path)
        except CorruptCheckpointError as exc:
            corrupt.append({"step": step, "path": str(entry.path), "problem": str(exc)})
            return False
        return True

    for step, directory in targets:
        sizes = {p: p.stat().st_size for p in directory.iterdir() if p.is_file()}
        for path in prune(directory, keep, intact=intact):
            removed.append({"step": step, "path": str(path), "bytes": sizes.get(path, 0)})
    if as_json:
        print_json({"removed": removed, "corrupt": corrupt})
        return 0
    if sys.stdout.isatty():
        print("\x1b[2K", end="", flush=True)  # the last `checking ...` line
    for r in corrupt:
        print(f"corrupt  {r['path']}: {r['problem']} (not counted toward --keep {keep})")
    for r in removed:
        print(f"removed  {r['path']}")
    print(f"{len(removed)} files removed, {format_size(sum(r['bytes'] for r in removed))} freed")
    if corrupt:
        print(f"{len(corrupt)} corrupt checkpoint(s) left in place: see `m27 checkpoints verify`")
    return 0
