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

Start times survive a stepped wall clock. On Linux psutil's ``create_time`` is the process's
start tick since boot plus the kernel's boot time, and the kernel moves that boot time
whenever the wall clock is stepped (NTP or chrony correcting a VM's clock, a resume from
suspend): a step of 10 s made every recorded process look like a stranger, so the node
service declared live runs crashed and stopped their steps. :func:`start_time` adds the
start tick to this boot's time as the first m27 process of the boot read it, kept in a small
file named after the kernel's boot id (:data:`ANCHOR_DIR`), so every process of the boot gets
the same value for the same process however the clock moves later, and a process of another
boot (after a power cut) never matches. Where that file cannot be kept (no ``/dev/shm``, not
Linux), the value is psutil's as it is.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil

#: How far a start time read now may differ from the recorded one for the same process.
#: Both come from the same start tick (1/100 s) and boot anchor; a pid reused within a
#: second is rare.
START_TOLERANCE_S = 1.0

#: Where the boot anchor lives: a tmpfs every process of the machine sees, emptied at boot.
ANCHOR_DIR = Path("/dev/shm")

#: boot id -> anchor, or None once it could not be read or kept (not tried on every check)
_ANCHOR: dict[str, float | None] = {}


_BOOT_ID: list[str | None] = []


def _boot_id() -> str | None:
    """The kernel's id of this boot (read once: a process lives in one boot), None where
    there is none (not Linux)."""
    if not _BOOT_ID:
        boot: str | None = None
        if sys.platform.startswith("linux"):
            try:
                path = os.path.join(psutil.PROCFS_PATH, "sys/kernel/random/boot_id")
                with open(path) as f:
                    boot = f.read().strip() or None
            except OSError:
                pass
        _BOOT_ID.append(boot)
    return _BOOT_ID[0]


def _boot_anchor() -> float | None:
    """This boot's start (epoch seconds) as the first m27 process of the boot read it: the
    same in every process of the boot, unmoved by later clock steps. None when no anchor can
    be read or kept."""
    boot = _boot_id()
    if boot is None:
        return None
    if boot in _ANCHOR:
        return _ANCHOR[boot]
    path = ANCHOR_DIR / f"m27-boot-{boot}"
    try:
        if not path.exists():
            # written whole under a private name, then linked: a reader never sees it half
            # written, and of two first processes one links and the other reads its value
            tmp = ANCHOR_DIR / f".m27-boot-{boot}.{os.getpid()}"
            tmp.write_text(f"{psutil.boot_time()!r}\n")
            tmp.chmod(0o644)  # every user's m27 reads the same anchor
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
        anchor: float | None = float(path.read_text())
    except (OSError, ValueError):
        anchor = None
    _ANCHOR[boot] = anchor
    return anchor


def _started(proc: psutil.Process) -> float:
    """`proc`'s start time on the boot anchor's clock (see the module's docstring)."""
    if (anchor := _boot_anchor()) is None:
        return float(proc.create_time())
    while True:  # the start tick since boot: create_time less the boot time it added
        boot = psutil.boot_time()
        since_boot = proc.create_time() - boot
        if psutil.boot_time() == boot:  # no clock step between the reads
            return anchor + since_boot


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
        return _started(psutil.Process(pid))
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
            if started is not None and abs(_started(proc) - started) > START_TOLERANCE_S:
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
