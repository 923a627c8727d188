"""examples/gromacs/replicas.yaml with real GROMACS: each replica is prepared with its own
velocity seed, simulated and analysed in its own folder, and `compare` reads them all.
With CI=true a missing `gmx` fails instead of skipping."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.e2e._helpers import M27, ROOT, node_state
from tests.services import need_program

pytestmark = [pytest.mark.service, pytest.mark.slow]

need_program("gmx", "GROMACS", "apt-get install gromacs")


def test_replicas_run_apart_with_their_own_seeds_and_are_compared(
    m27: M27, tmp_path: Path, m27_home: Path
) -> None:
    example = tmp_path / "gromacs"
    shutil.copytree(ROOT / "examples" / "gromacs", example, ignore=shutil.ignore_patterns("out"))
    done = m27(
        "run", str(example / "replicas.yaml"), "--plain",
        "--set", "NSTEPS=300", "--set", "SEEDS=1 2",
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    (run,) = node_state(m27_home).runs.values()
    assert {n: s.status for n, s in run.steps.items()} == {
        f"{step}.{seed}": "succeeded"
        for step in ("preprocessing", "md_simulation", "analysis")
        for seed in (1, 2)
    } | {"compare": "succeeded"}
    out = example / "out" / "replicas"
    for seed in ("1", "2"):
        mdp = (out / seed / "md.mdp").read_text()
        assert f"gen-seed                = {seed}\n" in mdp
    # other starting velocities, another trajectory
    assert (out / "1" / "energy.xvg").read_text() != (out / "2" / "energy.xvg").read_text()
    table = (out / "compare.txt").read_text().splitlines()
    assert [line.split()[0] for line in table[1:]] == ["1", "2", "mean", "std"]
    assert "Temperature" in table[0]
