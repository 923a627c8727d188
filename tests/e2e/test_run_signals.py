"""`m27 run` stopped by a signal from outside its terminal: SIGTERM (`kill`, systemd, a
batch system's stop before its KILL) or SIGHUP (the terminal closed).

Both cancel the run as `m27 cancel` does: the steps get TERM and their grace, the run ends
cancelled (resumable), and Prefect shows Cancelled. Before, Prefect's engine turned SIGTERM
into a crash and the process waited for its steps to end by themselves (a 30 s step ran
its 30 s, then the run was recorded crashed with every step succeeded); SIGHUP killed the
process at once and left its steps running.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e._helpers import (
    SLEEPER,
    call_m27,
    group_alive,
    node_state,
    prefect_flow_run_state,
    spawn_m27,
    wait_running,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.service


def _running(home: Path) -> tuple[str, int]:
    """(run id, process group) of SLEEPER's `long` step once it runs."""
    run, step = wait_running(home, "sleeper", "long", timeout=120)
    assert step.pgid is not None
    return run.run_id, step.pgid


QUICK = "name: quick\npipeline:\n  - name: hello\n    type: cpu\n    command: echo hello\n"


def _start(tmp_path: Path, home: Path, *, warm: bool, **popen: Any) -> subprocess.Popen[str]:
    """`m27 run` of SLEEPER: in a warm runner's forked child (a first run started the node
    service and its runner), or in the client's own process."""
    env: dict[str, str] = {}
    if warm:
        quick = tmp_path / "quick.yaml"
        quick.write_text(QUICK)
        assert call_m27("run", str(quick), "--plain", timeout=600).returncode == 0
        info = home / "warm.json"
        wait_until(info.exists, timeout=240, interval=0.2, what="the warm runner serving")
    else:
        env["M27_WARM"] = "0"
    spec = tmp_path / "p.yaml"
    spec.write_text(SLEEPER)
    return spawn_m27("run", str(spec), "--plain", env=env, **popen)


@pytest.mark.parametrize("warm", [False, True], ids=["own-process", "warm"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["TERM", "HUP"])
def test_a_signal_to_m27_run_cancels_the_run_and_stops_its_steps(
    tmp_path: Path, m27_home: Path, prefect_env: str, signum: signal.Signals, warm: bool
) -> None:
    proc = _start(tmp_path, m27_home, warm=warm)
    try:
        run_id, pgid = _running(m27_home)
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=60)  # the step's 300 s are not waited out
    finally:
        proc.kill()
    assert proc.returncode == 1, out
    assert f"cancelling: {signum.name} received; stopping step processes" in out
    assert "Traceback" not in out
    run = node_state(m27_home).runs[run_id]
    assert (run.status, run.reason) == ("cancelled", f"{signum.name} received")
    assert run.steps["long"].status == "cancelled"
    assert run.steps["after"].status in ("cancelled", "skipped")
    wait_until(lambda: not group_alive(pgid), timeout=15, what="the step's processes gone")
    wait_until(
        lambda: prefect_flow_run_state(prefect_env, run.flow_run_id) == "CANCELLED",
        timeout=60,
        what="Prefect showing the flow run Cancelled",
    )


@pytest.mark.parametrize("warm", [False, True], ids=["own-process", "warm"])
@pytest.mark.parametrize(
    "ignored", [signal.SIGHUP, signal.SIGINT], ids=["nohup", "background-of-a-script"]
)
def test_a_signal_m27_run_was_started_ignoring_leaves_the_run_running(
    tmp_path: Path, m27_home: Path, prefect_env: str, warm: bool, ignored: signal.Signals
) -> None:
    # `nohup m27 run`: a closed terminal's HUP; `m27 run p.yaml &` in a script: a Ctrl-C
    # meant for the script. Through the warm runner the client forwarded what it ignored
    # (the HUP killed the run); in its own process `m27 run` set its Ctrl-C handler anyway.
    proc = _start(
        tmp_path, m27_home, warm=warm, preexec_fn=lambda: signal.signal(ignored, signal.SIG_IGN)
    )
    try:
        run_id, _pgid = _running(m27_home)
        proc.send_signal(ignored)
        # still running once a later signal, which does cancel, has been handled
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert "cancelling: SIGTERM received" in out, out
    assert "Ctrl-C" not in out and "SIGHUP" not in out, out
    assert node_state(m27_home).runs[run_id].reason == "SIGTERM received"
