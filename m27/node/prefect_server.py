"""The node's own Prefect server: one ``prefect server start`` on SQLite, supervised.

The node service starts it on 127.0.0.1 (a port chosen free by the first command, so it
can say where it will be before it is there), with its database and home under
``$M27_HOME/prefect/`` and its output in ``$M27_HOME/prefect/server.log``. Telemetry is off
(the machines are offline: otherwise tracebacks and "database is locked" noise).

It dies with the service: the child asks the kernel for SIGTERM when its parent thread
ends (Linux ``PR_SET_PDEATHSIG``), so even a ``kill -9`` of the service leaves no uvicorn
behind, and :meth:`PrefectServer.stop` terminates it on a clean stop. When it dies on its
own (the OOM killer, a ``kill -9``), :meth:`PrefectServer.check` starts it again on the
same port, so the URL that runs already use stays right.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from m27.node.reach import healthy

__all__ = ["PrefectServer", "server_env", "terminate"]

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def server_env(prefect_home: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the node's Prefect server: SQLite under `prefect_home`, offline."""
    env = dict(os.environ if base is None else base)
    env.pop("PREFECT_API_URL", None)
    env.update(
        {
            "PREFECT_HOME": str(prefect_home),
            "PREFECT_API_DATABASE_CONNECTION_URL": (
                f"sqlite+aiosqlite:///{prefect_home / 'prefect.db'}"
            ),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "DO_NOT_TRACK": "1",
            # (Prefect's default; said here because the warm runner's runs rely on it and
            # skip fetching a CSRF token: m27.cli.prefect_run.run_settings)
            "PREFECT_SERVER_API_CSRF_PROTECTION_ENABLED": "false",
        }
    )
    env.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "WARNING")
    return env


class PrefectServer:
    """Start, watch and stop one ``prefect server start`` bound to 127.0.0.1:`port`."""

    def __init__(self, prefect_home: Path, port: int, log: Callable[[str], None] = print) -> None:
        self.home = Path(prefect_home)
        self.port = port
        self.url = f"http://127.0.0.1:{port}/api"
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "prefect", "server", "start"]
        argv += ["--host", "127.0.0.1", "--port", str(self.port)]
        with (self.home / "server.log").open("ab") as out:
            self.proc = subprocess.Popen(
                argv,
                env=server_env(self.home),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )

    def wait_healthy(self, timeout: float, stop: Callable[[], bool] = lambda: False) -> bool:
        """True once the API answers; False when the process exits, `stop()`, or timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not stop():
            if healthy(self.url, timeout=1.0):
                return True
            if self.proc is None or self.proc.poll() is not None:
                return False
            time.sleep(0.1)
        return False

    def dead(self) -> bool:
        return self.proc is None or self.proc.poll() is not None

    def restart(self, timeout: float, stop: Callable[[], bool] = lambda: False) -> bool:
        """Start it again on the same port (after it died); True once it answers."""
        code = self.proc.returncode if self.proc is not None else None
        self.restarts += 1
        self.log(f"m27 agent: Prefect server exited (code {code}); restarting it on {self.url}")
        self.start()
        return self.wait_healthy(timeout, stop)

    def stop(self, timeout: float = 20.0) -> None:
        proc, self.proc = self.proc, None
        terminate(proc, timeout)


def terminate(proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    """SIGTERM a supervised child and wait for it; SIGKILL when it outstays `timeout`."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
