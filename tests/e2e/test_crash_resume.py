"""A power cut mid-simulation: the run shows as crashed, and --resume continues the MD step
from its last checkpoint (found through the event log), registered in Prefect."""

from __future__ import annotations

import asyncio
import csv
import json
import os
import signal
from pathlib import Path

import pytest

from m27.events.state import StepState
from tests.e2e._helpers import M27, md_pipeline, node_state, prefect_log_messages, start_run
from tests.waiting import wait_until

pytestmark = [pytest.mark.service, pytest.mark.slow]


def _artifact_keys(prefect_api: str) -> set[str]:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    async def fetch() -> set[str]:
        async with get_client() as client:
            return {a.key for a in await client.read_artifacts() if a.key}

    with temporary_settings(updates={PREFECT_API_URL: prefect_api}):
        return asyncio.run(fetch())


@pytest.mark.timeout(600)  # two MD runs and a node service start on a loaded 2-core machine
def test_power_cut_mid_step_then_resume_continues_from_the_checkpoint(
    m27: M27, tmp_path: Path, m27_home: Path, prefect_env: str
) -> None:
    spec = md_pipeline(tmp_path, "md-crash")
    proc = start_run(spec, new_session=True)

    def checkpointed() -> StepState | None:
        run = next(iter(node_state(m27_home).runs.values()), None)
        step = run.steps["md_simulation"] if run else None
        ok = step is not None and step.checkpoint_step and step.checkpoint_step >= 400
        return step if ok else None

    step = wait_until(checkpointed, timeout=600, interval=0.2, what="a checkpoint at step 400")
    assert step.last_checkpoint
    # the power cut: m27 run and the step's own process group die at once
    os.killpg(proc.pid, signal.SIGKILL)
    os.killpg(step.pgid, signal.SIGKILL)
    proc.wait()
    (crashed,) = json.loads(m27("runs", "--json").stdout)
    assert crashed["status"] == "crashed"

    done = m27("run", "--resume", crashed["run_id"], "--plain", timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    state = node_state(m27_home)
    new = state.runs[next(r for r in state.runs if r != crashed["run_id"])]
    assert new.status == "succeeded"
    assert new.steps["preprocessing"].status == "skipped"
    assert "resuming from" in done.stdout
    assert "resumed from checkpoint at step" in done.stdout
    # the energy log is continuous: every step once, in order, to the end
    with (tmp_path / "out" / "energy.csv").open() as fh:
        steps = [int(row["step"]) for row in csv.DictReader(fh)]
    assert steps == sorted(set(steps)) and steps[-1] == 6000
    assert len(steps) == len(set(steps))
    assert "m27-ckpt-md-crash-md-simulation" in _artifact_keys(prefect_env)
    # Prefect's log of the step says it resumed, and from which checkpoint (it said only
    # `started (attempt 1, pid P on HOST, GPU 0)`, as for a fresh start)
    resumed_from = new.steps["md_simulation"].resume_from
    assert resumed_from

    def told() -> list[str] | None:
        texts = prefect_log_messages(prefect_env, new.flow_run_id)
        return texts if any(t.startswith("started (") for t in texts) else None

    texts = wait_until(told, timeout=120, what="the step's start in Prefect's log")
    (started,) = [t for t in texts if t.startswith("started (")]
    assert started.endswith(f", resuming from {resumed_from})"), started
