"""The node service's small decisions: when it counts the node as busy (so it does not stop
for idleness), and which port its Prefect server takes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from m27.cli.commands.worker import keep_in_use
from m27.events import LeaseGranted, RunSubmitted, RunSucceeded
from m27.events.state import fold
from m27.node import info, service
from m27.node.serve import busy
from tests.waiting import wait_until

HOST = socket.gethostname()


def _submitted(run_id: str, pid: int = 4242, host: str = HOST) -> RunSubmitted:
    return RunSubmitted(
        at=1.0, run_id=run_id, pipeline="p", spec_path="p.yaml", steps=("a",), pid=pid, host=host
    )


def test_a_running_run_of_this_host_keeps_the_node_busy_until_it_ends() -> None:
    state = fold([_submitted("r1")])
    assert busy(state, HOST)
    state = fold([RunSucceeded(at=2.0, run_id="r1", duration_s=1.0)], state)
    assert not busy(state, HOST)


def test_runs_without_a_process_here_do_not_count() -> None:
    # an old log's run with no recorded process, and another host's run, never end here
    state = fold([_submitted("old", pid=0), _submitted("far", host="elsewhere")])
    assert not busy(state, HOST)


def test_a_held_lease_counts() -> None:
    state = fold([LeaseGranted(at=1.0, run_id="r1", step="a", gpus=(0,), tier="immediate")])
    assert busy(state, HOST)


def test_a_worker_on_the_nodes_server_keeps_marking_the_service_used(tmp_path: Path) -> None:
    # a worker waiting for scheduled runs has no run or step: without this the service
    # would stop after service_idle and take the Prefect server the worker polls with it
    stop = threading.Event()
    used = tmp_path / info.USED_NAME
    thread = threading.Thread(target=keep_in_use, args=(tmp_path, stop, 0.01), daemon=True)
    thread.start()
    try:
        wait_until(used.exists, timeout=30, what="the service marked used")
        os.utime(used, (1.0, 1.0))
        wait_until(lambda: used.stat().st_mtime > 1.0, timeout=30, what="marked used again")
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_the_prefect_server_keeps_its_port_across_restarts_while_it_is_free(
    tmp_path: Path,
) -> None:
    first = service.node_port(tmp_path)
    assert service.node_port(tmp_path) == first  # the UI's address stays right
    with socket.socket() as taken:  # another program listens there now
        taken.bind(("127.0.0.1", first))
        taken.listen()
        second = service.node_port(tmp_path)
        assert second != first
    assert service.node_port(tmp_path) == second  # the new one is remembered


def _serve_on_a_taken_port(home: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], int]:
    """`m27 agent serve --port P` with another program listening on P, and P."""
    env = {**os.environ, "M27_HOME": str(home), "M27_GPUS": "sim:1", **env}
    env.pop("PREFECT_API_URL", None)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "m27.cli", "agent", "serve", "--port", str(port)],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    return done, port


def test_a_port_in_use_given_with_port_is_refused_by_name(tmp_path: Path) -> None:
    """`m27 agent serve --port P` with another program on P: the service said "the Prefect
    server did not start; see server.log", whose lines were Prefect's ("Invalid host")."""
    done, port = _serve_on_a_taken_port(tmp_path / "home")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"m27 agent: port {port} on 127.0.0.1 is in use; choose another with --port" in (
        done.stdout + done.stderr
    )
    assert not (tmp_path / "home" / "prefect" / "server.log").exists()  # no server tried


def test_the_service_says_which_cores_its_gpu_steps_run_on(tmp_path: Path) -> None:
    """Its first lines name each GPU's share of the cores (gpu_cpus), where an admin
    reading service.log looks. (A port in use ends it before any Prefect server starts.)"""
    from m27.gpu.cpus import core_of, node_cpus, split_cores
    from m27.units import cpu_list

    said = []
    for mode in ("share", "auto"):
        done, _ = _serve_on_a_taken_port(tmp_path / "home", M27_GPUS="sim:2", M27_GPU_CPUS=mode)
        assert done.returncode == 2, done.stdout + done.stderr
        said.append(done.stdout + done.stderr)
    shares = split_cores(node_cpus(), 2, core=core_of)
    line = f"GPU 0: {cpu_list(shares[0])}, GPU 1: {cpu_list(shares[1])}"
    assert f"m27 agent: GPU steps run on their GPUs' cores ({line})" in said[0]
    assert "GPU steps run on" not in said[1]  # auto on simulated GPUs: every core
