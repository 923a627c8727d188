"""`m27 run` stopped by a signal from outside its terminal: SIGTERM (`kill`, systemd, a
batch system's stop before its KILL) or SIGHUP (the terminal closed).

Both cancel the run as `m27 cancel` does: the steps get TERM and their grace, the run ends
cancelled (resumable), and Prefect shows Cancelled. Before, Prefect's engine turned SIGTERM
into a crash and the process waited for its steps to end by themselves (a 30 s step ran
its 30 s, then the run was recorded crashed with every step succeeded); SIGHUP killed the
process at once and left its steps running.
"""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path

import pytest

from tests.e2e._helpers import node_state, prefect_flow_run_state, spawn_m27
from tests.waiting import wait_until

pytestmark = pytest.mark.service

SLEEPER = textwrap.dedent("""\
    name: sleeper
    pipeline:
      - name: long
        type: cpu
        command: python -c "import time; print('started', flush=True); time.sleep(300)"
      - name: after
        type: cpu
        depends_on: [long]
        command: python -c "print('never')"
""")


def _running(home: Path) -> tuple[str, int] | None:
    """(run id, process group) of the `long` step once it runs."""
    for run in node_state(home).runs.values():
        step = run.steps.get("long")
        if step is not None and step.status == "running" and step.pgid:
            return run.run_id, step.pgid
    return None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["TERM", "HUP"])
def test_a_signal_to_m27_run_cancels_the_run_and_stops_its_steps(
    tmp_path: Path, m27_home: Path, prefect_env: str, signum: signal.Signals
) -> None:
    spec = tmp_path / "p.yaml"
    spec.write_text(SLEEPER)
    proc = spawn_m27("run", str(spec), "--plain")
    try:
        run_id, pgid = wait_until(
            lambda: _running(m27_home), timeout=120, interval=0.1, what="the step running"
        )
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
    wait_until(lambda: not _group_alive(pgid), timeout=15, what="the step's processes gone")
    wait_until(
        lambda: prefect_flow_run_state(prefect_env, run.flow_run_id) == "CANCELLED",
        timeout=60,
        what="Prefect showing the flow run Cancelled",
    )
