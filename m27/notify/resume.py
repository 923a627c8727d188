"""The bot's /resume, when the node allows it (``M27_TELEGRAM_RESUME=1``).

A run that crashed at 3 a.m. is resumed from the phone: the bot runs ``m27 run --resume
RUN --detach`` on the node (:mod:`m27.executors.resume`), the command a person would type,
in the environment and folder the run had; this module words its outcome for the chat.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from m27.executors.resume import RESUME_TIMEOUT_S, start_resume

__all__ = ["RESUME_TIMEOUT_S", "resume_detached"]


def resume_detached(
    run_id: str,
    m27: Sequence[str] = (sys.executable, "-m", "m27.cli"),
    timeout: float = RESUME_TIMEOUT_S,
) -> str:
    """Start `m27 run --resume RUN_ID --detach` in the run's environment; the reply for
    the chat (plain text)."""
    done = start_resume(run_id, m27, timeout)
    note = ""
    if not done.own_environment:
        note = (
            f" It runs in the bot's environment: {run_id} recorded none"
            " (its steps' programs must be on the bot's PATH)."
        )
    if done.run_id is not None:
        state = "it ended already" if done.ended else "it runs"
        return f"Resumed {run_id} as run {done.run_id}: {state} (/status).{note}"
    if done.timed_out:
        return (
            f"The resume of {run_id} was not in the node's log after {timeout:.0f} s; "
            "see /runs, or `m27 runs` on the node."
        )
    if done.code is None:
        return f"Could not start m27 on the node: {done.said}"
    if done.code == 0:  # nothing left to run: the command said why
        return (
            f"Nothing to resume in {run_id}: {done.said}"
            if done.said
            else f"Nothing to resume in {run_id}."
        )
    return f"Could not resume {run_id} (exit {done.code}): {done.said or 'no output'}"
