"""How long a step gets between its stop signal and SIGKILL (flows/_run.py).

A step with `checkpoint:` may be saving when `m27 cancel`, its `timeout:` or a preempting
tier stops it: a program with its own checkpoint files (GROMACS) and Python code saving on
`m27.watch_stop()` alike get `checkpoint_grace`; a step that keeps no checkpoint has
nothing to save and gets 10 s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from flows._run import _launch, _Run
from m27.spec import load_pipeline

PIPELINE = """\
name: grace
pipeline:
  - name: plain
    type: cpu
    command: python plain.py
  - name: python
    type: gpu
    checkpoint: 30s
    command: python simulate.py
  - name: mdrun
    type: gpu
    checkpoint: 5m
    command: gmx mdrun -deffnm simulation
"""


def test_a_step_that_checkpoints_gets_checkpoint_grace_and_any_other_10s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("M27_CHECKPOINT_GRACE", "45s")
    (tmp_path / "p.yaml").write_text(PIPELINE)
    pipeline = load_pipeline(tmp_path / "p.yaml")
    run: Any = _Run(
        run_id="r1",
        pipeline=pipeline,
        store=cast(Any, None),
        home=tmp_path / "home",
        lease=cast(Any, None),
        resume_dirs=[],
    )
    launches = {step.name: _launch(run, step, ()) for step in pipeline.steps}
    assert {name: launch.grace for name, launch in launches.items()} == {
        "plain": 10.0,
        "python": 45.0,
        "mdrun": 45.0,
    }
    assert launches["python"].self_checkpoint is None  # it saves itself, no files to guard
    assert launches["mdrun"].self_checkpoint is not None
