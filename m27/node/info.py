"""``$M27_HOME/service.json``: what the running node service says about itself.

The service (:mod:`m27.node.serve`) writes it atomically when it starts, when its Prefect
server is ready and when it restarts that server; every command reads it to find the
service (:mod:`m27.node.service`). It is trusted only while its pid is still the same
process (:func:`m27.liveness.alive` with the pid's start time), so a stale file left by a
killed service, or a forged one, never names a live service.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from m27 import liveness

__all__ = [
    "INFO_NAME",
    "USED_NAME",
    "ServiceInfo",
    "find_service",
    "read_info",
    "remove_info",
    "touch",
    "write_info",
]

INFO_NAME = "service.json"
#: touched by each command that uses the service: activity, for its idle stop
USED_NAME = "service.used"


@dataclass(frozen=True)
class ServiceInfo:
    """What ``service.json`` says about the running node service."""

    pid: int
    pid_started: float | None
    started_at: float
    #: the Prefect API URL runs use (the service's own server or the lab's)
    url: str
    #: True when the service runs its own Prefect server (False: a lab server)
    own_server: bool
    port: int | None = None
    prefect_pid: int | None = None
    #: "starting" until its Prefect server answered, then "ready"
    state: str = "starting"
    restarts: int = 0
    host: str = ""
    #: the agent's GPUs: backend ("sim", "nvml"; "" from an older m27), how many, and a
    #: simulated GPU's memory (0 for NVML), so a command that set M27_GPUS otherwise is told
    gpu_backend: str = ""
    gpu_count: int = 0
    gpu_memory: int = 0

    @property
    def ui_url(self) -> str:
        return self.url.removesuffix("/api")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def write_info(home: Path, info: ServiceInfo) -> None:
    """Replace ``service.json`` atomically: a reader sees the old file or the new one."""
    path = Path(home) / INFO_NAME
    tmp = path.with_name(f".{INFO_NAME}.{os.getpid()}.tmp")
    with tmp.open("w") as fh:
        json.dump(info.to_json(), fh, indent=2)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_info(home: Path) -> ServiceInfo | None:
    """``service.json`` as written, live or not; None when absent, unreadable, or not what
    a service writes. A pid without its start time is never trusted: a stale or forged
    file named an unrelated process (a `sleep`), which `m27 agent stop` then killed."""
    try:
        data = json.loads((Path(home) / INFO_NAME).read_text())
        if not isinstance(data, dict):
            return None
        fields = ServiceInfo.__dataclass_fields__
        info = ServiceInfo(**{k: v for k, v in data.items() if k in fields})
    except (OSError, ValueError, TypeError):
        return None
    return info if _well_formed(info) else None


def _well_formed(info: ServiceInfo) -> bool:
    """Whether each field of `info` has the type a service writes (JSON can hold any)."""

    def whole(value: object, optional: bool = False) -> bool:
        if value is None:
            return optional
        return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**31

    def real(value: object) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool)

    return (
        whole(info.pid)
        and real(info.pid_started)
        and real(info.started_at)
        and isinstance(info.url, str)
        and isinstance(info.own_server, bool)
        and whole(info.port, optional=True)
        and whole(info.prefect_pid, optional=True)
        and isinstance(info.state, str)
        and isinstance(info.restarts, int)
        and isinstance(info.host, str)
        and isinstance(info.gpu_backend, str)
        and isinstance(info.gpu_count, int)
        and isinstance(info.gpu_memory, int)
    )


def remove_info(home: Path, pid: int) -> None:
    """Remove ``service.json`` if it still describes service `pid`."""
    info = read_info(home)
    if info is not None and info.pid == pid:
        with contextlib.suppress(FileNotFoundError):
            (Path(home) / INFO_NAME).unlink()


def find_service(home: Path) -> ServiceInfo | None:
    """The node service described by ``service.json``, if that process still runs."""
    info = read_info(home)
    if info is None or not liveness.alive(info.pid, info.pid_started):
        return None
    return info


def touch(home: Path) -> None:
    """Tell the service a command is about to use it (it counts as activity for idle stop)."""
    path = Path(home) / USED_NAME
    with contextlib.suppress(OSError):
        path.touch()
        os.utime(path)
