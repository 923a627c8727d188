"""`m27 run` of a pipeline whose gpu step runs through Slurm: same flow, same event log."""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path

import pytest

from tests.e2e._helpers import M27, node_state, start_run, wait_running
from tests.integration.slurm_fixture import job_state, slurm_cluster  # noqa: F401
from tests.waiting import wait_until

pytestmark = [pytest.mark.service, pytest.mark.usefixtures("slurm_cluster")]


def test_a_pipeline_mixes_local_and_slurm_steps(
    m27: M27, tmp_path: Path, m27_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tmp_path / "mixed.yaml"
    spec.write_text(
        textwrap.dedent("""\
        name: mixed
        pipeline:
          - name: prep
            type: cpu
            command: python -c "open('input.txt', 'w').write('42')"
          - name: train
            type: gpu
            depends_on: [prep]
            executor: slurm
            gpus: 2
            slurm: {time: "00:02:00"}
            command: python -c "import os; print('slurm gpus', os.environ['CUDA_VISIBLE_DEVICES'], open('input.txt').read())"
    """)
    )
    monkeypatch.setenv("M27_GPUS", "sim:1")  # this node: one GPU
    done = m27("run", str(spec), "--plain", cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = node_state(m27_home).runs.values()
    train = run.steps["train"]
    assert run.status == "succeeded" and train.status == "succeeded"
    assert train.slurm_job_id
    # the step's own `gpus: 2` is asked from Slurm (its cluster has 2 GPUs), not held
    # against this node's
    assert "[train] slurm gpus 0,1 42" in done.stdout
    job = train.slurm_job_id
    assert f"train: submitted as Slurm job {job} (attempt 1)" in done.stdout
    started = f"train: started (attempt 1, Slurm job {job} on {train.host}, GPU 0,1)"
    assert started in done.stdout
    assert done.stdout.index(started) < done.stdout.index("[train] slurm gpus")


def test_kill_9_of_a_run_cancels_its_slurm_job_through_the_cluster_it_was_submitted_to(
    m27: M27, tmp_path: Path, m27_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node service was started from a shell without SLURM_CONF (its crash watcher
    cannot reach this cluster by default); the run that submitted the job had it."""
    conf = os.environ["SLURM_CONF"]
    (tmp_path / "local.yaml").write_text("pipeline:\n  - {name: a, type: cpu, command: 'true'}\n")
    monkeypatch.delenv("SLURM_CONF")
    assert m27("run", str(tmp_path / "local.yaml"), "--plain", cwd=tmp_path).returncode == 0
    monkeypatch.setenv("SLURM_CONF", conf)
    spec = tmp_path / "long.yaml"
    spec.write_text(
        "name: long\npipeline:\n  - {name: sim, type: gpu, executor: slurm, command: sleep 300}\n"
    )
    proc = start_run(spec, cwd=tmp_path)
    try:
        _, step = wait_running(m27_home, "long", "sim", timeout=120)
        job = step.slurm_job_id
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    wait_until(
        lambda: job_state(job) == "CANCELLED",
        timeout=60,
        interval=0.5,
        what=f"the crash watcher to scancel job {job}",
    )
    (run,) = [r for r in node_state(m27_home).runs.values() if r.pipeline == "long"]
    assert run.steps["sim"].slurm_conf == conf
    assert run.steps["sim"].reason.startswith("run crashed")
