"""Finding, starting and stopping the node service: what every `m27` command calls.

The node service (:mod:`m27.node.serve`) is one long-lived process per node: the agent,
the crash watcher and, unless ``PREFECT_API_URL`` names a lab server, one supervised
``prefect server start``. It describes itself in ``$M27_HOME/service.json``
(:mod:`m27.node.info`), where a command finds it.

With none running, :func:`ensure_service` starts one detached (its own session, output to
``$M27_HOME/service.log``) so it outlives the command, and waits (bounded) until it is
ready, printing what it waits for. Concurrent first starts take turns on the flock of
``$M27_HOME/service.lock``: the first starts the service, the others find it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING
from urllib.parse import urlsplit

from m27 import liveness
from m27._exceptions import ConfigError, M27Error
from m27.gpu import parse_gpus_env
from m27.node.info import ServiceInfo, find_service, touch
from m27.node.reach import healthy
from m27.units import format_size

if TYPE_CHECKING:
    import subprocess

__all__ = [
    "can_listen",
    "ensure_service",
    "free_port",
    "lab_url",
    "node_port",
    "same_server",
    "stop_service",
]

LOCK_NAME = "service.lock"
LOG_NAME = "service.log"
#: The port the node's Prefect server had last (see `node_port`).
PORT_NAME = "prefect/port"

#: How long a command waits for a service it started (a loaded 2-core machine with 16
#: runs importing Prefect at once needs far more than the usual 8-15 s).
START_TIMEOUT_S = 240.0


def lab_url(env: Mapping[str, str] | None = None) -> str | None:
    """The lab's Prefect server (``PREFECT_API_URL``), or None: the node runs its own."""
    env = os.environ if env is None else env
    return env.get("PREFECT_API_URL") or None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_port(home: Path) -> int:
    """The port for this node's Prefect server: the one it had last time while nothing
    listens there (the UI's address, a bookmark and an exported PREFECT_API_URL stay right
    across restarts and idle stops), else a free one; remembered in ``prefect/port``."""
    path = Path(home) / PORT_NAME
    try:
        last = int(path.read_text())
    except (OSError, ValueError):
        last = 0
    if 0 < last < 65536 and can_listen(last):
        return last
    port = free_port()
    with contextlib.suppress(OSError):  # not remembered: the next start picks another
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{port}\n")
    return port


def can_listen(port: int) -> bool:
    """Whether a server could listen on 127.0.0.1:`port` now (with SO_REUSEADDR, as
    uvicorn binds: a port in TIME_WAIT after the last server stopped is still usable)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ready(info: ServiceInfo | None) -> bool:
    if info is None or info.state != "ready":
        return False
    return healthy(info.url) if info.own_server else True


@contextlib.contextmanager
def _start_lock(home: Path, wait: Callable[[], None]) -> Iterator[bool]:
    """Hold ``service.lock``; yields False (without it) once someone else made it ready."""
    path = Path(home) / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if _ready(find_service(home)):
                    yield False
                    return
                wait()
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class _Progress:
    """`starting the node service (...)... Ns` on stderr: redrawn on a terminal, a line
    every few seconds otherwise."""

    def __init__(self, stream: IO[str] | None) -> None:
        self.stream = stream
        self.t0 = time.monotonic()
        self._shown = -1.0
        self.tty = bool(stream is not None and stream.isatty())

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def show(self, what: str) -> None:
        if self.stream is None:
            return
        now = self.elapsed()
        every = 0.5 if self.tty else 5.0
        if self._shown >= 0 and now - self._shown < every:
            return
        self._shown = now
        text = f"starting the node service ({what})... {now:.0f}s"
        if self.tty:
            self.stream.write(f"\r{text}")
        else:
            self.stream.write(f"{text}\n")
        self.stream.flush()

    def done(self, info: ServiceInfo) -> None:
        if self.stream is None or self._shown < 0:
            return
        end = "\n" if self.tty else ""
        self.stream.write(f"{end}node service ready after {self.elapsed():.1f}s: {info.url}\n")
        self.stream.flush()


def _what(info: ServiceInfo | None, port: int | None, lab: str | None) -> str:
    if lab:
        return f"agent for the Prefect server at {lab}"
    port = info.port if info is not None and info.port else port
    return f"Prefect server on 127.0.0.1:{port}" if port else "Prefect server on 127.0.0.1"


def ensure_service(
    home: Path,
    *,
    stream: IO[str] | None = sys.stderr,
    timeout: float = START_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
) -> tuple[ServiceInfo, float]:
    """The running node service, started (detached) first when none runs.

    Returns it with the seconds this call waited for it (0 when it was already running).
    Raises M27Error naming ``service.log`` when it does not come up within `timeout`, and
    ConfigError when the caller's ``PREFECT_API_URL`` names another server than the running
    service uses, or its ``M27_GPUS`` other GPUs than the service's agent has.
    """
    env = dict(os.environ if env is None else env)
    try:
        info, waited = _ensure(Path(home), stream, timeout, env)
    except OSError as exc:  # a full disk, a read-only home: say so, no traceback
        raise M27Error(f"cannot start the node service in {home}: {exc}", home=str(home)) from exc
    _check_server(info, lab_url(env))
    _check_gpus(info, env.get("M27_GPUS", ""))
    return info, waited


def _check_gpus(info: ServiceInfo, value: str) -> None:
    """A caller whose M27_GPUS names other GPUs than the running service's agent has: a
    ConfigError (its steps would wait for, or be checked against, GPUs the agent lacks)."""
    wanted = value.strip().lower()
    if wanted in ("", "auto") or not info.gpu_backend:
        return  # the node's own GPUs, whatever they are (or a service that does not say)
    if wanted == "nvml":
        same = info.gpu_backend == "nvml"
    else:
        count, memory = parse_gpus_env(value)
        same = (info.gpu_backend, info.gpu_count, info.gpu_memory) == ("sim", count, memory)
    if same:
        return
    has = (
        f"{info.gpu_count} simulated GPU(s) of {format_size(info.gpu_memory)}"
        if info.gpu_backend == "sim"
        else f"{info.gpu_count} {info.gpu_backend} GPU(s)"
    )
    raise ConfigError(
        f"M27_GPUS is {value}, but this node's service (pid {info.pid}) has {has}; a run's "
        "steps take the service's GPUs. Unset M27_GPUS to use them, or stop the service "
        "(`m27 agent stop`, when no run is left) so that the next command starts it with "
        "M27_GPUS's",
        variable="M27_GPUS",
        value=value,
    )


def _check_server(info: ServiceInfo, lab: str | None) -> None:
    """A caller whose PREFECT_API_URL names another server than the running service's: a
    ConfigError, not a run sent quietly to the service's server (nor one sent to a server
    whose killed runs the service's crash watcher could not mark Crashed)."""
    if lab is None or same_server(lab, info.url):
        return
    whose = "its own Prefect server" if info.own_server else "the Prefect server it started with"
    raise ConfigError(
        f"PREFECT_API_URL is {lab}, but this node's service (pid {info.pid}) uses {info.url}, "
        f"{whose}; a run goes to the service's server, where its crash watcher keeps the run's "
        "state true. Unset PREFECT_API_URL to use that server, or stop the service "
        "(`m27 agent stop`, when no run is left) so that the next command starts it with "
        "PREFECT_API_URL's",
        prefect_api_url=lab,
        service_url=info.url,
    )


def same_server(a: str, b: str) -> bool:
    """Whether two Prefect API URLs name one server (``localhost`` is ``127.0.0.1``; a
    trailing ``/`` and the default port do not count)."""

    def key(url: str) -> tuple[str, str, int | None, str]:
        parts = urlsplit(url.strip())
        host = (parts.hostname or "").lower()
        host = "127.0.0.1" if host in ("localhost", "::1") else host
        try:
            port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
        except ValueError:
            port = None
        return parts.scheme.lower(), host, port, parts.path.rstrip("/")

    return key(a) == key(b)


def _ensure(
    home: Path, stream: IO[str] | None, timeout: float, env: dict[str, str]
) -> tuple[ServiceInfo, float]:
    home.mkdir(parents=True, exist_ok=True)
    lab = lab_url(env)
    touch(home)
    info = find_service(home)
    if _ready(info):
        assert info is not None
        return info, 0.0
    progress = _Progress(stream)

    def wait() -> None:
        progress.show(_what(find_service(home), None, lab))
        time.sleep(0.2)

    with _start_lock(home, wait) as mine:
        if mine:
            info = find_service(home)
            if info is None:
                port = None if lab else node_port(home)
                child = _spawn(home, port, env)
                info = _wait_ready(home, child, port, lab, progress, timeout)
            else:  # a service is coming up (or restarting its Prefect server): wait for it
                info = _wait_ready(home, None, info.port, lab, progress, timeout)
    info = find_service(home)
    if info is None or not _ready(info):
        info = _wait_ready(home, None, None, lab, progress, timeout)
    progress.done(info)
    touch(home)
    return info, progress.elapsed()


def _spawn(home: Path, port: int | None, env: dict[str, str]) -> subprocess.Popen[bytes]:
    import subprocess

    argv = [sys.executable, "-m", "m27.cli", "agent", "--on-demand"]
    if port is not None:
        argv += ["--port", str(port)]
    with (home / LOG_NAME).open("ab") as log:
        return subprocess.Popen(
            argv,
            env={**env, "M27_HOME": str(home)},
            cwd=home,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )


def _wait_ready(
    home: Path,
    child: subprocess.Popen[bytes] | None,
    port: int | None,
    lab: str | None,
    progress: _Progress,
    timeout: float,
) -> ServiceInfo:
    deadline = time.monotonic() + timeout
    while True:
        info = find_service(home)
        if _ready(info) and (child is None or info is None or info.pid == child.pid):
            assert info is not None
            return info
        if child is not None and child.poll() is not None:
            raise M27Error(
                f"the node service exited with code {child.returncode} before it was ready; "
                f"see {home / LOG_NAME}:\n{_tail(home / LOG_NAME)}",
                log=str(home / LOG_NAME),
            )
        if child is None and info is None and find_service(home) is None and progress.elapsed() > 5:
            # the service we waited for died: the caller's next try starts a new one
            raise M27Error(
                f"the node service stopped while starting; see {home / LOG_NAME}:\n"
                f"{_tail(home / LOG_NAME)}",
                log=str(home / LOG_NAME),
            )
        if time.monotonic() > deadline:
            raise M27Error(
                f"the node service was not ready after {timeout:.0f}s; see {home / LOG_NAME}",
                log=str(home / LOG_NAME),
            )
        progress.show(_what(info, port, lab))
        time.sleep(0.1)


def _tail(path: Path, lines: int = 8) -> str:
    """The log's last lines that say something (no traceback frames: they are in the log)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    said = [
        line
        for line in text.splitlines()
        if line.strip() and not line.startswith((" ", "\t", "Traceback", "starting the node"))
    ]
    return "\n".join(said[-lines:])


def stop_service(home: Path, timeout: float = 60.0) -> ServiceInfo | None:
    """SIGTERM the running service and wait (bounded) until it is gone; what was stopped."""
    import signal

    info = find_service(home)
    if info is None:
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(info.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while liveness.alive(info.pid, info.pid_started):
        if time.monotonic() > deadline:
            raise M27Error(
                f"the node service (pid {info.pid}) did not stop within {timeout:.0f}s",
                pid=info.pid,
            )
        time.sleep(0.1)
    return info
