"""A step that asks for more GPUs or GPU memory than the node has would wait in the queue
forever: `m27 run` refuses it before anything starts (against the node's GPUs), and so
does `m27 validate` when `M27_GPUS=sim:NxSIZE` says what the node has. Every such step
is named, at the line and column of the field that asks, as the file's other problems."""

from __future__ import annotations

import json
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
        f"{spec}:5:11: pipeline[0].gpus: step 'big' needs 3 GPUs; this node has 2",
        f"{spec}:12:17: pipeline[2].gpu_memory: step 'huge' asks for gpu_memory 200.0GiB; "
        "the largest GPU here has 80.0GiB",
        "2 problem(s) found",
    ]
    assert not (m27_home / "service.json").exists()  # no node service started for it


def test_validate_with_simulated_gpus_names_them_too(
    spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(spec)]) == 2
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        f"{spec}:5:11: pipeline[0].gpus: step 'big' needs 3 GPUs; M27_GPUS=sim:2x80GiB has 2",
        f"{spec}:12:17: pipeline[2].gpu_memory: step 'huge' asks for gpu_memory 200.0GiB; "
        "the GPUs of M27_GPUS=sim:2x80GiB have 80.0GiB",
    ]
    assert err.strip() == "2 problem(s) found"


SLURM_SPEC = """\
name: cluster
pipeline:
  - name: wide
    type: gpu
    executor: slurm
    gpus: 8
    command: echo wide
  - name: odd
    type: gpu
    executor: slurm
    command: echo odd
    slurm: {time: 4 hours, mem: lots, gpus: 1, gres: "gpu:1", tier: urgent}
"""


def test_slurm_steps_are_held_to_slurms_options_not_to_this_nodes_gpus(
    tmp_path: Path,
    m27_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("M27_GPUS", "sim:2x80GiB")
    monkeypatch.delenv("M27_SLURM_CONFIG", raising=False)  # no site file: $M27_HOME has none
    spec = tmp_path / "cluster.yaml"
    spec.write_text(SLURM_SPEC)
    assert main(["validate", str(spec)]) == 2
    out, err = capsys.readouterr()
    # 8 GPUs on a node of 2 is fine for a Slurm step; each bad option is named
    where = f"{spec}:8: step 'odd': slurm"
    assert out.splitlines() == [
        f"{where}.tier 'urgent' is not in slurm.tiers (none are configured)",
        f"{where}: give gpus or gres, not both",
        f"{where}.time: not a time limit: '4 hours' (use minutes as a number (240), "
        "Slurm's 4:00:00 or 1-00:00:00, or 4h, 90m)",
        f"{where}.mem: not a memory size: 'lots' (use e.g. 32G, 500M or 32GiB)",
    ]
    assert err.strip() == "4 problem(s) found"
    assert main(["run", str(spec), "--plain"]) == 2  # before anything starts
    assert (
        capsys.readouterr().err.splitlines()[0]
        == f"{where}.tier 'urgent' is not in slurm.tiers (none are configured)"
    )
    assert not (m27_home / "service.json").exists()


def test_validate_json_reports_what_the_node_cannot_hold_as_json(
    spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(spec), "--json"]) == 2
    result = json.loads(capsys.readouterr().out)  # JSON, not the text lines
    assert result["ok"] is False and result["total"] == 2
    where = [(p["file"], p["line"], p["column"], p["field"]) for p in result["problems"]]
    assert where == [
        (str(spec), 5, 11, "pipeline[0].gpus"),
        (str(spec), 12, 17, "pipeline[2].gpu_memory"),
    ]
    assert [p["message"] for p in result["problems"]] == [
        "step 'big' needs 3 GPUs; M27_GPUS=sim:2x80GiB has 2",
        "step 'huge' asks for gpu_memory 200.0GiB; the GPUs of M27_GPUS=sim:2x80GiB have 80.0GiB",
    ]
