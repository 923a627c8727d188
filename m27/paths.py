"""Names that become path parts, and the one way m27 joins them under a root.

Step names, run ids and pipeline names end up in paths: ``checkpoints/<run>/<step>``,
``runs/<run>/<step>.log``, ``channels/<run>/<step>.chan``, Slurm attempt folders. A name
such as ``..`` or ``a/b`` would put one run's files into another's (a fresh run restoring
another run's checkpoint), so two guards stand in the way:

- the spec accepts only names in :data:`NAME_PATTERN` (letters, digits, ``.``, ``_``,
  ``-``; a letter or digit first, so never ``.`` or ``..``; at most :data:`NAME_MAX`
  characters, which leaves room for suffixes within any filesystem's 255-byte limit);
- every path built from a name goes through :func:`join_under`, which refuses a part that
  is not one plain path component and checks that the result stays under its root,
  raising :class:`~m27._exceptions.PathError` otherwise.
"""

from __future__ import annotations

import errno
import glob
import os
import pwd
import re
import stat
from collections.abc import Mapping
from pathlib import Path

from m27._exceptions import ConfigError, PathError

__all__ = [
    "NAME_MAX",
    "NAME_PATTERN",
    "PART_MAX_BYTES",
    "config_path",
    "is_pattern",
    "join_under",
    "m27_home",
    "matches",
    "name_problem",
    "not_a_file",
    "same_file",
    "slug",
    "user_home",
]

#: Longest step (or pipeline) name; `.slurm`, `.chan` or `.log` suffixes still fit in 255.
NAME_MAX = 64
#: The documented character set of a step name (docs/pipelines.md, "Names").
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
#: The byte limit of one path component on Linux filesystems (ext4, xfs, tmpfs).
PART_MAX_BYTES = 255

_NAME = re.compile(NAME_PATTERN + r"\Z")
_SLUG_BAD = re.compile(r"[^a-z0-9-]+")


def name_problem(name: str) -> str | None:
    """Why `name` cannot be a step name, or None when it can."""
    if not name:
        return "must not be empty"
    if len(name) > NAME_MAX:
        return f"is {len(name)} characters long; at most {NAME_MAX} are allowed"
    if not _NAME.match(name):
        return (
            "may hold only ASCII letters, digits, '.', '_' and '-', and must start with a "
            f"letter or digit (pattern {NAME_PATTERN})"
        )
    return None


def not_a_file(path: str | os.PathLike[str]) -> str | None:
    """What `path` is when it is not a regular file: ``"a folder"``, ``"a pipe"`` or ``"a
    device or a socket"``; None for a regular file or one that cannot be looked at (opening
    it then says why). A reader asks first because opening a pipe waits for a writer and
    ``/dev/zero`` never ends: both hung m27 instead of saying what was wrong."""
    try:
        mode = os.stat(path).st_mode  # follows links, as open() does
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    return "a pipe" if stat.S_ISFIFO(mode) else "a device or a socket"


def not_runnable(path: str | os.PathLike[str], name: str | None = None) -> str | None:
    """Why the file at `path` (`name` in the command) cannot be started as a program, or
    None when it can (or is not there: a missing program is said otherwise). A shell runs
    a script that has no ``#!`` line with /bin/sh; a step's program is started as it is,
    without a shell, so such a script failed `Exec format error`, and a file without its
    execute bit `permission denied`, neither saying what to do."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    name = name or os.fspath(path)
    if stat.S_ISDIR(st.st_mode):
        return "it is a folder, not a program"
    if not stat.S_ISREG(st.st_mode):
        return None
    if not os.access(path, os.X_OK):
        return f"it is not executable (`chmod +x {name}`, or run it with its interpreter)"
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return None
    if head[:2] == b"#!" or head == b"\x7fELF":
        return None
    return (
        "it has no #! line, so it cannot be started as a program (a shell would run it "
        f"with /bin/sh): put `#!/bin/sh` (or its interpreter) first, or write `sh {name}`"
    )


_PATTERN = re.compile(r"[*?[]")


def is_pattern(path: str) -> bool:
    """Whether `path` holds glob syntax (`*`, `?`, `[...]`), as :mod:`glob` reads it."""
    return _PATTERN.search(path) is not None


def matches(path: str | os.PathLike[str]) -> list[str]:
    """`path` if it exists; for a path with `*`, `?` or `[...]` that does not exist as
    written, what matches it (`**` spans folders), sorted. A declared output is there when
    this is not empty (the runner checks a step's outputs, a resume what is left of them)."""
    if os.path.exists(path):
        return [os.fspath(path)]
    if not is_pattern(os.fspath(path)):
        return []
    return sorted(glob.glob(os.fspath(path), recursive=True))


def same_file(path: str | os.PathLike[str], other: str | os.PathLike[str] | None) -> bool:
    """Whether two paths name one existing file (links and `..` resolved by the kernel)."""
    try:
        return other is not None and str(other) != "" and os.path.samefile(path, other)
    except OSError:
        return False


def slug(text: str) -> str:
    """`text` in lowercase letters, digits and single dashes (Prefect artifact keys)."""
    return re.sub(r"-{2,}", "-", _SLUG_BAD.sub("-", text.lower())).strip("-")


def join_under(root: str | os.PathLike[str], *parts: str) -> Path:
    """``root/part/...``, guaranteed to stay inside `root`; raises PathError otherwise.

    Each part must be one plain component: not empty, not ``.`` or ``..``, no ``/``, no
    NUL, at most 255 bytes; the normalised result must then still lie under the root.
    Symbolic links are not resolved on purpose: a site may well put
    ``$M27_HOME/checkpoints`` on another disk through a link, and a name alone can no
    longer climb out of its folder.
    """
    base = Path(root)
    path = base
    for part in parts:
        reason = _part_problem(part)
        if reason:
            raise PathError(
                f"cannot use {part!r} as a path part under {str(base)!r}: {reason}",
                root=str(base),
                part=part,
            )
        path = path / part
    root_text = os.path.normpath(os.path.abspath(base))
    joined = os.path.normpath(os.path.abspath(path))
    if joined != root_text and not joined.startswith(root_text.rstrip(os.sep) + os.sep):
        raise PathError(  # pragma: no cover - the part checks above already exclude this
            f"{str(path)!r} is {joined!r}, outside {root_text!r}",
            root=str(base),
            part="/".join(parts),
        )
    return path


def _part_problem(part: str) -> str | None:
    if not isinstance(part, str) or not part:
        return "it is empty"
    if part in (".", ".."):
        return "it names a folder itself, not a child"
    if "\0" in part:
        return "it holds a NUL byte"
    if "/" in part or os.sep in part:
        return "it holds a path separator"
    try:
        size = len(part.encode("utf-8"))
    except UnicodeEncodeError:
        return "it is not representable as UTF-8"
    if size > PART_MAX_BYTES:
        return f"it is {size} bytes long; a file name holds at most {PART_MAX_BYTES}"
    return None


# -- where m27's own files are (here, not in m27.config: the warm client needs only this) --


def m27_home(env: Mapping[str, str] | None = None) -> Path:
    """The node's home: ``$M27_HOME``, default ``~/.m27`` (not created here)."""
    return _path_from_env(env, "M27_HOME", ".m27")


def make_home(env: Mapping[str, str] | None = None) -> Path:
    """The node's home, created when missing; ConfigError (exit 2) naming M27_HOME when it
    cannot be, so that a command stops there and not in whichever file it writes first."""
    home = m27_home(env)
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(home_problem(home, exc), file=str(home)) from exc
    return home


def home_problem(home: Path | str, exc: OSError) -> str:
    """The one line for a home m27 cannot create or write."""
    why = exc.strerror or str(exc)
    if exc.errno == errno.EEXIST:  # not "File exists": something that is no folder is there
        why = f"it is {not_a_file(home) or 'a file'}"
    return (
        f"cannot create {home}: {why} "
        "(m27's home, for its event log and locks: set M27_HOME to a folder m27 can write)"
    )


def config_path(env: Mapping[str, str] | None = None) -> Path:
    """The settings file: ``$M27_CONFIG``, default ``~/.m2config``."""
    return _path_from_env(env, "M27_CONFIG", ".m2config")


def user_home(env: Mapping[str, str]) -> Path:
    """``$HOME`` of `env` when set and not empty, else the account's home directory from the
    password database (``Path.home()`` would give ``/`` for an empty ``HOME``, and m27's home
    would become ``/.m27``)."""
    home = env.get("HOME")
    if home:
        return Path(home)
    try:
        return Path(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:  # an account without an entry (a container's arbitrary uid)
        return Path.home()


def _path_from_env(env: Mapping[str, str] | None, name: str, default: str) -> Path:
    """``$name`` (``~`` expanded) when set and not empty, else ``default`` in the user's home."""
    env = os.environ if env is None else env
    value = env.get(name)
    if value:
        return Path(value).expanduser()
    return user_home(env) / default
