"""Signals the agent sends to a step's process group: stop it, continue it.

Whether a process is alive is :mod:`m27.liveness` (one helper for every package).
"""

from __future__ import annotations

import os
import signal


def signal_group(pgid: int | None, pid: int | None, sig: int) -> bool:
    """Send `sig` to the step's process group (its pid when the group is unknown); False
    when it is gone."""
    target = pgid or pid
    if not target or target <= 0:
        return False
    try:
        os.killpg(target, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def stop(pgid: int | None, pid: int | None) -> bool:
    return signal_group(pgid, pid, signal.SIGSTOP)


def cont(pgid: int | None, pid: int | None) -> bool:
    return signal_group(pgid, pid, signal.SIGCONT)
