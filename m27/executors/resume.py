"""Resume a run in the background as a person would: ``m27 run --resume RUN --detach``.

Two callers resume a run that is not theirs: the Telegram bot's /resume (a person on a
phone) and the node service for a pipeline with ``on_crash: resume``. Both run the command
a person would type, so the resume is checked exactly as at a terminal (a run still
running, a pipeline file that is gone or now broken, nothing left to run) and outlives the
caller's request. It runs in the environment and folder the run had
(:mod:`m27.executors.environ`: the PATH of its `module load`, its `OMP_NUM_THREADS`), not
the caller's, which systemd started with none of them; a run that recorded none (from
before m27 kept it) gets the caller's, and :attr:`Resumed.own_environment` says so.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from m27._exceptions import M27Error
from m27.config import m27_home
from m27.executors import environ

__all__ = ["RESUME_TIMEOUT_S", "Resumed", "run_environment", "start_resume"]

#: How long a resume waits for the run to be in the node's log (the node service may start).
RESUME_TIMEOUT_S = 300.0
#: What `m27 run --detach` prints once its run is in the log: its id (stdout), and this.
_RUN_ID = re.compile(r"[\w.-]+")
_ENDED = re.compile(r"^run \S+ ended already", re.MULTILINE)
#: The last lines of the command's output kept in :attr:`Resumed.said`.
_SAID_LINES = 6


@dataclass(frozen=True)
class Resumed:
    """How `m27 run --resume RUN --detach` went."""

    #: the new run's id; None when none started (nothing left to run, or a refusal)
    run_id: str | None
    #: its exit code; None when it did not start or did not finish within the timeout
    code: int | None
    #: its last lines of output, without `m27: ` (why, when no run started), or why m27
    #: could not be started
    said: str
    #: the new run ended as it started (every step was left done)
    ended: bool = False
    #: False when the run recorded no environment and the caller's was used
    own_environment: bool = True
    #: the new run was not in the node's log within the timeout (it may still come)
    timed_out: bool = False


def start_resume(
    run_id: str,
    m27: Sequence[str] = (sys.executable, "-m", "m27.cli"),
    timeout: float = RESUME_TIMEOUT_S,
    current: Mapping[str, str] | None = None,
) -> Resumed:
    """Start `m27 run --resume RUN_ID --detach` in the run's environment and folder; wait
    (at most `timeout`) until the new run is in the node's log or the command refused."""
    env, cwd, own = run_environment(run_id, os.environ if current is None else current)
    try:
        done = subprocess.run(
            [*m27, "run", f"--resume={run_id}", "--detach"],  # (an id "-x" stays an id)
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return Resumed(None, None, "", own_environment=own, timed_out=True)
    except OSError as exc:
        return Resumed(None, None, str(exc.strerror or exc), own_environment=own)
    said = _last_lines(done.stderr)
    new = done.stdout.strip()
    if done.returncode == 0 and _RUN_ID.fullmatch(new):
        return Resumed(new, 0, said, bool(_ENDED.search(done.stderr)), own)
    return Resumed(None, done.returncode, said, own_environment=own)


def _last_lines(text: str) -> str:
    lines = [line.removeprefix("m27: ") for line in text.splitlines() if line.strip()]
    return "\n".join(lines[-_SAID_LINES:])


def run_environment(
    run_id: str, current: Mapping[str, str]
) -> tuple[dict[str, str], str | None, bool]:
    """The environment and folder to resume `run_id` in, and whether they are the run's
    own (False: `current` is used, the run recorded none)."""
    try:
        run = environ.recorded(m27_home(current), run_id)
    except M27Error:  # an id that is no run's (`../x`): the command says what is wrong
        run = None
    if run is None:
        return dict(current), None, False
    cwd = run.cwd if Path(run.cwd).is_dir() else None
    return environ.for_resume(run, current), cwd, True
