"""OpenMM as a Python library: a power cut mid-dynamics, then `m27 run --resume`, goes on
from the newest checkpoint the script saved through `m27.Checkpointer`.

The OpenMM example's own scripts (examples/openmm: a 774-atom TIP3P box, Langevin
dynamics on OpenMM's CPU platform) with `checkpoint: 1s`. After two checkpoints, kill -9
of `m27 run` and of the script; `m27 run --resume` must restore the newest checkpoint
(`CheckpointRestored` at its step), the script must say it resumed there, its energy log
must read as one run (every row from the first to the last step, once), and the
temperature must go on from where it was: velocities lost in the restore would drop it
by about half within the next 0.2 ps. With CI=true a missing `openmm` fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import textwrap
from pathlib import Path

import numpy as np
import pytest

from m27.events import CheckpointRestored, CheckpointWritten, StepStarted
from tests.e2e._helpers import M27, ROOT, events, start_run
from tests.services import need_module
from tests.waiting import wait_until

pytestmark = [pytest.mark.service, pytest.mark.slow]

EXAMPLE = ROOT / "examples" / "openmm"
STEPS, EVERY = 3000, 100  # ~200 steps/s on two idle cores

need_module("openmm", "OpenMM", "pip install openmm")


def _pipeline(tmp_path: Path) -> tuple[Path, Path]:
    out = tmp_path / "out"
    path = tmp_path / "openmm.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        name: openmm-e2e
        pipeline:
          - name: prepare
            type: cpu
            command: python {EXAMPLE / "prepare.py"} --out {out}
            output: {out}/start.pdb
          - name: dynamics
            type: gpu
            depends_on: [prepare]
            checkpoint: 1s
            command: python {EXAMPLE / "simulate.py"} --dir {out} --steps {STEPS} --report-every {EVERY}
        """)
    )
    return path, out


def _saves(home: Path) -> list[CheckpointWritten]:
    return [e for e in events(home) if isinstance(e, CheckpointWritten) and e.step == "dynamics"]


def test_power_cut_mid_openmm_resumes_from_the_newest_checkpoint(
    m27: M27, tmp_path: Path, m27_home: Path
) -> None:
    spec, out = _pipeline(tmp_path)
    proc = start_run(spec, new_session=True)
    try:
        wait_until(lambda: len(_saves(m27_home)) >= 2, timeout=300, what="two checkpoints")
        started = [e for e in events(m27_home) if isinstance(e, StepStarted)]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the power cut: m27 run, then the script
        proc.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(started[-1].pgid, signal.SIGKILL)
    saved = [e.sim_step for e in _saves(m27_home)]
    assert saved == sorted(saved) and all(s % EVERY == 0 for s in saved), saved
    assert saved[-1] < STEPS, "the dynamics ended before the power cut"

    done = m27("run", "--resume", "last", "--plain", timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    restored = [e for e in events(m27_home) if isinstance(e, CheckpointRestored)]
    assert len(restored) == 1 and restored[0].step == "dynamics"
    # the newest checkpoint the log recorded, or one committed in the instant before the
    # kill whose event was not appended yet
    start = restored[0].sim_step
    assert saved[-1] <= start < STEPS and start % EVERY == 0, (saved, start)
    assert f"resumed from the checkpoint at step {start} on OpenMM" in done.stdout

    table = np.loadtxt(out / "energy.csv", delimiter=",", skiprows=1, ndmin=2)
    steps, temperature = table[:, 0].astype(int), table[:, 4]
    assert steps.tolist() == list(range(EVERY, STEPS + 1, EVERY))  # cut back, then continued
    at = {s: t for s, t in zip(steps.tolist(), temperature.tolist(), strict=True)}
    assert abs(at[start + EVERY] - at[start]) < 50, (at[start], at[start + EVERY])
    assert (out / "final.pdb").read_text().count("HETATM") == 774
