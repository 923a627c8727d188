"""A real single-node Slurm for the session, started by infra/scripts/start-slurm.sh.

The cluster lives in ``$M27_SLURM_DIR`` (default /tmp/m27-slurm) and is shared by pytest
sessions running at the same time: each session registers itself under ``users/``, and
the last one out stops the daemons if a fixture started them (a cluster someone started
by hand is left running). Without Slurm (not root, no apt-get): CI=true fails the run,
elsewhere the tests are skipped with the reason.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services import unavailable

ROOT = Path(__file__).resolve().parents[2]
START = ROOT / "infra" / "scripts" / "start-slurm.sh"
STOP = ROOT / "infra" / "scripts" / "stop-slurm.sh"

#: A step that checkpoints with m27.Checkpointer and stops on USR1/TERM (exit 75, so the
#: batch script requeues it after USR1). The first start counts forever; a restart that
#: resumed from a checkpoint counts 20 more and writes what it saw to argv[1].
CKPT_STEP = r"""
import json, os, sys, time
import numpy as np
import m27
from m27.executors.slurm import REQUEUE_EXIT_CODE, watch_preemption

stop = watch_preemption()
ck = m27.Checkpointer(interval=3600)
restored = ck.restore()
state, start = restored if restored is not None else ({"x": np.zeros(1000)}, 0)
print(f"start at {start} resume={os.environ.get('M27_RESUME_FROM')}", flush=True)
end = start + 20 if restored is not None else 10**9
i = start
while i < end:
    state["x"] += 1.0
    i += 1
    time.sleep(0.05)
    if stop.is_set():
        ck.save(state, i)
        ck.flush()
        print(f"saved at {i}", flush=True)
        sys.exit(REQUEUE_EXIT_CODE)
ck.close()
out = {
    "start": start,
    "end": i,
    "x": float(state["x"][0]),
    "resume": os.environ.get("M27_RESUME_FROM"),
    "restart": os.environ.get("SLURM_RESTART_COUNT"),
}
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
print("done", flush=True)
"""


def _unavailable(reason: str) -> None:
    unavailable(f"Slurm could not be started: {reason}")


def _alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text().strip()), 0)
    except (OSError, ValueError):
        return False
    return True


def _live_users(users: Path) -> list[Path]:
    out = []
    for entry in users.glob("*"):
        try:
            os.kill(int(entry.name), 0)
        except (OSError, ValueError):
            entry.unlink(missing_ok=True)  # a session that died without cleaning up
            continue
        out.append(entry)
    return out


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Path]:
    """Start (or join) the test cluster; yields its slurm.conf, also set as $SLURM_CONF."""
    base = Path(os.environ.get("M27_SLURM_DIR", "/tmp/m27-slurm"))
    ran_before = _alive(base / "run" / "slurmctld.pid")
    try:
        done = subprocess.run(
            ["bash", str(START), str(base)],
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        _unavailable(f"{START.name} did not finish: {exc}")
    if done.returncode != 0:
        _unavailable(f"{START.name} failed: {(done.stderr or done.stdout).strip()[-800:]}")
    if not ran_before:
        (base / "started-by-fixture").touch()
    users = base / "users"
    users.mkdir(exist_ok=True)
    me = users / str(os.getpid())
    me.touch()
    conf = base / "etc" / "slurm.conf"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", str(conf))
        # The batch script and the test steps import m27 from this checkout.
        mp.setenv(
            "PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        )
        yield conf
    me.unlink(missing_ok=True)
    if not _live_users(users) and (base / "started-by-fixture").exists():
        (base / "started-by-fixture").unlink(missing_ok=True)
        subprocess.run(["bash", str(STOP), str(base)], capture_output=True, timeout=60, check=False)


def scontrol(*args: str) -> str:
    return subprocess.run(
        ["scontrol", *args], capture_output=True, text=True, check=True, timeout=30
    ).stdout


def job_state(job_id: str) -> str:
    """The job's JobState as the test cluster's controller sees it now."""
    out = scontrol("show", "job", "-o", job_id)
    return out.split("JobState=")[1].split()[0]
