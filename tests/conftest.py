"""Shared fixtures: an isolated M27_HOME per test, and one real Prefect server per session."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Offline machine: Prefect must not try to phone home, in this process or its children.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("M27_GPUS", "sim:2")


@pytest.fixture(autouse=True)
def m27_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own node home: nothing touches ~/.m27."""
    home = tmp_path / "m27home"
    home.mkdir()
    monkeypatch.setenv("M27_HOME", str(home))
    monkeypatch.setenv("M27_CONFIG", str(tmp_path / "no-m2config"))
    return home


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[str]:
    """A real `prefect server start` on SQLite for the whole session; yields its API URL."""
    home = Path(tempfile.mkdtemp(prefix="m27-prefect-"))
    port = _free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home}/prefect.db",
    }
    env.pop("PREFECT_API_URL", None)
    log = (home / "server.log").open("wb")
    proc = subprocess.Popen(
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
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as resp:
                if resp.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            text = (home / "server.log").read_text(errors="replace")[-3000:]
            pytest.fail(f"prefect server did not start:\n{text}")
        time.sleep(0.3)
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def prefect_env(prefect_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """Point this process and its children at the session's Prefect server."""
    monkeypatch.setenv("PREFECT_API_URL", prefect_server)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-client"))
    monkeypatch.setenv("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
    return prefect_server
