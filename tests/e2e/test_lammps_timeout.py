"""LAMMPS's own wall-time limit, `timer timeout`, with real `lmp`: the run stops before
its last step and exits 0, with the script's restart file written at the step it stopped
at. That attempt is a failure now, not a success, and `retries:` goes on from its restart
file, attempt after attempt, to the last step. The step runs with `-screen none`, so only
LAMMPS's log file says it stopped. With CI=true a missing `lmp` fails instead of skipping."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from m27.events import StepFailed, StepSucceeded
from m27.executors.engines.lammps import restart_step
from tests.e2e._helpers import (
    LAMMPS_EXAMPLE,
    M27,
    events,
    lammps_pipeline,
    lammps_thermo_steps,
    node_state,
)
from tests.services import need_program

pytestmark = [pytest.mark.service, pytest.mark.slow]

need_program("lmp", "LAMMPS", "apt-get install lammps")

#: 256 atoms: ~10,000 steps/s on an idle core, so several 2 s attempts, idle or loaded
STEPS, EVERY = 60_000, 1000


def test_attempts_stopped_by_timer_timeout_fail_and_retries_go_on_to_the_end(
    m27: M27, tmp_path: Path, m27_home: Path
) -> None:
    timed = tmp_path / "timed.in"  # LAMMPS's wall-time limit: 2 s an attempt
    timed.write_text(f"timer timeout 2 every 100\ninclude {LAMMPS_EXAMPLE / 'melt.in'}\n")
    spec, out = lammps_pipeline(
        tmp_path, steps=STEPS, every=EVERY, script=timed,
        melt=("checkpoint: 5m", "retries: 100"), options="-screen none",
    )  # fmt: skip
    done = m27("run", str(spec), "--plain", timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    failed = [e for e in events(m27_home) if isinstance(e, StepFailed) and e.step == "melt"]
    assert failed, done.stdout[-3000:]  # a machine that ran 60,000 steps in 2 s: none
    (run,) = node_state(m27_home).runs.values()
    reached = []
    for e in failed:
        assert e.exit_code == 0
        m = re.fullmatch(
            r"LAMMPS stopped at its `timer timeout`, its wall-time limit \(its restart file is "
            rf"at step (\d+)\), before the end of its input script; `m27 run --resume "
            rf"{run.run_id}` continues it",
            e.reason,
        )
        assert m, e.reason
        reached.append(int(m[1]))
    assert reached == sorted(set(reached)) and reached[-1] < STEPS, reached  # each got further
    assert [
        e.attempt for e in events(m27_home) if isinstance(e, StepSucceeded) and e.step == "melt"
    ] == [len(failed) + 1]
    # the last attempt read the restart file the one before wrote as it stopped, and ran
    # from there to the last step
    thermo = lammps_thermo_steps((out / "melt.log").read_text())
    assert thermo[0] == reached[-1] and thermo[-1] == STEPS, (thermo[:3], thermo[-3:])
    assert restart_step((out / "m27.restart").read_bytes()) == STEPS
