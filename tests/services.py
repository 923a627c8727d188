"""What every service fixture needs: a free port, waiting for health, and the CI rule.

Under ``CI=true`` a service that cannot start fails the run; elsewhere its tests are
skipped with the reason (a developer box without Slurm, say).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import IO, NoReturn

import pytest


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(reason)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """True once `url` answers 200; False if `proc` exits or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def start_prefect_server(
    home: Path, port: int, env: Mapping[str, str], log: IO[bytes]
) -> subprocess.Popen[bytes]:
    """`prefect server start` on 127.0.0.1:`port`, offline and without its UI."""
    full = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        **env,
    }
    full.pop("PREFECT_API_URL", None)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prefect",
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env=full,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
