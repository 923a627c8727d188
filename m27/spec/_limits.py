"""What a value may be so that the run can use it: bounds, the Slurm key table, and where a
path may point.

Everything here is checked at validation so that a file which validates does not fail later
for a reason the file already showed (a 300-character step name that no filesystem takes,
`retries: 10^12`, an `output:` that a variable sent to `../../../etc`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

#: Keys a step's ``slurm:`` mapping (or the site file, or a tier's entry) may hold. The
#: Slurm executor reads this table too; it lives here because spec may not import executors.
SLURM_KEYS = (
    "partition",
    "account",
    "qos",
    "time",
    "mem",
    "cpus",
    "gpus",
    "gres",
    "constraint",
    "nice",
    "extra",
    "setup",
    "signal_before",
    "requeue",
    "max_requeues",
    "poll",
    "tier",
    "tiers",
)
#: Largest pipeline file read: 100,000 steps take ~6 MB; more is a wrong file (a log, an
#: image), read whole into memory before anything could say so.
FILE_BYTES_MAX = 64 * 1024 * 1024
#: Upper bounds of counts: far above any real use, low enough that nothing overflows.
RETRIES_MAX = 1000
GPUS_MAX = 1024
PRIORITY_LIMIT = 10**9
#: Linux refuses to exec a command with one argument this long or longer (MAX_ARG_STRLEN,
#: 32 pages; E2BIG, "Argument list too long"), whatever ARG_MAX says for the whole list.
ARG_BYTES_MAX = 32 * 4096
#: What one field may become once its `{{VARS}}` are put in (characters): no command
#: line with its environment (ARG_MAX: 2 MiB with Linux's default stack), path or
#: environment value can use more; so a short placeholder of a long value, repeated, cannot
#: make a small file take gigabytes to read.
RENDERED_FIELD_MAX = max(4 * 1024 * 1024, os.sysconf("SC_ARG_MAX"))
#: ... and every field of one file together: this, or ten characters per character of the
#: file when that is more.
RENDERED_TOTAL_MIN = 256 * 1024 * 1024


def written_absolute(text: str) -> bool:
    """True when the path is absolute as written in the file (before any substitution)."""
    return text.startswith(("/", "~"))


def fixed_prefix(text: str, first_placeholder: int | None) -> str:
    """The folder a written absolute path names before its first `{{X}}` (all of it if none)."""
    if first_placeholder is None:
        return os.path.normpath(os.path.expanduser(text))
    head = text[:first_placeholder]
    folder = head[: head.rfind("/") + 1] or "/"
    return os.path.normpath(os.path.expanduser(folder))


def under(path: str, roots: Sequence[str]) -> bool:
    """True when normalised `path` is one of `roots` or lies inside one (no resolving of
    links: the files may not exist yet at validation)."""
    for root in roots:
        root = os.path.normpath(root)
        if path == root or path.startswith(root.rstrip("/") + "/"):
            return True
    return False


def outside(text: str, rendered: str, path: str, why: str, given: Sequence[tuple[str, str]]) -> str:
    """The problem of a path out of bounds: what `text` became, from which variables'
    values (`given`), and the fix that fits. A path from `--set OUT=/scratch/x` was told
    to write the absolute path in the file, and shown as `'/scratch/x/a' resolves to
    '/scratch/x/a'`."""
    said = repr(rendered[:200])
    if given:
        values = ", ".join(f"{name}={value[:200]!r}" for name, value in given)
        said = f"{text[:200]!r} is {said} ({values})"
    if path != rendered:
        said += f", which resolves to {path[:200]!r}"
    if not given:
        return (
            f"{said}, {why}; write the absolute path in the file or set allow_outside: true"
            " on the step"
        )
    names = " and ".join(name for name, _ in given)
    return (
        f"{said}, {why}; give {names} a value that keeps it there, or set allow_outside:"
        " true on the step to let it point anywhere"
    )
