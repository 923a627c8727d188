"""`m27 run` of a pipeline whose gpu step runs through Slurm: same flow, same event log."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.e2e._helpers import M27, node_state
from tests.integration.slurm_fixture import slurm_cluster  # noqa: F401

pytestmark = [pytest.mark.service, pytest.mark.usefixtures("slurm_cluster")]


def test_a_pipeline_mixes_local_and_slurm_steps(m27: M27, tmp_path: Path, m27_home: Path) -> None:
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
            slurm: {time: "00:02:00", gpus: 1}
            command: python -c "import os; print('slurm gpus', os.environ['CUDA_VISIBLE_DEVICES'], open('input.txt').read())"
    """)
    )
    done = m27("run", str(spec), "--plain", cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = node_state(m27_home).runs.values()
    train = run.steps["train"]
    assert run.status == "succeeded" and train.status == "succeeded"
    assert train.slurm_job_id
    assert "[train] slurm gpus 0 42" in done.stdout
