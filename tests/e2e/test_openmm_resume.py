"""OpenMM as a Python library: a power cut mid-dynamics, then `m27 run --resume`, goes on
from the newest checkpoint the script saved through `m27.Checkpointer`.

The OpenMM example's own scripts (examples/openmm: a 774-atom TIP3P box, Langevin
dynamics on OpenMM's CPU platform) with `checkpoint: 1s`. After two checkpoints, kill -9
of `m27 run` and of the script; `m27 run --resume` must restore the newest checkpoint
(`CheckpointRestored` at its step), the script must say it resumed there, its energy log
must read as one run (every row from the first to the last step, once), and the
temperature must go on from where it was: velocities lost in the restore would drop it
by about half within the next 0.2 ps. And `m27 cancel` mid-dynamics: the script saves at
the stop (`m27.watch_stop()`), so the resume goes on from the step where it was
cancelled, not from the last periodic checkpoint. With CI=true a missing `openmm` fails.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from m27.events import CheckpointRestored, CheckpointWritten
from tests.e2e._helpers import M27, ROOT, events, power_cut, start_run
from tests.services import need_module
from tests.waiting import wait_until

pytestmark = [pytest.mark.service, pytest.mark.slow]

EXAMPLE = ROOT / "examples" / "openmm"
STEPS, EVERY = 3000, 100  # ~200 steps/s on two idle cores

need_module("openmm", "OpenMM", "pip install openmm")


def _pipeline(tmp_path: Path, checkpoint: str = "1s") -> tuple[Path, Path]:
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
            checkpoint: {checkpoint}
            command: python {EXAMPLE / "simulate.py"} --dir {out} --steps {STEPS} --report-every {EVERY}
        """)
    )
    return path, out


def _rows(out: Path) -> tuple[list[int], dict[int, float]]:
    """The steps of energy.csv's rows, and the temperature at each."""
    lines = (out / "energy.csv").read_text().splitlines(keepends=True)[1:]
    rows = [line.split(",") for line in lines if line.endswith("\n")]  # whole rows only
    steps = [int(row[0]) for row in rows]
    return steps, {int(row[0]): float(row[4]) for row in rows}


def _saves(home: Path) -> list[CheckpointWritten]:
    return [e for e in events(home) if isinstance(e, CheckpointWritten) and e.step == "dynamics"]


def test_power_cut_mid_openmm_resumes_from_the_newest_checkpoint(
    m27: M27, tmp_path: Path, m27_home: Path
) -> None:
    spec, out = _pipeline(tmp_path)
    power_cut(spec, m27_home, "dynamics", lambda: len(_saves(m27_home)) >= 2, "two saves", 300)
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

    steps, at = _rows(out)
    assert steps == list(range(EVERY, STEPS + 1, EVERY))  # cut back, then continued
    assert abs(at[start + EVERY] - at[start]) < 50, (at[start], at[start + EVERY])
    assert (out / "final.pdb").read_text().count("HETATM") == 774


def test_cancel_mid_openmm_saves_at_the_stop_and_the_resume_goes_on_from_there(
    m27: M27, tmp_path: Path, m27_home: Path
) -> None:
    spec, out = _pipeline(tmp_path, checkpoint="1h")  # no periodic save: only the stop's
    proc = start_run(spec)

    def dynamics_under_way() -> bool:
        return (out / "energy.csv").exists() and len(_rows(out)[0]) >= 3

    try:
        wait_until(dynamics_under_way, timeout=300, what="300 steps of dynamics")
        cancelled = m27("cancel", "last")
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
        assert proc.wait(timeout=120) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
    saved = [e.sim_step for e in _saves(m27_home)]
    assert len(saved) == 1 and 3 * EVERY <= saved[0] < STEPS, saved
    assert _rows(out)[0][-1] == saved[0]  # the log stops where the save says it does
    status = m27("status", "last", "--json")
    assert '"cancelled"' in status.stdout, status.stdout

    done = m27("run", "--resume", "last", "--plain", timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    restored = [e for e in events(m27_home) if isinstance(e, CheckpointRestored)]
    assert [e.sim_step for e in restored] == saved
    assert f"resumed from the checkpoint at step {saved[0]} on OpenMM" in done.stdout
    assert _rows(out)[0] == list(range(EVERY, STEPS + 1, EVERY))
