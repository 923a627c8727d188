"""Shared fixtures: an isolated M27_HOME per test, and one real Prefect server per session."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services import free_port, start_prefect_server, wait_http
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]

# Offline machine: Prefect must not try to phone home, in this process or its children.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("M27_GPUS", "sim:2")


#: the threads a flow run in the test process leaves behind (Prefect's log and events clients)
PREFECT_WORKERS = frozenset({"APILogWorkerThread", "EventsWorkerThread"})


@pytest.fixture(scope="module", autouse=True)
def _prefect_workers_drained() -> Iterator[None]:
    """After each module, stop the workers a flow run in this process left, as Prefect's
    own test harness does. The events client keeps a websocket whose keepalive pings draw
    from the global `random` every ten seconds for the rest of the session; Hypothesis
    reads any change of that state during a draw as a strategy using `random`, and a
    property test later in the session failed by chance."""
    yield
    if not PREFECT_WORKERS & {t.name for t in threading.enumerate()}:
        return
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=30)
    EventsWorker.drain_all(timeout=30)
    wait_until(
        lambda: not PREFECT_WORKERS & {t.name for t in threading.enumerate()},
        timeout=30, what="Prefect's log and events workers to stop",
    )  # fmt: skip


@pytest.fixture(autouse=True)
def m27_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every test gets its own node home: nothing touches ~/.m27."""
    home = tmp_path / "m27home"
    home.mkdir()
    monkeypatch.setenv("M27_HOME", str(home))
    empty = tmp_path / "no-m2config"  # an empty settings file: the user's is not read
    empty.write_text("")
    monkeypatch.setenv("M27_CONFIG", str(empty))
    yield home
    _stop_node_service(home)
    _stop_embedded_agent()


def _stop_embedded_agent() -> None:
    """Stop an agent a test's flow left embedded in this process (a flow stopped midway).

    Left running, its thread outlives the test's home and, at the session's end, logs
    "cannot write the GPU snapshot" into pytest's closed output.
    """
    from m27.node.embed import running_embedded

    agent = running_embedded()
    if agent is not None:
        agent.stop()


def _stop_node_service(home: Path) -> None:
    """The node service an `m27` command of the test started (detached) ends with the test."""
    from m27.node.info import find_service
    from m27.node.service import stop_service

    info = find_service(home)
    if info is None:
        return
    try:
        stop_service(home, timeout=30)
    except Exception:
        os.kill(info.pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[str]:
    """A real `prefect server start` on SQLite for the whole session; yields its API URL."""
    home = Path(tempfile.mkdtemp(prefix="m27-prefect-"))
    port = free_port()
    log = (home / "server.log").open("wb")
    db = f"sqlite+aiosqlite:///{home}/prefect.db"
    proc = start_prefect_server(home, port, {"PREFECT_API_DATABASE_CONNECTION_URL": db}, log)
    url = f"http://127.0.0.1:{port}/api"
    # A bound for a broken start, not a speed claim: on a loaded 2-core box it takes minutes.
    if not wait_http(f"{url}/health", proc, timeout=600):
        proc.kill()
        text = (home / "server.log").read_text(errors="replace")[-3000:]
        pytest.fail(f"prefect server did not start:\n{text}")
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
