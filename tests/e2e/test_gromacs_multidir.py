"""Replica exchange with real GROMACS: `mpirun -np 2 gmx_mpi mdrun -multidir 300 310
-replex 100`, two temperatures, each simulation in its own folder writing its own .cpt.

m27 captured nothing of such a run (it looked for `simulation.cpt` beside the folders), so
a power cut lost both replicas. Now both files are captured together, restored into their
folders, and mdrun resumes each from its own (`-cpi simulation.cpt`, read in each folder),
appending to its outputs: each energy file ends whole, every frame once. With CI=true a
missing `gmx_mpi` or `mpirun` fails instead of skipping.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import psutil
import pytest

from m27.events import CheckpointRestored
from tests.e2e._helpers import (
    M27,
    ROOT,
    assert_whole_energy_file,
    events,
    file_captures,
    node_state,
    power_cut,
)
from tests.services import need_program
from tests.waiting import wait_until

pytestmark = [pytest.mark.service, pytest.mark.slow]

need_program("gmx_mpi", "GROMACS built with MPI", "apt-get install gromacs")
need_program("mpirun", "Open MPI", "apt-get install openmpi-bin")

PREPARE = ROOT / "examples" / "gromacs" / "prepare.py"
TEMPS = ("300", "310")
NSTEPS = 4000
#: a power cut that must land mid-mdrun tries again with GROWTH times the steps
GROWTH, TRIES = 4, 3
FILES = ("300/simulation.cpt", "310/simulation.cpt")


@pytest.fixture(autouse=True)
def _fast_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("M27_CAPTURE_POLL", "0.3")
    monkeypatch.setenv("M27_CHECKPOINT_GRACE", "60")


def _pipeline(folder: Path, nsteps: int) -> tuple[Path, Path]:
    out = folder / "out"
    folder.mkdir(parents=True)
    spec = folder / "remd.yaml"
    spec.write_text(
        textwrap.dedent(f"""\
        name: gmx-remd
        env:  # mpirun refuses to run as root (CI is) unless told it may
          OMPI_ALLOW_RUN_AS_ROOT: "1"
          OMPI_ALLOW_RUN_AS_ROOT_CONFIRM: "1"
        vars:  # a list variable: the matrix's values, and -multidir's folders
          TEMPS: [{", ".join(TEMPS)}]
        pipeline:
          - name: prepare
            type: cpu
            matrix: {{T: "{{{{TEMPS}}}}"}}
            command: python {PREPARE} --nsteps {nsteps} --box 2.1 --temperature {{{{T}}}} --out {out}/{{{{T}}}}
          - name: remd
            type: gpu
            depends_on: [prepare]
            workdir: {out}
            checkpoint: 1s
            command: >-
              mpirun --oversubscribe -np 2 gmx_mpi mdrun -multidir {{{{TEMPS}}}}
              -deffnm simulation -ntomp 1 -replex 100
        """)
    )
    return spec, out


def _mdruns_in(out: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["name", "cwd"]):
        cwd = proc.info["cwd"] or ""
        if "gmx" in (proc.info["name"] or "") and cwd.startswith(str(out)):
            found.append(proc)
    return found


def _cut_mid_mdrun(tmp_path: Path, home: Path) -> tuple[Path, int]:
    """kill -9 of `m27 run` and of mpirun's group after two captures, while mdrun runs;
    a machine that finished first (on an idle CI machine, a cut after mdrun's last
    checkpoint, at its last step, left nothing to resume) tries again with more steps."""
    nsteps = NSTEPS
    for attempt in range(TRIES):
        spec, out = _pipeline(tmp_path / f"try{attempt}", nsteps)
        before = len(file_captures(home))

        def captured(before: int = before) -> bool:
            return len(file_captures(home)) >= before + 2

        power_cut(spec, home, "remd", captured, "captures")
        wait_until(lambda o=out: not _mdruns_in(o), timeout=60, what="the mdrun ranks gone")
        # ended first: its final coordinates are written, or (a cut between its last
        # checkpoint and them) its newest capture is at the last step
        steps = [c.engine_step or 0 for c in file_captures(home)[before:]]
        ended = any((out / t / "simulation.gro").exists() for t in TEMPS)
        if not ended and max(steps, default=0) < nsteps:
            return out, nsteps
        nsteps *= GROWTH
    pytest.fail(f"mdrun ended before 2 captures {TRIES} times, up to {nsteps} steps")


def test_a_power_cut_mid_replica_exchange_resumes_every_replica_from_its_capture(
    m27: M27, tmp_path: Path, m27_home: Path
) -> None:
    out, nsteps = _cut_mid_mdrun(tmp_path, m27_home)
    captures = file_captures(m27_home)
    assert captures and all(c.files == FILES for c in captures)

    done = m27("run", "--resume", "last", "--plain", timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "m27: outputs match simulation.cpt: mdrun appends to 300/simulation.log" in done.stdout
    assert f"restored {', '.join(FILES)} from " in done.stdout
    assert "resuming with: -cpi simulation.cpt" in done.stdout
    starts = [int(s) for s in re.findall(r"continuing from step (\d+)", done.stdout)]
    assert len(starts) == 2 and all(0 < s < nsteps for s in starts), done.stdout[-3000:]
    (restored,) = [e for e in events(m27_home) if isinstance(e, CheckpointRestored)]
    assert restored.files == FILES and restored.engine_step == min(starts)
    resumed = [r for r in node_state(m27_home).runs.values() if r.resume_of]
    assert [r.status for r in resumed] == ["succeeded"]
    for t in TEMPS:
        log = (out / t / "simulation.log").read_text()
        assert "Restarting from checkpoint, appending to previous log file." in log
        assert "Replica exchange" in log
        assert_whole_energy_file(out / t, nsteps)
