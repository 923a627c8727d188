"""Small process facts and signals the agent needs: is it alive, stop it, continue it."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def alive(pid: int | None) -> bool:
    """True if `pid` runs (a zombie counts as gone: its step has ended, only unreaped)."""
    if pid is None or pid <= 0:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        return _probe(pid)
    state = stat[stat.rfind(")") + 2 :][:1]
    return state not in ("Z", "X", "")


def _probe(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
