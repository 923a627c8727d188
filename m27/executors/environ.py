"""The environment a run's steps got, kept so a resume started elsewhere gets it again.

A step inherits the environment of the `m27 run` that started it: the PATH a `source
GMXRC` or `module load cp2k` set, `OMP_NUM_THREADS`, a `WANDB_API_KEY`. A resume typed at
a terminal gets that terminal's, as a person expects; a resume started from Telegram at
3 a.m. ran with the bot's, started by systemd with none of them, and failed with
`gmx: command not found`. So each run writes its environment and working folder to
``$M27_HOME/runs/<run>/environ.json`` (mode 0600: it may hold secrets, as a Slurm
job's saved environment does), and `/resume` runs the resume in them.

Where the node's log and servers are is the node's, not the run's: ``M27_HOME``,
``PREFECT_*`` and the bot's own ``M27_TELEGRAM_*`` come from the process that resumes.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from m27.paths import join_under

__all__ = ["ENVIRON_NAME", "Recorded", "for_resume", "record", "recorded"]

ENVIRON_NAME = "environ.json"
#: Variables the resuming process sets, not the recorded run: where the log and servers are.
NODE_PREFIXES = ("PREFECT_", "M27_TELEGRAM_")
NODE_NAMES = frozenset({"M27_HOME"})


@dataclass(frozen=True)
class Recorded:
    """A run's environment and working folder, as its `m27 run` had them."""

    env: dict[str, str]
    cwd: str


def _path(home: Path, run_id: str) -> Path:
    return join_under(home, "runs", run_id, ENVIRON_NAME)


def _is_node(name: str) -> bool:
    return name in NODE_NAMES or name.startswith(NODE_PREFIXES)


def record(home: Path, run_id: str, env: Mapping[str, str] | None = None) -> bool:
    """Write the run's environment (default: this process's) and working folder; False
    when it cannot be written (a full disk): the run goes on, and a resume from Telegram
    says it used its own environment instead."""
    env = os.environ if env is None else env
    path = _path(home, run_id)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:  # (getcwd fails in a folder deleted since: then nothing is kept)
        body = {"cwd": os.getcwd(), "env": {k: v for k, v in env.items() if not _is_node(k)}}
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(body, f)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False
    return True


def recorded(home: Path, run_id: str) -> Recorded | None:
    """What :func:`record` wrote for `run_id`; None when it wrote nothing readable (a run
    from before m27 kept it, another user's run, a torn or edited file)."""
    try:
        body = json.loads(_path(home, run_id).read_text(encoding="utf-8"))
        env, cwd = body["env"], body["cwd"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(env, dict) or not isinstance(cwd, str):
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        return None
    return Recorded(env=env, cwd=cwd)


def for_resume(run: Recorded, current: Mapping[str, str]) -> dict[str, str]:
    """The environment to resume `run` in: its own, with the node's settings (log, Prefect
    server, the bot's) taken from `current`."""
    env = {k: v for k, v in run.env.items() if not _is_node(k)}
    env.update({k: v for k, v in current.items() if _is_node(k)})
    return env
