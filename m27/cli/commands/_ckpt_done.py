"""`m27 checkpoints gc --done`: delete the checkpoints of steps that succeeded.

Nothing restores them: a resume skips a step that succeeded, and `--rerun` starts it over.
Yet each run keeps its steps' newest `keep_last` checkpoints, so a server running MD for
months fills its disk with the states of finished simulations (three 48 GiB states a
step). A step that failed in run R but succeeded since in a run that resumes R (directly
or through other resumes) is done too: its checkpoints in R served that resume. What a
resume may still need stays: the checkpoints of a step that failed, was cancelled or
crashed and has not succeeded since, of a run still running, and of a folder the event
log does not know (a run pruned from the log, a directory of someone's own).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from m27 import runids
from m27.checkpoint import checkpoints_home
from m27.cli.commands._common import in_full, outline, print_json, shown_status, store
from m27.events.state import NodeState
from m27.units import format_size, listed


@dataclass(frozen=True)
class _Found:
    run_id: str
    step: str
    path: Path
    bytes: int
    #: the run the step succeeded in: `run_id`, or a later run that resumes it
    succeeded_in: str


def _size(folder: Path) -> int:
    """Bytes of the files under `folder` (links not followed, as rmtree removes them)."""
    total = 0
    for base, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(base, name)).st_size
            except OSError:
                continue
    return total


def _plan(run: str | None) -> tuple[list[_Found], dict[str, int]]:
    """The step folders to delete, and how many folders stay for each reason."""
    root = checkpoints_home()
    folders = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    st = store()
    try:
        known = outline(st)
        if run is not None:  # a run id, a unique prefix or `last`, as elsewhere
            wanted = runids.resolve(run, list(known.runs))
            folders = [p for p in folders if p.name == wanted]
        ended = [
            p.name
            for p in folders
            if p.name in known.runs and shown_status(known.runs[p.name]) != "running"
        ]
        resumes = _resumes_of(known, set(ended))
        state = in_full(st, known, [*ended, *resumes])
    finally:
        st.close()
    later = _succeeded_later(state, resumes)
    found: list[_Found] = []
    kept = {"not succeeded": 0, "running": 0, "not in the event log": 0}
    for folder in folders:
        steps = sorted(p for p in folder.iterdir() if p.is_dir())
        if folder.name not in known.runs:
            kept["not in the event log"] += len(steps)
            continue
        if folder.name not in ended:
            kept["running"] += len(steps)
            continue
        states = state.runs[folder.name].steps
        for path in steps:
            if path.name in states and states[path.name].status == "succeeded":
                where: str | None = folder.name
            else:
                where = later.get((folder.name, path.name))
            if where is None:
                kept["not succeeded"] += 1
            else:
                found.append(_Found(folder.name, path.name, path, _size(path), where))
    return found, kept


def _resumes_of(known: NodeState, runs: set[str]) -> dict[str, list[str]]:
    """Each run that resumes one of `runs`, directly or not: the runs of `runs` it does."""
    found: dict[str, list[str]] = {}
    for run_id in known.runs:
        seen = [run_id]
        current = known.runs[run_id].resume_of
        while current and current in known.runs and current not in seen:
            seen.append(current)
            if current in runs:
                found.setdefault(run_id, []).append(current)
            current = known.runs[current].resume_of
    return found


def _succeeded_later(state: NodeState, resumes: dict[str, list[str]]) -> dict[tuple[str, str], str]:
    """(run, step) -> the later run that resumes `run` in which `step` succeeded."""
    later: dict[tuple[str, str], str] = {}
    for run_id, earlier in resumes.items():
        for name, step in state.runs[run_id].steps.items():
            if step.status == "succeeded":
                for before in earlier:
                    later.setdefault((before, name), run_id)
    return later


def _named(f: _Found) -> str:
    return f.step if f.succeeded_in == f.run_id else f"{f.step} in run {f.succeeded_in}"


def gc_done(run: str | None, dry_run: bool, as_json: bool) -> int:
    """Delete (or with `dry_run` list) the checkpoints of succeeded steps of ended runs."""
    found, kept = _plan(run)
    failed: list[str] = []
    removed: list[_Found] = []
    for f in found if not dry_run else []:
        try:
            shutil.rmtree(f.path)
        except OSError as exc:  # said, and not counted as freed
            failed.append(f"could not remove {f.path}: {exc.strerror or exc}")
            continue
        removed.append(f)
        with contextlib.suppress(OSError):  # the run's folder, once its last step's is gone
            f.path.parent.rmdir()
    found = found if dry_run else removed
    freed = sum(f.bytes for f in found)
    if as_json:
        rows: list[dict[str, Any]] = [
            {
                "run_id": f.run_id,
                "step": f.step,
                "path": str(f.path),
                "bytes": f.bytes,
                "succeeded_in": f.succeeded_in,
            }
            for f in found
        ]
        print_json({"removed" if not dry_run else "would_remove": rows, "kept": kept})
        for line in failed:
            print(f"m27 checkpoints: {line}", file=sys.stderr)
        return 1 if failed else 0
    verb = "would remove" if dry_run else "removed"
    by_run: dict[str, list[_Found]] = {}
    for f in found:
        by_run.setdefault(f.run_id, []).append(f)
    for steps in by_run.values():  # a line a run: a run of 300 steps is one line
        names = listed((_named(f) for f in steps), 3)
        size = format_size(sum(f.bytes for f in steps))
        print(
            f"{verb}  {steps[0].path.parent}  {size}: {len(steps)} succeeded "
            f"step{'s' if len(steps) != 1 else ''} ({names})"
        )
    runs = f"{len(by_run)} run{'s' if len(by_run) != 1 else ''}"
    folders = f"{len(found)} step folder{'s' if len(found) != 1 else ''}"
    print(f"{verb} {folders} of {runs}: {format_size(freed)}{'' if dry_run else ' freed'}")
    reasons = {
        "not succeeded": "of steps that have not succeeded (a resume restores them)",
        "running": "of runs still running",
        "not in the event log": "of runs the event log does not know",
    }
    for key, count in kept.items():
        if count:
            print(f"kept {count} step folder{'s' if count != 1 else ''} {reasons[key]}")
    for line in failed:
        print(f"m27 checkpoints: {line}", file=sys.stderr)
    return 1 if failed else 0
