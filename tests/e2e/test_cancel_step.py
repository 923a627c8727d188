"""`m27 cancel RUN STEP`: one replica stops (SIGTERM to its process group, recorded
cancelled, Cancelled in Prefect) while the run goes on with the others; a step that waits
on others is cancelled before it starts; the run ends failed, and a resume runs what was
cancelled."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.e2e._helpers import (
    M27,
    gated_script,
    group_alive,
    node_state,
    prefect_flow_run_state,
    prefect_task_states,
    spawn_m27,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.service

PIPELINE = textwrap.dedent("""\
    name: replicas
    pipeline:
      - name: md
        type: gpu
        matrix: {SEED: [1, 2, 3]}
        command: python gate.py {{SEED}}
      - name: after
        type: cpu
        matrix: {SEED: [1, 2, 3]}
        depends_on: md
        command: python -c "print('after {{SEED}}')"
      - name: all
        type: cpu
        depends_on: after
        command: python -c "print('all')"
""")


def test_cancel_of_one_replica_lets_the_run_go_on_and_a_resume_runs_it(
    m27: M27, tmp_path: Path, m27_home: Path, prefect_server: str
) -> None:
    (tmp_path / "p.yaml").write_text(PIPELINE)
    gated_script(tmp_path / "gate.py", "print('done', flush=True)\n")
    proc = spawn_m27("run", str(tmp_path / "p.yaml"), "--plain")
    try:

        def running() -> dict[str, int] | None:
            runs = list(node_state(m27_home).runs.values())
            steps = runs[0].steps if runs else {}
            found = {n: s.pgid for n, s in steps.items() if s.status == "running" and s.pgid}
            return found if len(found) == 3 else None

        pgids = wait_until(running, timeout=120, interval=0.2, what="three replicas running")
        typo = m27("cancel", "last", "md.9")
        assert typo.returncode == 2
        assert "has no step 'md.9' (did you mean" in typo.stderr
        done = m27("cancel", "last", "md.2", "after.3")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "step after.3: cancelled; it waits on other steps, and will not start" in done.stdout
        assert "step md.2: cancelled" in done.stdout
        wait_until(lambda: not group_alive(pgids["md.2"]), timeout=15, what="md.2 stopped")
        # the other replicas still run
        state = node_state(m27_home)
        (run,) = state.runs.values()
        assert run.status == "running"
        assert run.steps["md.1"].status == run.steps["md.3"].status == "running"
        # the waiting step says it will not start, not a plain `pending`
        assert run.steps["after.3"].cancel_requested_by.startswith("cli:")
        shown = m27("status", "last")
        line = next(x for x in shown.stdout.splitlines() if x.strip().startswith("after.3"))
        assert "pending" in line and "cancel requested (cli:" in line, shown.stdout
        assert "it will not start" in shown.stdout
        assert json.loads(m27("status", "last", "--json").stdout)["steps"]["after.3"][
            "cancel_requested_by"
        ].startswith("cli:")
        (tmp_path / "go").touch()
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert "md.2: cancel requested (cli:" in out
    run = node_state(m27_home).runs[run.run_id]
    assert (run.status, run.reason) == ("failed", "steps md.2, after.3 cancelled")
    assert {n: s.status for n, s in run.steps.items()} == {
        "md.1": "succeeded",
        "md.2": "cancelled",
        "md.3": "succeeded",
        "after.1": "succeeded",
        "after.2": "skipped",
        "after.3": "cancelled",
        "all": "skipped",
    }
    assert run.steps["after.3"].reason == "step cancelled before the step started"
    assert run.flow_run_id is not None
    assert prefect_flow_run_state(prefect_server, run.flow_run_id) == "FAILED"
    tasks = prefect_task_states(prefect_server, run.flow_run_id)
    assert tasks["md.2"] == "CANCELLED" and tasks["md.1"] == "COMPLETED"

    # an ended run: nothing to cancel; a name the run lacks: exit 2
    again = m27("cancel", run.run_id, "md.2")
    assert again.returncode == 0 and "already failed" in again.stdout
    resumed = m27("run", "--resume", run.run_id, "--plain")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    new = next(r for r in node_state(m27_home).runs.values() if r.resume_of == run.run_id)
    ran = {n for n, s in new.steps.items() if s.status == "succeeded"}
    assert ran == {"md.2", "after.2", "after.3", "all"}
