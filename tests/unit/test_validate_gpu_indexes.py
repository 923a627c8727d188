"""`m27 validate` notes a command that names a GPU the step will not see: m27 sets
CUDA_VISIBLE_DEVICES to the step's leased GPUs, seen inside as 0, 1, ..., so a job
written by hand for the second GPU (`--device cuda:1`, mdrun's `-gpu_id 1`) validated OK
and failed `invalid device ordinal` when it started."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from m27.cli.commands import validate


def _validate(path: Path, *flags: str) -> int:
    parser = argparse.ArgumentParser(prog="m27")
    validate.register(parser.add_subparsers())
    args = parser.parse_args(["validate", str(path), *flags])
    code: int = args.func(args)
    return code


def test_gpu_indexes_the_step_will_not_see_are_noted_each_with_its_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "p.yaml"
    path.write_text(
        "name: p\nsteps:\n"
        "  - {name: md, type: gpu, command: python -m gmx mdrun -gpu_id 01}\n"
        "  - {name: tr, type: gpu, gpus: 2, command: 'python t.py --device=cuda:2 --b cuda:1'}\n"
        "  - name: pre\n    type: cpu\n    command: python p.py --device cuda:0\n"
        "    env: {CUDA_VISIBLE_DEVICES: '1'}\n"
        "  - {name: fine, type: gpu, gpus: 2, command: 'python x.py cuda:1 -gpu_id 0,1 xcuda:9'}\n"
    )
    assert _validate(path) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    sees = "(m27 sets CUDA_VISIBLE_DEVICES), so GPU"
    assert notes == [
        f"note: p.yaml:3: step md: -gpu_id 01: the step sees its 1 leased GPU as GPU 0 {sees} 1 "
        "is not there when it starts; write 0, or ask for more with gpus: N",
        "note: p.yaml:4: step tr: cuda:2: the step sees its 2 leased GPUs as GPUs 0 and 1 "
        f"{sees} 2 is not there when it starts; write one of those, or ask for more with gpus: N",
        "note: p.yaml:5: step pre: cuda:0: a cpu step sees no GPU (m27 sets "
        "CUDA_VISIBLE_DEVICES empty), so GPU 0 is not there when it starts; make it type: gpu",
        "note: p.yaml:5: step pre: env CUDA_VISIBLE_DEVICES is replaced by the GPUs m27 leases "
        "the step (a cpu step: none)",
    ]
    assert _validate(path, "--json") == 0
    assert len(json.loads(capsys.readouterr().out)["notes"]) == 4
