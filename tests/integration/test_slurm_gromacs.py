"""GROMACS under a real Slurm time limit: the signal makes mdrun checkpoint, and the
requeued job resumes from that checkpoint (`-cpi`, added by the batch script).

A 2-minute limit with `--signal=B:USR1@100`: Slurm sends USR1 20-80 s in (it checks limits
about every 30 s); the batch script passes it on as mdrun's checkpoint signal (TERM),
mdrun writes its checkpoint at the next neighbour-search step and exits 0, the script
requeues the job, and the restart runs `gmx mdrun ... -cpi simulation.cpt`. `-cpt 10`
(minutes) means no timed checkpoint comes first: the one resumed from is the signal's.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from m27.events import CheckpointWritten, StepStarted
from m27.executors.engines import plan_checkpoint
from m27.executors.local import SelfCheckpoint, StepLaunch
from m27.executors.slurm import run_slurm_step
from m27.store.sqlite import open_store
from tests.integration.slurm_fixture import slurm_cluster  # noqa: F401
from tests.integration.test_slurm import FAST, in_thread, of
from tests.services import need_program
from tests.waiting import wait_until

pytestmark = [pytest.mark.service, pytest.mark.slow, pytest.mark.usefixtures("slurm_cluster")]

ROOT = Path(__file__).resolve().parents[2]

need_program("gmx", "GROMACS", "apt-get install gromacs")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def test_time_limit_signal_makes_mdrun_checkpoint_and_the_requeued_job_resumes_from_it(
    tmp_path: Path, m27_home: Path
) -> None:
    out = tmp_path / "out"
    subprocess.run(
        [sys.executable, str(ROOT / "examples" / "gromacs" / "prepare.py"),
         "--nsteps", "50000000", "--out", str(out), "--box", "2.1"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    plan = plan_checkpoint(
        ["gmx", "mdrun", "-deffnm", "simulation", "-ntmpi", "1", "-ntomp", "1"], 600.0
    )
    launch = StepLaunch(
        "g1",
        "md",
        plan.argv,
        workdir=out,
        checkpoint_dir=m27_home / "checkpoints" / "g1" / "md",
        log_path=tmp_path / "md.log",
        self_checkpoint=SelfCheckpoint(
            files=plan.files, resume=plan.resume, signal=plan.signal, recipe=plan.recipe,
            poll=0.3,
        ),
    )  # fmt: skip
    store = open_store(m27_home)
    cancel = threading.Event()
    options = {"time": 2, "signal_before": 100, **FAST}
    t, box = in_thread(
        lambda: run_slurm_step(launch, store, options=options, site={}, cancel=cancel)
    )
    try:
        wait_until(
            lambda: "continuing from step" in _read(launch.log_path),
            timeout=300,
            interval=0.2,
            what="the requeued mdrun resuming",
        )
    finally:
        cancel.set()  # the resume is what this test is about; scancel the rest
        t.join(120)
    assert box, "the step did not end"
    log = _read(launch.log_path)
    gmx_log = _read(out / "simulation.log")
    assert "requeueing job" in log
    assert "Received the TERM signal" in gmx_log
    written = [int(s) for s in re.findall(r"Writing checkpoint, step (\d+)", gmx_log)]
    match = re.search(r"continuing from step (\d+)", log)
    assert written and match
    assert int(match.group(1)) == written[0] > 0  # resumed from the signal's checkpoint
    assert "Reading checkpoint file simulation.cpt" in gmx_log
    # the batch script asked the recipe at the restart: mdrun's outputs checked first
    assert "m27: outputs match simulation.cpt: mdrun appends to" in log, log[-3000:]
    captures = [e for e in of(store, CheckpointWritten) if e.source == "files"]
    assert captures and captures[0].files == ("simulation.cpt",)
    assert [e.step for e in of(store, StepStarted)].count("md") >= 1
