"""A lab in one box for the scale tests: PostgreSQL, `prefect server` on it, m27 workers.

PostgreSQL comes from ``infra/scripts/start-postgres.sh`` (which apt-get installs it on a
bare CI machine). When the services cannot start, a local run skips; ``CI=true`` fails.
The server is started once per session (cached here, so a second importer reuses it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.services import free_port, start_prefect_server, unavailable, wait_http

ROOT = Path(__file__).resolve().parents[2]
START_PG = ROOT / "infra" / "scripts" / "start-postgres.sh"

T = TypeVar("T")

#: The scale tests' pipeline: one CPU step that sleeps SECONDS.
SLEEPER = """\
name: sleeper
vars:
  SECONDS: "1"
pipeline:
  - name: work
    type: cpu
    command: sleep {{SECONDS}}
"""


@dataclass
class Lab:
    """The session's Prefect server on PostgreSQL."""

    api_url: str
    db_url: str
    base: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def client_env(self, **extra: str) -> dict[str, str]:
        env = {
            **os.environ,
            "PREFECT_API_URL": self.api_url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "DO_NOT_TRACK": "1",
            "PREFECT_LOGGING_LEVEL": "INFO",
            "PYTHONPATH": str(ROOT),
        }
        env.update(extra)
        return env


_LAB: Lab | None = None


def _start_lab() -> Lab:
    if not START_PG.exists():
        unavailable("infra/scripts/start-postgres.sh is missing")
    base = Path(tempfile.mkdtemp(prefix="m27-scale-"))
    base.chmod(0o755)
    pg_port = free_port()
    try:
        out = subprocess.run(
            ["bash", str(START_PG), str(base / "pg"), str(pg_port)],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        unavailable(f"PostgreSQL did not start: {exc}")
    if out.returncode != 0:
        unavailable(f"PostgreSQL did not start: {out.stderr[-2000:]}")
    db_url = out.stdout.strip().splitlines()[-1]
    port = free_port()
    env = {
        "PREFECT_API_DATABASE_CONNECTION_URL": db_url,
        "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2",
        "PREFECT_SERVER_SERVICES_SCHEDULER_RECENT_DEPLOYMENTS_LOOP_SECONDS": "1",
        "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
        "PYTHONPATH": str(ROOT),
    }
    log = (base / "server.log").open("wb")
    proc = start_prefect_server(base / "prefect-server", port, env, log)
    lab = Lab(f"http://127.0.0.1:{port}/api", db_url, base, [proc])
    if wait_http(f"{lab.api_url}/health", proc, timeout=600):
        return lab
    _stop_lab(lab)
    unavailable(
        "prefect server on PostgreSQL did not start: "
        + (base / "server.log").read_text(errors="replace")[-2000:]
    )


def _stop_lab(lab: Lab) -> None:
    for proc in lab.procs:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    subprocess.run(["bash", str(START_PG), "--stop", str(lab.base / "pg")], check=False)
    shutil.rmtree(lab.base, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_prefect() -> Iterator[Lab]:
    """PostgreSQL + `prefect server start` for the session; yields the Lab."""
    global _LAB
    if _LAB is None:
        _LAB = _start_lab()
        started = True
    else:
        started = False
    try:
        yield _LAB
    finally:
        if started:
            _stop_lab(_LAB)
            _LAB = None


def start_worker(
    lab: Lab, node: str, home: Path, *, via_prefect_cli: bool = False, gpus: str = "sim:1"
) -> subprocess.Popen[bytes]:
    """An m27 worker standing for node `node` (its own M27_HOME and simulated GPUs)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "no-m2config").write_text("")  # an empty settings file (a missing one is an error)
    env = lab.client_env(
        M27_HOME=str(home),
        M27_NODE=node,
        M27_GPUS=gpus,
        M27_CPU_SLOTS="1",
        M27_CONFIG=str(home / "no-m2config"),
        PREFECT_HOME=str(home / "prefect"),
        PREFECT_WORKER_QUERY_SECONDS="1",
        PREFECT_WORKER_PREFETCH_SECONDS="1",
        PREFECT_WORKER_HEARTBEAT_SECONDS="5",
    )
    if via_prefect_cli:
        argv = [
            sys.executable,
            "-m",
            "prefect",
            "worker",
            "start",
            "--pool",
            "m27",
            "--type",
            "m27",
            "--name",
            f"m27-{node}",
        ]
    else:
        argv = [sys.executable, "-m", "m27.cli.commands.worker", "--node", node]
    log = (home / "worker.log").open("ab")
    proc = subprocess.Popen(
        argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    lab.procs.append(proc)
    return proc


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


def tail(path: Path, n: int = 3000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else "(no file)"


def sync_client(lab: Lab) -> Any:
    from prefect.client.orchestration import SyncPrefectClient

    return SyncPrefectClient(lab.api_url)
