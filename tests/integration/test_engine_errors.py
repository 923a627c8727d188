"""A real engine's own error message is the step's failure reason (`exited with code 1:
Invalid input values: In option s: ...`), so `m27 run`, `m27 status`, Prefect and a phone
say why; before, each said only `exited with code 1`. Real `gmx`, `lmp` and `cp2k`."""

from __future__ import annotations

from pathlib import Path

import pytest

from m27.executors.local import StepLaunch, run_step
from m27.store.memory import MemoryEventStore
from tests.services import need_program

pytestmark = pytest.mark.service

need_program("gmx", "GROMACS", "apt-get install gromacs")
need_program("lmp", "LAMMPS", "apt-get install lammps")
need_program("cp2k", "CP2K", "apt-get install cp2k")


def test_mdrun_without_its_input_fails_saying_what_gromacs_said(tmp_path: Path) -> None:
    launch = StepLaunch(
        "r", "md", ("gmx", "mdrun", "-deffnm", "simulation", "-nt", "1"), workdir=tmp_path
    )
    result = run_step(launch, MemoryEventStore())
    assert not result.ok and result.exit_code == 1
    assert result.reason.startswith("exited with code 1: Invalid input values: In option s: ")
    assert "does not exist or is not accessible." in result.reason


def test_a_lammps_script_error_is_the_reason_without_its_source_line(tmp_path: Path) -> None:
    (tmp_path / "in.bad").write_text("units lj\nfoo bar\n")
    launch = StepLaunch("r", "md", ("lmp", "-in", "in.bad", "-log", "none"), workdir=tmp_path)
    result = run_step(launch, MemoryEventStore())
    assert not result.ok and result.exit_code == 1
    assert result.reason == "exited with code 1: ERROR: Unknown command: foo bar"


def test_a_cp2k_abort_is_the_reason_without_its_box(tmp_path: Path) -> None:
    (tmp_path / "in.inp").write_text("&GLOBAL\n  PROJECT x\n  RUN_TYPE MD\n  FOO 1\n&END GLOBAL\n")
    launch = StepLaunch("r", "md", ("cp2k", "-i", "in.inp"), workdir=tmp_path)
    result = run_step(launch, MemoryEventStore())
    assert not result.ok and result.exit_code != 0
    assert "[ABORT]" not in result.reason and "*" not in result.reason, result.reason
    assert "FOO" in result.reason, result.reason
