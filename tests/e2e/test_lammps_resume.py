"""LAMMPS as a black box: m27 captures the restart file its input script rewrites, and a
resume continues from it.

Real `lmp` on the example's Lennard-Jones melt (256 atoms here), writing its restart file
every 1,000 steps (several times a second) by m27's convention (`run N upto ... every M "write_restart
${m27_restart}"`, docs/engines.md). A power cut (kill -9 of `m27 run` and of lmp) after
two captures; `m27 run --resume` must put the newest capture back (or the newer complete
file lmp wrote in the instant before its kill, captured first), LAMMPS must read it
(`read_restart`) and go on from the step the file records to the last step. With
CI=true a missing `lmp` fails instead of skipping.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from m27.events import CheckpointRestored
from tests.e2e._helpers import (
    M27,
    events,
    file_captures,
    lammps_pipeline,
    lammps_thermo_steps,
    power_cut,
)
from tests.services import need_program

pytestmark = [pytest.mark.service, pytest.mark.slow]

STEPS, EVERY = 300_000, 1000  # 256 atoms: ~10,000 steps/s on an idle core

need_program("lmp", "LAMMPS", "apt-get install lammps")


@pytest.fixture(autouse=True)
def _fast_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("M27_CAPTURE_POLL", "0.2")


def test_power_cut_mid_lammps_resumes_from_the_captured_restart_file(
    m27: M27, tmp_path: Path, m27_home: Path
) -> None:
    spec, out = lammps_pipeline(tmp_path, steps=STEPS, every=EVERY)
    power_cut(spec, m27_home, "melt", lambda: len(file_captures(m27_home)) >= 2, "two captures")
    steps = [e.engine_step for e in file_captures(m27_home)]
    assert all(s is not None and s % EVERY == 0 for s in steps) and steps == sorted(steps), steps
    assert steps[-1] is not None and steps[-1] < STEPS, "lmp ended before the power cut"

    done = m27("run", "--resume", "last", "--plain", timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    restored = [e for e in events(m27_home) if isinstance(e, CheckpointRestored)]
    assert len(restored) == 1 and restored[0].files == ("m27.restart",)
    start = restored[0].engine_step
    # the newest capture, or a file lmp wrote in the instant before its kill -9, which the
    # resume finds complete and newer than every capture and captures first
    assert start is not None and start % EVERY == 0 and steps[-1] <= start < STEPS, start
    recorded = {e.path: e.engine_step for e in file_captures(m27_home)}
    assert recorded[restored[0].path] == start
    assert f"(step {start}); resuming with: -var m27_resume 1" in done.stdout
    assert "Reading restart file" in done.stdout
    thermo = lammps_thermo_steps(done.stdout)
    assert thermo[0] == start and thermo[-1] == STEPS, (thermo[:3], thermo[-3:])
    assert lammps_thermo_steps((out / "melt.log").read_text())[-1] == STEPS  # lmp's own log
