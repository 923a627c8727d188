"""examples/gromacs/replicas.yaml with real GROMACS: each replica is prepared with its own
velocity seed, simulated and analysed in its own folder, and `compare` reads them all.
With CI=true a missing `gmx` fails instead of skipping."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from m27.events import CheckpointRestored, CheckpointWritten, StepRequeued, StepStarted
from tests.e2e._helpers import M27, ROOT, events, file_captures, m27_env, node_state
from tests.services import need_program
from tests.waiting import wait_until

pytestmark = [pytest.mark.service, pytest.mark.slow]

need_program("gmx", "GROMACS", "apt-get install gromacs")


def _example(tmp_path: Path) -> Path:
    example = tmp_path / "gromacs"
    shutil.copytree(ROOT / "examples" / "gromacs", example, ignore=shutil.ignore_patterns("out"))
    return example


def _m27_run(*args: str) -> subprocess.Popen[bytes]:
    """`m27 ARGS` in a session of its own (a power cut takes it whole), output discarded."""
    return subprocess.Popen(
        [sys.executable, "-m", "m27.cli", *args],
        env=m27_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def test_replicas_run_apart_with_their_own_seeds_and_are_compared(
    m27: M27, tmp_path: Path, m27_home: Path
) -> None:
    example = _example(tmp_path)
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


def test_a_power_cut_resumes_each_replica_from_its_own_capture(
    m27: M27, tmp_path: Path, m27_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill -9 of `m27 run` and both mdruns; the resume restores md_simulation.1 from its
    own newest capture and md_simulation.2 from its own, and each mdrun continues there."""
    monkeypatch.setenv("M27_CAPTURE_POLL", "0.3")
    spec = _example(tmp_path) / "replicas.yaml"
    sets = ("--set", "NSTEPS=1000000", "--set", "CHECKPOINT=1s", "--set", "SEEDS=1 2")
    first = _m27_run("run", str(spec), "--plain", *sets)
    replicas = ("md_simulation.1", "md_simulation.2")
    try:
        wait_until(
            lambda: (
                all(n >= 2 for n in Counter(e.step for e in file_captures(m27_home)).values())
                and len({e.step for e in file_captures(m27_home)}) == 2
            ),
            timeout=300,
            what="two captures of each replica",
        )
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the power cut
        first.wait()
    for e in events(m27_home):
        if isinstance(e, StepStarted) and e.step in replicas:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(e.pgid, signal.SIGKILL)
    newest = {e.step: e for e in file_captures(m27_home)}  # each replica's last capture

    again = _m27_run("run", "--resume", "last", "--plain", *sets)
    try:

        def continued() -> dict[str, CheckpointRestored] | None:
            restored = {e.step: e for e in events(m27_home) if isinstance(e, CheckpointRestored)}
            if set(restored) != set(replicas):
                return None
            for step, e in restored.items():
                log = (m27_home / "runs" / e.run_id / f"{step}.log").read_text()
                if not re.search(rf"continuing from step {e.engine_step}\b", log):
                    return None
            return restored

        restored = wait_until(continued, timeout=300, what="both replicas continuing")
    finally:
        cancel = m27("cancel", "last")
        again.wait(timeout=120)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    for step in replicas:
        _from_its_own_newest(m27_home, restored[step], newest[step])


def _from_its_own_newest(
    home: Path, restored: CheckpointRestored, newest: CheckpointWritten
) -> None:
    """The resume restored the replica's own newest state: its last capture, or a newer
    capture of its own files that the resumed run made first. That happens where mdrun
    wrote its .cpt again between the last capture and the power cut (the capture waits
    for the file to hold still for two looks; the resume captures it before restoring),
    or where the replica, granted as a guest beside the killed run's leases before the
    node knew them dead, was moved to the GPU they freed (stopped, captured, requeued)."""
    assert f"/{restored.step}/" in restored.path  # its own, not the other replica's
    if restored.path == newest.path:
        assert restored.engine_step == newest.engine_step
        return
    (capture,) = [
        e for e in file_captures(home) if e.run_id == restored.run_id and e.path == restored.path
    ]
    assert capture.step == restored.step
    assert restored.engine_step is not None and newest.engine_step is not None
    assert restored.engine_step >= newest.engine_step
    log = (home / "runs" / restored.run_id / f"{restored.step}.log").read_text()
    moved = [
        e
        for e in events(home)
        if isinstance(e, StepRequeued) and (e.run_id, e.step) == (restored.run_id, restored.step)
    ]
    assert moved or "complete and newer than the last capture" in log, log[-2000:]
