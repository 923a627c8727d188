"""``python -m m27.executors.slurm._resume DIR [FALLBACK]``:
which checkpoint a Slurm job resumes from.

A requeued job starts again on a compute node, long after the m27 process chose
``M27_RESUME_FROM`` for the first submission, so the batch script asks this at every start:
the newest valid checkpoint in the step's own directory (what the previous start saved on
the time-limit signal), else FALLBACK (the checkpoint m27 chose at submission, e.g. one of
the run this one resumes), else nothing. It prints one path or an empty line, and always
exits 0: a job without a checkpoint starts from the beginning.
"""

from __future__ import annotations

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


def main(argv: list[str]) -> int:
    directory = argv[0] if argv else ""
    fallback = argv[1] if len(argv) > 1 else ""
    print(choose(directory, fallback))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
