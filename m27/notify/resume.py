"""The bot's /resume, when the node allows it (``M27_TELEGRAM_RESUME=1``).

A run that crashed at 3 a.m. is resumed from the phone: the bot runs ``m27 run --resume
RUN --detach`` on the node, the command a person would type, so the resume is checked
exactly as at a terminal (a run still running, a pipeline file that is gone or now
broken, nothing left to run) and outlives the bot's request. It runs in the environment
and folder the run had (:mod:`m27.executors.environ`: the PATH of its `module load`, its
`OMP_NUM_THREADS`), not the bot's, which systemd started with none of them; a run that
recorded none (from before m27 kept it) gets the bot's, and the reply says so.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from m27._exceptions import M27Error
from m27.config import m27_home
from m27.executors import environ

__all__ = ["RESUME_TIMEOUT_S", "resume_detached"]

#: How long /resume waits for the run to be in the node's log (the node service may start).
RESUME_TIMEOUT_S = 300.0
#: What `m27 run --detach` prints once its run is in the log: its id (stdout), and this.
_RUN_ID = re.compile(r"[\w.-]+")
_ENDED = re.compile(r"^run \S+ ended already", re.MULTILINE)
#: The last lines of a failed resume's output that the reply quotes.
_SHOWN_LINES = 6


def resume_detached(
    run_id: str,
    m27: Sequence[str] = (sys.executable, "-m", "m27.cli"),
    timeout: float = RESUME_TIMEOUT_S,
) -> str:
    """Start `m27 run --resume RUN_ID --detach` in the run's environment; the reply for
    the chat (plain text)."""
    env, cwd, note = _run_environment(run_id, os.environ)
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
        return (
            f"The resume of {run_id} was not in the node's log after {timeout:.0f} s; "
            "see /runs, or `m27 runs` on the node."
        )
    except OSError as exc:
        return f"Could not start m27 on the node: {exc.strerror or exc}"
    said = _last_lines(done.stderr)
    new = done.stdout.strip()
    if done.returncode == 0 and _RUN_ID.fullmatch(new):
        state = "it ended already" if _ENDED.search(done.stderr) else "it runs"
        return f"Resumed {run_id} as run {new}: {state} (/status).{note}"
    if done.returncode == 0:  # nothing left to run: the command said why
        return (
            f"Nothing to resume in {run_id}: {said}" if said else f"Nothing to resume in {run_id}."
        )
    return f"Could not resume {run_id} (exit {done.returncode}): {said or 'no output'}"


def _last_lines(text: str) -> str:
    lines = [line.removeprefix("m27: ") for line in text.splitlines() if line.strip()]
    return "\n".join(lines[-_SHOWN_LINES:])


def _run_environment(
    run_id: str, current: Mapping[str, str]
) -> tuple[dict[str, str], str | None, str]:
    """The environment and folder to resume `run_id` in, and a note for the reply when
    they are not the run's own (the bot's are used then)."""
    try:
        run = environ.recorded(m27_home(current), run_id)
    except M27Error:  # an id that is no run's (`../x`): the command says what is wrong
        run = None
    if run is None:
        return (
            dict(current),
            None,
            (
                f" It runs in the bot's environment: {run_id} recorded none"
                " (its steps' programs must be on the bot's PATH)."
            ),
        )
    cwd = run.cwd if Path(run.cwd).is_dir() else None
    return environ.for_resume(run, current), cwd, ""
