"""``python -m m27.executors.slurm._resume DIR [FALLBACK]``:
which checkpoint a Slurm job resumes from.

``python -m m27.executors.slurm._resume --args RECIPE N RESUME_1..N ARGV...``: the
arguments a requeued self-checkpointing program resumes with, as the recipe makes them of
the files its last start wrote (shell-quoted, on one line; the recipe's notes on stderr,
which is the step's log).

A requeued job starts again on a compute node, long after the m27 process chose
``M27_RESUME_FROM`` for the first submission, so the batch script asks this at every start:
the newest valid checkpoint in the step's own directory (what the previous start saved on
the time-limit signal), else FALLBACK (the checkpoint m27 chose at submission, e.g. one of
the run this one resumes), else nothing. It prints one path or an empty line, and always
exits 0: a job without a checkpoint starts from the beginning.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from m27.checkpoint import latest_checkpoint


def choose(directory: str, fallback: str = "") -> str:
    if directory:
        try:
            found = latest_checkpoint(Path(directory))
        except OSError:
            found = None
        if found is not None:
            return str(found)
    return fallback


def resume_args(recipe_name: str, resume: tuple[str, ...], argv: tuple[str, ...]) -> str:
    """The recipe's resume arguments for `argv` in the current folder, shell-quoted."""
    from m27.executors.engines import recipe_named

    recipe = recipe_named(recipe_name)
    if recipe is not None:
        resume = recipe.resume_args(argv, Path.cwd(), resume, _note)
    return shlex.join(resume)


def _note(line: str) -> None:
    print(f"m27: {line}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--args"] and len(argv) >= 3 and argv[2].isdigit():
        n = int(argv[2])
        planned = tuple(argv[3 : 3 + n])
        try:
            print(resume_args(argv[1], planned, tuple(argv[3 + n :])))
        except Exception as exc:  # the batch script resumes with the planned arguments
            _note(f"could not check the resume arguments ({exc}); {shlex.join(planned)} as planned")
            return 1
        return 0
    directory = argv[0] if argv else ""
    fallback = argv[1] if len(argv) > 1 else ""
    print(choose(directory, fallback))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
