"""The node service with its own Prefect server: started on demand by the first `m27 run`,
shared by the next command, its Prefect server restarted after kill -9, a killed run
Crashed in Prefect with nothing of it left running, and `m27 agent stop`.

One service start costs 8-45 s on a loaded 2-core machine, so the first test walks the
whole life of one service; the others use lab mode (PREFECT_API_URL: no Prefect server)
where a start costs about a second.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from m27 import ConfigError, liveness
from m27.events import AgentStarted, RunSubmitted
from m27.node.info import find_service, read_info
from m27.node.reach import healthy
from m27.node.service import ensure_service
from m27.store.sqlite import SqliteEventStore
from tests.e2e._helpers import (
    call_m27,
    group_alive,
    m27_env,
    node_state,
    start_run,
    wait_running,
)
from tests.waiting import wait_until

pytestmark = [pytest.mark.service, pytest.mark.slow]


def _api(url: str, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        f"{url}/{path}",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


def _flow_run_state(url: str, flow_run_id: str) -> str:
    with urllib.request.urlopen(f"{url}/flow_runs/{flow_run_id}", timeout=10) as resp:
        return str(json.load(resp)["state"]["type"])


def _task_run_states(url: str, flow_run_id: str) -> dict[str, str | None]:
    runs = _api(url, "task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}})
    return {r["name"]: (r.get("state") or {}).get("type") for r in runs}


#: a one-step pipeline that does nothing: what a run needs when the run itself is not tested
QUICK = "name: quick\npipeline:\n  - name: t\n    type: cpu\n    command: 'true'\n"


def _pipeline(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(body))
    return path


@pytest.mark.timeout(900)
def test_one_service_from_first_run_to_stop(
    m27_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    quick = _pipeline(tmp_path, "quick", QUICK)
    # 1. the first run starts the service, says what it waits for, and succeeds
    first = call_m27("run", str(quick), "--plain", timeout=400)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "starting the node service (Prefect server on 127.0.0.1:" in first.stderr
    assert "starting the node service" in first.stdout + first.stderr
    assert "Traceback" not in first.stdout + first.stderr
    assert "s starting the node service)" in first.stdout  # the wait, reported apart
    info = find_service(m27_home)
    assert info is not None and info.own_server and info.state == "ready"
    assert info.url == f"http://127.0.0.1:{info.port}/api" and healthy(info.url)
    assert (m27_home / "prefect" / "prefect.db").exists()
    # its uvicorn runs on uvloop and httptools (dependencies: a quarter less CPU per run)
    assert info.prefect_pid is not None
    maps = Path(f"/proc/{info.prefect_pid}/maps").read_text()
    assert "/uvloop/" in maps and "/httptools/" in maps

    # 2. the next command shares it: no second start, same service
    second = call_m27("run", str(quick), "--plain", timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "starting the node service" not in second.stderr
    assert find_service(m27_home) == info
    status = call_m27("agent", "status", "--json")
    data = json.loads(status.stdout)
    assert data["pid"] == info.pid and data["prefect_url"] == info.url
    assert data["runs_served"] == 2
    assert data["log"] == str(m27_home / "service.log")  # where what it did is said

    # 2b. lab commands without PREFECT_API_URL use this server: one GPU server keeps its
    # deployments (and schedules) there, and its `m27 worker` runs them
    note = f"using this node's Prefect server {info.url}"
    made = call_m27("deploy", str(quick), "--name", "quick-now")
    assert made.returncode == 0 and note in made.stderr, made.stdout + made.stderr
    assert f"PREFECT_API_URL={info.url} prefect deployment run" in made.stdout
    assert made.stdout.rstrip().endswith("polls pool m27: `m27 worker`")
    # to another pool, the worker it names polls that pool (a plain one would never run it)
    other = call_m27("deploy", str(quick), "--name", "quick-b", "--pool", "lab-b")
    assert other.returncode == 0, other.stdout + other.stderr
    assert other.stdout.rstrip().endswith("polls pool lab-b: `m27 worker --pool lab-b`")
    with urllib.request.urlopen(f"{info.url}/deployments/name/m27-pipeline/quick-now") as resp:
        deployment = json.load(resp)
    flow_run = _api(info.url, f"deployments/{deployment['id']}/create_flow_run", {})
    worker = call_m27("worker", "--run-once", timeout=400)
    assert worker.returncode == 0 and note in worker.stderr, worker.stdout + worker.stderr
    assert _flow_run_state(info.url, flow_run["id"]) == "COMPLETED"
    assert find_service(m27_home) == info  # the same service: none started for the worker

    # 3. kill -9 of its Prefect server: restarted on the same URL
    assert info.prefect_pid is not None
    os.kill(info.prefect_pid, signal.SIGKILL)

    def restarted() -> bool:
        now = read_info(m27_home)
        return bool(now and now.restarts == 1 and now.state == "ready" and healthy(now.url))

    wait_until(restarted, timeout=240, interval=0.5, what="the Prefect server restarted")
    after = read_info(m27_home)
    assert after is not None and after.url == info.url and after.prefect_pid != info.prefect_pid

    # 4. kill -9 of `m27 run` mid-step: Crashed in Prefect, the step's process gone
    slow = _pipeline(
        tmp_path,
        "slow",
        """\
        name: slow
        pipeline:
          - name: sim
            type: gpu
            command: sleep 600
        """,
    )
    proc = start_run(slow)
    run, step = wait_running(m27_home, "slow", "sim")
    assert run.flow_run_id and step.pgid
    wait_until(
        lambda: _task_run_states(info.url, run.flow_run_id).get("sim") == "RUNNING",
        timeout=60,
        interval=0.2,
        what="Prefect to show the step's task run Running",
    )
    proc.kill()
    proc.wait(30)
    crashed = wait_until(
        lambda: _flow_run_state(info.url, run.flow_run_id) == "CRASHED",
        timeout=30,
        interval=0.2,
        what="the flow run Crashed in Prefect",
    )
    assert crashed
    wait_until(
        lambda: _task_run_states(info.url, run.flow_run_id) == {"sim": "CRASHED"},
        timeout=30,
        interval=0.2,
        what="the step's task run Crashed in Prefect",
    )
    wait_until(lambda: not group_alive(step.pgid), timeout=30, what="the step's processes gone")
    shown = call_m27("status", run.run_id)
    assert "crashed" in shown.stdout and " running " not in shown.stdout, shown.stdout
    assert not node_state(m27_home).leases  # its GPU is free again

    # 5. cancelled after the crash: Cancelled in Prefect too
    cancel = call_m27("cancel", run.run_id)
    assert cancel.returncode == 0, cancel.stderr
    assert _flow_run_state(info.url, run.flow_run_id) == "CANCELLED"

    # 6. `m27 agent stop` during a run: the service and its Prefect server are gone; the
    # run goes on and succeeds, but cannot tell Prefect
    short = _pipeline(
        tmp_path,
        "short",
        "name: short\npipeline:\n  - {name: sim, type: gpu, command: sleep 6}\n",
    )
    proc = start_run(short)
    short_run, _ = wait_running(m27_home, "short", "sim")
    stop = call_m27("agent", "stop", timeout=120)
    assert stop.returncode == 0, stop.stderr
    assert f"1 run still running ({short_run.run_id}) goes on without it" in stop.stdout
    assert find_service(m27_home) is None and not (m27_home / "service.json").exists()
    current = after.prefect_pid
    assert current is not None
    wait_until(lambda: not liveness.alive(current), timeout=30, what="the Prefect server gone")
    assert proc.wait(120) == 0
    assert node_state(m27_home).runs[short_run.run_id].status == "succeeded"

    # 7. the next service settles it: Prefect shows the run Completed, not Running forever
    third = call_m27("run", str(quick), "--plain", timeout=400)
    assert third.returncode == 0, third.stdout + third.stderr
    again = find_service(m27_home)
    assert again is not None and again.url == info.url
    wait_until(
        lambda: _flow_run_state(again.url, short_run.flow_run_id) == "COMPLETED",
        timeout=60,
        interval=0.5,
        what="the flow run that ended while Prefect was down shown Completed",
    )
    assert _task_run_states(again.url, short_run.flow_run_id) == {"sim": "COMPLETED"}
    # the crashed-then-cancelled run of step 5 keeps its end
    assert _flow_run_state(again.url, run.flow_run_id) == "CANCELLED"
    assert call_m27("agent", "stop", timeout=120).returncode == 0


def _lab_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lab mode with a server nobody asks (no run is started): no Prefect server to wait
    for, so a service start costs about a second."""
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")


def test_concurrent_first_starts_start_one_service(
    m27_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _lab_env(monkeypatch)
    code = (
        "import sys; from m27.node.service import ensure_service; "
        "print(ensure_service(sys.argv[1])[0].pid)"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(m27_home)],
            env=m27_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    pids = {out.strip() for out, _ in outs}
    assert len(pids) == 1, outs
    store = SqliteEventStore(m27_home / "events.db")
    try:
        started = [r.event for r in store.read() if isinstance(r.event, AgentStarted)]
    finally:
        store.close()
    assert [e.pid for e in started] == [int(p) for p in pids]  # one agent, one service
    info = find_service(m27_home)
    assert info is not None and str(info.pid) in pids and not info.own_server


def test_a_service_whose_event_log_is_deleted_stops_and_the_next_command_starts_anew(
    m27_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # it went on recording into the deleted file: a new run waited for a CPU slot forever,
    # `m27 queue` did not know its step, and `m27 agent status` said "ready"
    _lab_env(monkeypatch)
    first, _ = ensure_service(m27_home)
    for name in ("events.db", "events.db-wal", "events.db-shm"):
        (m27_home / name).unlink(missing_ok=True)
    wait_until(
        lambda: not liveness.alive(first.pid, first.pid_started),
        timeout=60,
        what="the service stopped",
    )
    said = (m27_home / "service.log").read_text()
    assert f"the event log {m27_home / 'events.db'} was removed; stopping the service" in said
    second, _ = ensure_service(m27_home)  # on the log that is there now
    assert second.pid != first.pid
    store = SqliteEventStore(m27_home / "events.db")
    try:
        started = [r.event for r in store.read() if isinstance(r.event, AgentStarted)]
    finally:
        store.close()
    assert [e.pid for e in started] == [second.pid]


def test_an_on_demand_service_stops_itself_when_idle(
    m27_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _lab_env(monkeypatch)
    monkeypatch.setenv("M27_SERVICE_IDLE", "2s")
    proc = subprocess.Popen(
        [sys.executable, "-m", "m27.cli", "agent", "--on-demand"],
        env=m27_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "idle for 2s (no runs, no steps); stopping" in out
    assert out.rstrip().endswith("m27 agent: stopped")
    assert not (m27_home / "service.json").exists()


def test_a_run_that_died_with_no_service_is_closed_when_the_next_command_starts_it(
    m27_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _lab_env(monkeypatch)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a flow process that is gone, as after kill -9 with no service running
    store = SqliteEventStore(m27_home / "events.db")
    try:
        store.append(
            [
                RunSubmitted(
                    at=1.0,
                    run_id="20261201-120000-dead",
                    pipeline="p",
                    spec_path="p.yaml",
                    steps=("a",),
                    pid=dead.pid,
                    host=socket.gethostname(),
                )
            ]
        )
    finally:
        store.close()
    shown = call_m27("status", "20261201-120000-dead", timeout=240)
    assert "crashed" in shown.stdout, shown.stdout + shown.stderr
    assert find_service(m27_home) is not None  # status needed crash truth: it started it
    wait_until(
        lambda: node_state(m27_home).runs["20261201-120000-dead"].reason.startswith("crashed"),
        timeout=60,
        what="the crash watcher closing the run",
    )


def _refused_run(tmp_path: Path, m27_home: Path) -> subprocess.CompletedProcess[str]:
    """`m27 run` of a one-step pipeline that must be refused (exit 2, no traceback) before
    the run is recorded."""
    quick = _pipeline(tmp_path, "quick", QUICK)
    done = call_m27("run", str(quick), "--plain", timeout=240)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert node_state(m27_home).runs == {}
    return done


def test_a_prefect_api_url_other_than_the_services_is_refused_not_ignored(
    m27_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run must not go quietly to another server than the one PREFECT_API_URL names."""
    _lab_env(monkeypatch)  # the service runs with http://127.0.0.1:9/api
    info, _ = ensure_service(m27_home, stream=None, env=m27_env())
    # the same server, written another way: accepted, and no second service
    assert (
        ensure_service(m27_home, stream=None, env={"PREFECT_API_URL": "http://localhost:9/api/"})[0]
        == info
    )
    with pytest.raises(ConfigError) as caught:
        ensure_service(m27_home, stream=None, env={"PREFECT_API_URL": "http://127.0.0.1:10/api"})
    assert caught.value.context == {
        "prefect_api_url": "http://127.0.0.1:10/api",
        "service_url": "http://127.0.0.1:9/api",
    }
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:10/api")
    done = _refused_run(tmp_path, m27_home)
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(
        "m27: PREFECT_API_URL is http://127.0.0.1:10/api, but this node's service"
    )
    assert f"(pid {info.pid}) uses http://127.0.0.1:9/api" in line and "m27 agent stop" in line


def test_m27_gpus_other_than_the_services_is_refused_not_ignored(
    m27_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's GPUs are the service's: a command that set M27_GPUS otherwise is told."""
    _lab_env(monkeypatch)
    monkeypatch.setenv("M27_GPUS", "sim:2")
    info, _ = ensure_service(m27_home, stream=None, env=m27_env())
    assert (info.gpu_backend, info.gpu_count, info.gpu_memory) == ("sim", 2, 80 * 2**30)
    lab = {"PREFECT_API_URL": "http://127.0.0.1:9/api"}
    for same in ("sim:2", "SIM:2x80GiB", "auto", ""):
        assert ensure_service(m27_home, stream=None, env={**lab, "M27_GPUS": same})[0] == info
    for other in ("sim:3", "sim:2x16GiB", "nvml"):
        with pytest.raises(ConfigError, match=f"M27_GPUS is {other}, but this node's service"):
            ensure_service(m27_home, stream=None, env={**lab, "M27_GPUS": other})
    monkeypatch.setenv("M27_GPUS", "sim:3")
    done = _refused_run(tmp_path, m27_home)
    assert done.stderr.strip().splitlines()[-1] == (
        f"m27: M27_GPUS is sim:3, but this node's service (pid {info.pid}) has 2 simulated "
        "GPU(s) of 80.0GiB; a run's steps take the service's GPUs. Unset M27_GPUS to use "
        "them, or stop the service (`m27 agent stop`, when no run is left) so that the next "
        "command starts it with M27_GPUS's"
    )
