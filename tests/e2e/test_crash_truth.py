"""`kill -9` of `m27 run` on a node whose Prefect is a lab server (PREFECT_API_URL): the node
service (agent and crash watcher, no Prefect server of its own) marks the flow run and the
step's task run Crashed (read back through Prefect's REST API), stops the step, even one
that ignores SIGTERM, frees its GPU, and nothing the run started is left after 30 s."""

from __future__ import annotations

import json
import signal
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest

from m27.node.info import find_service
from tests.e2e._helpers import M27, node_state, start_run, wait_running
from tests.waiting import wait_until

pytestmark = [pytest.mark.service, pytest.mark.slow]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


def _task_runs(api: str, flow_run_id: str) -> dict[str, str | None]:
    body = json.dumps({"flow_runs": {"id": {"any_": [flow_run_id]}}}).encode()
    req = urllib.request.Request(
        f"{api}/task_runs/filter", data=body, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return {r["name"]: (r.get("state") or {}).get("type") for r in json.load(resp)}


def _left_over(run_id: str) -> list[int]:
    """Processes that still carry the run's id in their environment (its steps)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("M27_RUN_ID") == run_id:
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def test_kill_9_of_m27_run_crashes_it_in_prefect_and_leaves_nothing_running(
    m27: M27, tmp_path: Path, m27_home: Path, prefect_env: str
) -> None:
    spec = tmp_path / "stubborn.yaml"
    spec.write_text(
        textwrap.dedent("""\
        name: stubborn
        pipeline:
          - name: train
            type: gpu
            shell: true
            command: trap 'echo ignoring TERM' TERM; while true; do sleep 0.2; done
        """)
    )
    proc = start_run(spec)
    try:
        run, step = wait_running(m27_home, "stubborn", "train")
        assert run.flow_run_id and step.pgid
        wait_until(
            lambda: _task_runs(prefect_env, run.flow_run_id).get("train") == "RUNNING",
            timeout=60,
            interval=0.2,
            what="Prefect to show the task run Running",
        )
        service = find_service(m27_home)
        assert service is not None and not service.own_server and service.url == prefect_env
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    wait_until(
        lambda: _get(f"{prefect_env}/flow_runs/{run.flow_run_id}")["state"]["type"] == "CRASHED",
        timeout=120,
        interval=0.2,
        what="the flow run Crashed in Prefect",
    )
    wait_until(
        lambda: _task_runs(prefect_env, run.flow_run_id) == {"train": "CRASHED"},
        timeout=120,
        interval=0.2,
        what="the task run Crashed in Prefect",
    )
    # SIGTERM is ignored: SIGKILL after the grace (10 s), then nothing of the run is left
    wait_until(lambda: not _left_over(run.run_id), timeout=120, what="no process of the run")
    after = node_state(m27_home)
    assert not after.leases and after.runs[run.run_id].status == "failed"
    assert after.runs[run.run_id].steps["train"].reason.startswith("run crashed")
    shown = m27("status", run.run_id)
    assert "crashed" in shown.stdout, shown.stdout
