"""`on_crash: resume`: a power cut mid-simulation, and the node service resumes the run by
itself from its last checkpoint, as `m27 run --resume RUN --detach` would: nobody types
anything (a weekend's power cut cost the weekend before)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from m27.units import format_duration
from tests.e2e._helpers import M27, md_pipeline, node_state, power_cut

pytestmark = [pytest.mark.service, pytest.mark.slow]


@pytest.mark.timeout(600)  # two MD runs and a node service start on a loaded 2-core machine
def test_the_node_service_resumes_a_crashed_run_that_asks_for_it(
    m27: M27, tmp_path: Path, m27_home: Path, prefect_env: str
) -> None:
    spec = md_pipeline(tmp_path, "md-revive", top="on_crash: resume\n")

    def checkpointed() -> bool:
        run = next(iter(node_state(m27_home).runs.values()), None)
        step = run.steps["md_simulation"] if run else None
        return bool(step and step.checkpoint_step and step.checkpoint_step >= 400)

    power_cut(spec, m27_home, "md_simulation", checkpointed, "a checkpoint at step 400")
    (crashed_id,) = node_state(m27_home).runs

    def service_log() -> str:
        return (m27_home / "service.log").read_text(errors="replace")[-3000:]

    # a script's `m27 wait` follows the crashed run to the run that resumes it
    waited = m27("wait", crashed_id, timeout=480)
    assert waited.returncode == 0, waited.stdout + waited.stderr + service_log()
    (new,) = [r for r in node_state(m27_home).runs.values() if r.resume_of == crashed_id]
    assert waited.stdout.splitlines() == [
        f"run {crashed_id} crashed; run {new.run_id} resumes it (on_crash: resume)",
        f"run {new.run_id} succeeded in {format_duration(new.duration_s or 0)}",
    ], waited.stdout
    state = node_state(m27_home)
    assert state.runs[crashed_id].crashed
    assert state.runs[crashed_id].auto_resume == "started"
    assert new.status == "succeeded", new.reason
    assert new.steps["preprocessing"].status == "skipped"
    assert new.steps["md_simulation"].resume_from  # from the crashed run's checkpoint
    with (tmp_path / "out" / "energy.csv").open() as fh:
        steps = [int(row["step"]) for row in csv.DictReader(fh)]
    assert steps == sorted(set(steps)) and steps[-1] == 6000  # every step once, to the end
    assert f"on_crash: resume: {crashed_id} resumed as run {new.run_id}" in service_log()
    shown = m27("status", crashed_id).stdout
    assert f"resumed by: {new.run_id}" in shown, shown
