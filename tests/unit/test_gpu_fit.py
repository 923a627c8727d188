"""A step that asks for more GPUs or GPU memory than the node has would wait in the queue
forever: `m27 run` refuses it before anything starts (against the node's GPUs), and so
does `m27 validate` when `M27_GPUS=sim:NxSIZE` says what the node has. Every such step
is named, each with its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from m27.cli.main import main

SPEC = """\
name: fit
pipeline:
  - name: big
    type: gpu
    gpus: 3
    command: echo big
  - name: fine
    type: gpu_light
    command: echo fine
  - name: huge
    type: gpu
    gpu_memory: 200GiB
    command: echo huge
"""


@pytest.fixture
def spec(tmp_path: Path, m27_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("M27_GPUS", "sim:2x80GiB")
    path = tmp_path / "fit.yaml"
    path.write_text(SPEC)
    return path


def test_run_names_every_step_the_node_cannot_hold_and_starts_nothing(
    spec: Path, m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", str(spec), "--plain"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"m27: {spec}:3: step 'big' needs 3 GPUs; this node has 2",
        f"m27: {spec}:10: step 'huge' asks for gpu_memory 200.0GiB; "
        "the largest GPU here has 80.0GiB",
    ]
    assert not (m27_home / "service.json").exists()  # no node service started for it


def test_validate_with_simulated_gpus_names_them_too(
    spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(spec)]) == 2
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        f"{spec}:3: step 'big' needs 3 GPUs; M27_GPUS=sim:2x80GiB has 2",
        f"{spec}:10: step 'huge' asks for gpu_memory 200.0GiB; "
        "the GPUs of M27_GPUS=sim:2x80GiB have 80.0GiB",
    ]
    assert err.strip() == "2 problem(s) found"
