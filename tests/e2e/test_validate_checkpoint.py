"""`m27 validate` on the seed's own pipeline file, verbatim: what `checkpoint: 300s` does."""

from __future__ import annotations

from pathlib import Path

from tests.e2e._helpers import ROOT, call_m27
from tests.seed import SEED


def test_validate_explains_the_seed_checkpoint_as_cpt_5_and_cpi(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_text(SEED)
    done = call_m27("validate", str(path), "--set", "INPUT_FILE=x.pdb")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "md_simulation: checkpoint every 5m00s (gromacs recipe)" in lines
    assert "  command: gmx mdrun -cpt 5 -deffnm simulation -v" in lines
    assert "  on resume: -cpi simulation.cpt (appending to its outputs)" in lines
    assert not any(line.startswith("  resume:") for line in lines)  # said once
    assert "warning" not in done.stdout


def test_validate_of_the_gromacs_example_shows_its_recipe() -> None:
    done = call_m27("validate", str(ROOT / "examples" / "gromacs" / "pipeline.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "command: gmx mdrun -cpt 5 -deffnm simulation -v" in done.stdout
    assert "resume: -cpi simulation.cpt" in done.stdout
