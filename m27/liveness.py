"""Is a recorded process still the one we recorded? Process liveness for every m27 package.

The log records pids (the flow process of a run, a step's process, a lease requester, an
m27 worker) and later asks whether they still run. A pid alone cannot answer that: the
kernel hands a freed pid to the next process, so after a crash a stranger could look like
the step. A pid together with its start time (:func:`start_time`, psutil's
``create_time``) does identify one process: a reused pid has a later start time, and
:func:`alive` treats it as gone.

Why a top-level module: its users sit at every level of the dependency direction (the
node agent and crash truth in ``m27.node``, the simulated GPU backend in ``m27.gpu``, the
executors, the CLI). Only a leaf module, importing nothing from m27, can serve them all
without pointing a dependency upwards. psutil does the platform work (Linux ``/proc``,
macOS ``sysctl``) so m27 parses no ``/proc/<pid>/stat`` of its own.

A zombie (exited, not yet reaped) counts as gone: its work has ended, only its parent has
not collected the exit status.
"""

from __future__ import annotations

import os

import psutil

#: How far a start time read now may differ from the recorded one for the same process.
#: psutil derives it from the boot time and the process's start tick (1/100 s), and the
#: boot time moves when the wall clock is stepped; a pid reused within a second is rare.
START_TOLERANCE_S = 1.0

#: :func:`status` values of a process stopped by a signal (SIGSTOP, a tracer).
STOPPED = frozenset({psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP})

_GONE = frozenset({psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD})


def start_time(pid: int | None) -> float | None:
    """When `pid` started (epoch seconds), None when it does not run or cannot be read.

    Record it beside a pid so a later :func:`alive` can tell the process from a stranger
    that got the same pid.
    """
    if pid is None or pid <= 0:
        return None
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


_OWN: dict[int, float | None] = {}


def own_start_time() -> float | None:
    """This process's start time, read once per pid (a forked child reads its own)."""
    pid = os.getpid()
    if pid not in _OWN:
        _OWN[pid] = start_time(pid)
    return _OWN[pid]


def status(pid: int | None, started: float | None = None) -> str | None:
    """psutil's status of `pid` ("running", "sleeping", "stopped", ...), None when gone.

    Gone means: no such pid, a zombie, or (with `started`) a different process that reuses
    the pid. A process we may not inspect (another user's) reports "running".
    """
    if pid is None or pid <= 0 or not psutil.pid_exists(pid):
        return None
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            state = str(proc.status())
            if state in _GONE:
                return None
            if started is not None and abs(proc.create_time() - started) > START_TOLERANCE_S:
                return None
            return state
    except psutil.NoSuchProcess:
        return None
    except (psutil.AccessDenied, OSError):
        return psutil.STATUS_RUNNING  # it exists; we may not look inside


def alive(pid: int | None, started: float | None = None) -> bool:
    """True while `pid` runs and is not a zombie; with `started` (its recorded
    :func:`start_time`), only while it is still that same process."""
    return status(pid, started) is not None
