"""`m27 run` through the node service's warm runner (m27.cli.warm), driven as a user would.

Once a node service runs, `m27 run` is a thin client and the run is a child forked by the
runner. What users and Prefect see must not change: the exit code, the output on the
client's own stdout, Ctrl-C cancelling, and crash truth when the client is killed -9. And
where the runner cannot run exactly what the client would (other PREFECT_* settings,
--verbose), the run runs in the client's own process as before.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.e2e._helpers import (
    M27,
    as_from_a_terminal,
    call_m27,
    m27_env,
    node_state,
    spawn_m27,
)
from tests.waiting import wait_until

pytestmark = [pytest.mark.service, pytest.mark.slow]

QUICK = "name: quick\npipeline:\n  - name: hello\n    type: cpu\n    command: echo warm-hello\n"


def _runner_pid(home: Path) -> int:
    """The warm runner's pid, once it serves (it imports Prefect first: bounded wait)."""
    info = home / "warm.json"
    wait_until(info.exists, timeout=240, interval=0.2, what="the warm runner serving")
    return int(json.loads(info.read_text())["pid"])


def _start_service(m27: M27, tmp_path: Path, home: Path) -> int:
    spec = tmp_path / "quick.yaml"
    spec.write_text(QUICK)
    first = m27("run", str(spec), "--plain", timeout=600)
    assert first.returncode == 0, first.stderr
    return _runner_pid(home)


def _run_pid(home: Path, run_id: str) -> int:
    return node_state(home).runs[run_id].pid


def _only_run(home: Path, before: set[str]) -> Any:
    runs = [r for r in node_state(home).runs.values() if r.run_id not in before]
    return runs[0] if len(runs) == 1 else None


def test_a_warm_run_forks_from_the_runner_and_keeps_exit_code_and_output(
    m27: M27, tmp_path: Path, m27_home: Path, prefect_env: str
) -> None:
    runner = _start_service(m27, tmp_path, m27_home)
    before = set(node_state(m27_home).runs)
    spec = tmp_path / "two.yaml"
    spec.write_text(
        textwrap.dedent("""\
        name: two
        pipeline:
          - name: ok
            type: cpu
            command: echo first-step-output
          - name: bad
            type: cpu
            depends_on: [ok]
            shell: true
            command: echo failing >&2; exit 3
        """)
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "m27.cli", "run", str(spec), "--plain"],
        env=m27_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, out + err
    assert "first-step-output" in out  # the child wrote to the client's own stdout
    assert "Traceback" not in out + err
    run = _only_run(m27_home, before)
    assert run is not None and run.status == "failed"
    assert run.steps["ok"].status == "succeeded" and run.steps["bad"].status == "failed"
    # the flow ran in a child of the runner, not in the client's process
    assert run.pid not in (0, proc.pid, runner)

    ok = call_m27("run", str(tmp_path / "quick.yaml"), "--plain", timeout=300)
    assert ok.returncode == 0 and "warm-hello" in ok.stdout, ok.stdout + ok.stderr


def _prefect_end(api: str, flow_run_id: str) -> tuple[str | None, list[str]]:
    """(the flow run's state type, its artifact keys), read over Prefect's REST API."""
    import httpx

    fr = httpx.get(f"{api}/flow_runs/{flow_run_id}", timeout=10).json()
    arts = httpx.post(
        f"{api}/artifacts/filter",
        json={"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}},
        timeout=10,
    ).json()
    return (fr.get("state") or {}).get("type"), [a.get("key") for a in arts]


def test_the_client_goes_once_the_run_has_ended_and_the_child_finishes_prefects_part(
    m27: M27, tmp_path: Path, m27_home: Path, prefect_env: str
) -> None:
    """The client exits when the run's end is in the log and its summary printed; the child
    then sets the flow run's final state and creates the summary artifact. The client's
    going must not kill the child (as a killed client does): the flow run ends Completed."""
    _start_service(m27, tmp_path, m27_home)
    before = set(node_state(m27_home).runs)
    done = call_m27("run", str(tmp_path / "quick.yaml"), "--plain", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    run = _only_run(m27_home, before)
    assert f"run {run.run_id}: succeeded" in done.stdout  # the summary reached the client
    assert "Traceback" not in done.stdout + done.stderr
    ended: list[tuple[str | None, list[str]]] = []

    def finished() -> bool:
        ended.append(_prefect_end(prefect_env, run.flow_run_id))
        return ended[-1][0] not in (None, "RUNNING", "PENDING")

    wait_until(finished, timeout=60, interval=0.2, what="the flow run's final state")
    assert ended[-1][0] == "COMPLETED", ended[-1]
    assert "m27-run-quick" in ended[-1][1]
    wait_until(lambda: not psutil.pid_exists(run.pid), timeout=60, what="the child's exit")
    assert node_state(m27_home).runs[run.run_id].status == "succeeded"


def test_other_prefect_settings_or_verbose_run_in_the_clients_own_process(
    m27: M27, tmp_path: Path, m27_home: Path, prefect_env: str
) -> None:
    _start_service(m27, tmp_path, m27_home)
    spec = tmp_path / "quick.yaml"
    for extra_env, extra_args in (({"PREFECT_CLIENT_MAX_RETRIES": "7"}, []), ({}, ["--verbose"])):
        before = set(node_state(m27_home).runs)
        proc = subprocess.Popen(
            [sys.executable, "-m", "m27.cli", "run", str(spec), "--plain", *extra_args],
            env={**m27_env(), **extra_env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
        run = _only_run(m27_home, before)
        assert run is not None and run.pid == proc.pid, (extra_env, extra_args)


def _serving(home: Path) -> int | None:
    """The pid in warm.json, or None while there is none (or it is being written)."""
    try:
        return int(json.loads((home / "warm.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def _run_quick(tmp_path: Path, home: Path) -> tuple[int, int]:
    """(the client's pid, the pid the run's flow ran in) of one `m27 run` of QUICK."""
    before = set(node_state(home).runs)
    proc = subprocess.Popen(
        [sys.executable, "-m", "m27.cli", "run", str(tmp_path / "quick.yaml"), "--plain"],
        env=m27_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "warm-hello" in out, out
    run = _only_run(home, before)
    assert run is not None
    return proc.pid, run.pid


def test_a_runner_whose_m27_changed_on_disk_hands_runs_back_and_is_replaced(
    m27: M27, tmp_path: Path, m27_home: Path, prefect_env: str
) -> None:
    """After `pip install -U m27` (or an edit of a checkout) the runner must not go on
    running the code it imported: runs ran the old m27 until the service stopped."""
    import m27.cli._stale as imported_by_the_runner

    runner = _start_service(m27, tmp_path, m27_home)
    changed = Path(imported_by_the_runner.__file__)
    changed.touch()  # what an upgrade or an edit does to the file (the content is kept)
    client, flow = _run_quick(tmp_path, m27_home)
    assert flow == client  # refused by the runner: the run ran in the client's own process
    wait_until(lambda: not psutil.pid_exists(runner), timeout=60, what="the stale runner gone")
    # the node service starts a new runner (on the code as it is now), and runs fork again
    wait_until(lambda: _serving(m27_home) not in (None, runner), timeout=240, what="a new runner")
    client, flow = _run_quick(tmp_path, m27_home)
    assert flow not in (client, runner)


LONG = "name: long\npipeline:\n  - name: wait\n    type: cpu\n    command: sleep 300\n"


def _long_run(m27: M27, tmp_path: Path, home: Path) -> tuple[subprocess.Popen[str], Any, Any]:
    """A warm `m27 run` of one `sleep 300` step, once the step runs: (client, run, step)."""
    _start_service(m27, tmp_path, home)
    before = set(node_state(home).runs)
    spec = tmp_path / "long.yaml"
    spec.write_text(LONG)
    proc = spawn_m27("run", str(spec), "--plain", preexec_fn=as_from_a_terminal)

    def step_running() -> Any:
        run = _only_run(home, before)
        step = run.steps.get("wait") if run is not None else None
        return (run, step) if step is not None and step.status == "running" else None

    try:
        run, step = wait_until(step_running, timeout=240, interval=0.2, what="the step running")
    except BaseException:
        proc.kill()
        raise
    assert run.pid != proc.pid  # forked by the runner
    return proc, run, step


def test_ctrl_c_reaches_the_forked_run_and_cancels_it(
    m27: M27, tmp_path: Path, m27_home: Path, prefect_env: str
) -> None:
    proc, run, step = _long_run(m27, tmp_path, m27_home)
    try:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out
    assert "cancelling" in out and "Traceback" not in out
    assert node_state(m27_home).runs[run.run_id].status == "cancelled"
    wait_until(lambda: not psutil.pid_exists(step.pid), timeout=60, what="the step stopped")


def test_kill_9_of_the_forked_run_ends_the_client_the_same_way_and_says_so(
    m27: M27, tmp_path: Path, m27_home: Path, prefect_env: str
) -> None:
    """The client re-raised the run's SIGKILL on itself through signal.signal(SIGKILL),
    which Python refuses: a traceback (OSError: Invalid argument) and exit 1."""
    proc, run, step = _long_run(m27, tmp_path, m27_home)
    try:
        os.kill(run.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)  # stderr is merged into it
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL, out
    assert "Traceback" not in out, out
    assert "m27: the run's process was killed (SIGKILL)" in out
    assert f"`m27 run --resume {run.run_id}` goes on from it" in out
    wait_until(lambda: not psutil.pid_exists(step.pid), timeout=60, what="the step stopped")


def test_kill_9_of_the_client_kills_the_forked_run_and_the_service_closes_it(
    m27: M27, tmp_path: Path, m27_home: Path, prefect_env: str
) -> None:
    proc, run, step = _long_run(m27, tmp_path, m27_home)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    wait_until(lambda: not psutil.pid_exists(run.pid), timeout=30, what="the forked run gone")
    wait_until(
        lambda: node_state(m27_home).runs[run.run_id].status == "failed",
        timeout=60,
        interval=0.2,
        what="the run recorded crashed",
    )
    wait_until(lambda: not psutil.pid_exists(step.pid), timeout=60, what="the step stopped")
    after = node_state(m27_home)
    assert not after.leases and after.runs[run.run_id].crashed
    # Whichever sees the death first ends the step: the crash watcher closing the run
    # (`run crashed: ...`) or the agent finding the lease's process and requester gone
    # (`lost: ...`); on a loaded machine either may.
    reason = after.runs[run.run_id].steps["wait"].reason
    assert reason.startswith(("run crashed", "lost: its process and its requester")), reason
