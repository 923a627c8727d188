"""A lab's Prefect server that goes down during a run (a restart, a crash).

The run goes on (m27's event log is the truth), `m27 run` prints its summary when the run
ends and exits within END_GRACE_S with the run's exit code and one line saying Prefect has
not been told; once the server answers again, the node service tells it how the run ended.
Before, `m27 run` kept retrying for minutes after the run's end, printing Prefect's
tracebacks, and then died with one of its own, without a summary.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from m27.events.state import RunState
from tests.e2e._helpers import (
    gated_script,
    node_state,
    prefect_flow_run_state,
    prefect_task_states,
    spawn_m27,
)
from tests.services import free_port, start_prefect_server, wait_http
from tests.waiting import wait_until

pytestmark = [pytest.mark.service, pytest.mark.slow]

PIPELINE = """\
name: outlasts
pipeline:
  - name: wait
    type: cpu
    command: python wait.py
  - name: after
    type: cpu
    depends_on: [wait]
    command: python -c "print('after')"
"""


class _Server:
    """A Prefect server on a fixed port and database, to stop and start again."""

    def __init__(self, home: Path) -> None:
        self.home, self.port = home, free_port()
        self.url = f"http://127.0.0.1:{self.port}/api"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        db = f"sqlite+aiosqlite:///{self.home}/prefect.db"
        with (self.home / "server.log").open("ab") as log:
            self.proc = start_prefect_server(
                self.home, self.port, {"PREFECT_API_DATABASE_CONNECTION_URL": db}, log
            )
        if not wait_http(f"{self.url}/health", self.proc, timeout=600):
            pytest.fail((self.home / "server.log").read_text(errors="replace")[-3000:])

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[_Server]:
    home = tmp_path / "prefect-server"
    home.mkdir()
    srv = _Server(home)
    srv.start()
    try:
        yield srv
    finally:
        srv.kill()


def test_a_run_outlives_its_prefect_server_and_prefect_learns_its_end_later(
    tmp_path: Path, m27_home: Path, server: _Server
) -> None:
    spec = tmp_path / "p.yaml"
    spec.write_text(PIPELINE)
    gated_script(tmp_path / "wait.py")
    env = {
        "PREFECT_API_URL": server.url,
        "PREFECT_HOME": str(tmp_path / "prefect-client"),
        "M27_WARM": "0",  # the run in `m27 run`'s own process: the one the user waits for
    }
    proc = spawn_m27("run", str(spec), "--plain", cwd=tmp_path, env=env, stderr_apart=True)
    try:

        def running() -> RunState | None:
            assert proc.poll() is None, proc.communicate()
            return next(
                (r for r in node_state(m27_home).runs.values() if r.steps["wait"].pid), None
            )

        run = wait_until(running, timeout=240, interval=0.2, what="the step running")
        server.kill()
        (tmp_path / "go").touch()
        out, err = proc.communicate(timeout=240)  # END_GRACE_S, not Prefect's retries
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert f"run {run.run_id}: succeeded" in out
    assert "Traceback" not in err, err
    assert f"m27: Prefect's server at {server.url} " in err
    assert "the node service tells it how the run ended once it answers" in err
    assert node_state(m27_home).runs[run.run_id].status == "succeeded"

    assert run.flow_run_id is not None
    flow_run_id = run.flow_run_id

    def explain() -> str:  # what a failure on a CI machine is understood from
        service_log = (m27_home / "service.log").read_text(errors="replace")[-3000:]
        return f"task runs: {prefect_task_states(server.url, flow_run_id)}\n{service_log}"

    server.start()  # back: the node service's settle pass gives Prefect the log's end
    wait_until(
        lambda: prefect_flow_run_state(server.url, flow_run_id) == "COMPLETED",
        timeout=120,
        interval=0.5,
        what="Prefect showing the flow run Completed",
        explain=explain,
    )
    # `after` started while the server was down: its task run is made with its end (a
    # while after the settle; a bound for a broken service, not a speed claim: one call
    # to a server that has just restarted can wait out Prefect's 60 s request timeout)
    wait_until(
        lambda: (
            prefect_task_states(server.url, flow_run_id)
            == {"wait": "COMPLETED", "after": "COMPLETED"}
        ),
        timeout=240,
        interval=0.5,
        what="Prefect listing both steps' task runs Completed",
        explain=explain,
    )
