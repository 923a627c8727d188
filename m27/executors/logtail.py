"""The last line a step printed, read from the end of its log (``$M27_HOME/runs/RUN/
STEP.log``): how `m27 status` and the bot's `/status RUN` show how far a long simulation
got (`step 55900, will finish ...`) and, by the log's last write, whether it still prints.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["TAIL_BYTES", "last_line"]

#: bytes read from the end of a step's log for its last line
TAIL_BYTES = 8192


def last_line(path: str | Path) -> tuple[str, float] | None:
    """The last non-blank line of the log at `path` (the step's output, or m27's note in
    it) and the log's last write (its mtime); None when it has none or cannot be read.
    An attempt's `=== ... ===` header or end is no output of the program."""
    try:
        with open(path, "rb") as f:
            at = os.fstat(f.fileno()).st_mtime
            start = max(0, f.seek(0, os.SEEK_END) - TAIL_BYTES)
            f.seek(start)
            lines = f.read().decode("utf-8", "replace").splitlines()[1 if start else 0 :]
    except OSError:  # not written yet, or removed: nothing to show
        return None
    said = [x for x in lines if x.strip() and not (x.startswith("=== ") and x.endswith(" ==="))]
    return (said[-1], at) if said else None
