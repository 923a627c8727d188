"""`gmx mdrun -maxh H` with real GROMACS: mdrun stops after H hours, before its last step,
and exits 0. That attempt is a failure now, not a success, and `retries:` goes on from its
checkpoint, attempt after attempt, to the end: the energy file has every frame once. With
CI=true a missing `gmx` fails instead of skipping."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from m27.events import StepFailed, StepSucceeded
from tests.e2e._helpers import M27, ROOT, assert_whole_energy_file, events, node_state
from tests.services import need_program

pytestmark = [pytest.mark.service, pytest.mark.slow]

need_program("gmx", "GROMACS", "apt-get install gromacs")

NSTEPS = 20000
#: 1.8 s of MD an attempt: the steps take several on this machine, idle or loaded
MAXH = "0.0005"


def test_attempts_stopped_at_maxh_fail_and_retries_go_on_to_the_end(
    m27: M27, tmp_path: Path, m27_home: Path
) -> None:
    out = tmp_path / "out"
    spec = tmp_path / "maxh.yaml"
    spec.write_text(
        textwrap.dedent(f"""\
        name: gmx-maxh
        pipeline:
          - name: prepare
            type: cpu
            command: python {ROOT / "examples" / "gromacs" / "prepare.py"} --nsteps {NSTEPS} --out {out} --box 2.1
          - name: md
            type: gpu
            depends_on: [prepare]
            workdir: {out}
            checkpoint: 5m
            retries: 100
            command: gmx mdrun -deffnm simulation -maxh {MAXH} -ntmpi 1 -ntomp 1
        """)
    )
    done = m27("run", str(spec), "--plain", timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    failed = [e for e in events(m27_home) if isinstance(e, StepFailed) and e.step == "md"]
    assert failed, done.stdout[-3000:]  # a machine that ran 20,000 steps in 1.8 s: none
    (run,) = node_state(m27_home).runs.values()
    for e in failed:
        assert e.exit_code == 0
        assert e.reason.startswith("mdrun stopped at -maxh, its run time limit, at step ")
        assert e.reason.endswith(f"`m27 run --resume {run.run_id}` continues it")
    assert [
        e.attempt for e in events(m27_home) if isinstance(e, StepSucceeded) and e.step == "md"
    ] == [len(failed) + 1]
    assert done.stdout.count("continuing from step") == len(failed)
    assert_whole_energy_file(out, NSTEPS)
    assert (out / "simulation.gro").exists()  # written at the last step only
