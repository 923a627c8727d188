"""`m27 run --detach`: the run outlives the command (and the terminal it was typed in).

A week of MD started over ssh was cancelled by the closed session's SIGHUP; `--detach`
starts the run in a session of its own, waits until it is in the node's log, says how to
follow it, and exits 0. Bad input still fails here, with the child's message."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
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


def _session(process: psutil.Process) -> int | None:
    try:
        return os.getsid(process.pid)
    except OSError:  # gone since it was listed
        return None


@pytest.mark.parametrize("warm", ["1", "0"], ids=["warm", "own-process"])
def test_a_detached_run_goes_on_in_its_own_session_until_cancelled(
    tmp_path: Path,
    m27_home: Path,
    prefect_env: str,
    warm: str,
) -> None:
    spec = tmp_path / "p.yaml"
    spec.write_text(SLEEPER)
    # as typed at a terminal: the command leads a session of its own (the terminal's)
    terminal = spawn_m27(
        "run",
        str(spec),
        "--detach",
        env={"M27_WARM": warm},
        stderr_apart=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = terminal.communicate(timeout=600)
    finally:
        terminal.kill()
    assert terminal.returncode == 0, stdout + stderr
    run, step = wait_running(m27_home, "sleeper", "long", timeout=120)
    assert stdout == f"{run.run_id}\n"  # alone, for `R=$(m27 run -d p.yaml)`
    assert (
        f"run {run.run_id} runs in the background; its output: "
        f"{m27_home / 'runs' / run.run_id / 'run.out'}\n"
    ) in stderr
    assert f"m27 cancel {run.run_id}" in stderr and "Traceback" not in stderr
    # what came before the run is shown; the run's own progress is not
    assert "pipeline sleeper" not in stderr and "[long]" not in stderr
    # the command has exited and left nothing in the terminal's session: a hangup (the
    # ssh session closed) reaches no process of the run
    left = [p.pid for p in psutil.process_iter() if _session(p) == terminal.pid]
    assert left == []
    assert run.status == "running"
    assert step.pgid is not None and group_alive(step.pgid)

    # `m27 logs -f RUN`: the run's whole output, until its process has written its last
    follow = spawn_m27("logs", "-f", run.run_id, stderr_apart=True)
    wait_until(
        lambda: "[long] started" in (m27_home / "runs" / run.run_id / "run.out").read_text(),
        timeout=60,
        what="the step's first line in run.out",
    )
    cancelled = call_m27("cancel", run.run_id, timeout=120)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    ended = node_state(m27_home).runs[run.run_id]
    assert ended.status == "cancelled" and ended.steps["long"].status == "cancelled"
    wait_until(lambda: not group_alive(step.pgid or 0), timeout=15, what="the step gone")
    wait_until(
        lambda: prefect_flow_run_state(prefect_env, ended.flow_run_id) == "CANCELLED",
        timeout=60,
        what="Prefect showing the flow run Cancelled",
    )
    try:
        followed, follow_err = follow.communicate(timeout=120)
    finally:
        follow.kill()
    assert follow.returncode == 0, follow_err
    out = (m27_home / "runs" / run.run_id / "run.out").read_text()
    assert f"run {run.run_id}: pipeline sleeper (2 steps)" in out
    assert "[long] started" in out and f"run {run.run_id} cancelled" in out
    # it ended with the run's process: the summary, printed after the run's end, is in it
    assert followed == out and f"resume: m27 run --resume {run.run_id}\n" in followed


def test_bad_input_fails_the_detaching_command_with_the_childs_message(
    tmp_path: Path, m27_home: Path, prefect_env: str
) -> None:
    spec = tmp_path / "p.yaml"
    spec.write_text("pipeline:\n  - name: a\n    type: cpu\n    command: echo {{MISSING}}\n")
    failed = call_m27("run", str(spec), "--detach", timeout=300)
    assert failed.returncode == 2
    assert "undefined variable 'MISSING'" in failed.stderr
    assert "Traceback" not in failed.stderr and failed.stdout == ""
    assert not node_state(m27_home).runs
    assert not list((m27_home / "runs").iterdir())  # its output was shown, not kept
    refused = call_m27("run", str(spec), "--detach", "--dry-run")
    assert refused.returncode == 2
    assert "--detach with --dry-run: a dry run starts nothing" in refused.stderr
