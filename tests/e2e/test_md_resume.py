"""The MD example killed with SIGKILL mid-run resumes from its newest checkpoint.

This is the promise checkpoints exist for, tested the way it happens: a real child
process, ``kill -9`` at an arbitrary moment (the logs are usually ahead of the last
checkpoint, and a save may be half written), then the same command again. The resumed
run must continue the step counter and the energy, and end bit for bit where an
uninterrupted run with the same seed ends.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "md"
STEPS, LOG_EVERY, CHECKPOINT_EVERY = 2400, 10, 100
KILL_AFTER_STEP = 5 * CHECKPOINT_EVERY  # well before the end, after a few checkpoints


def child_env(tmp_path: Path, checkpoints: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("M27_")}
    env.update(
        PYTHONPATH=str(ROOT),
        M27_HOME=str(tmp_path / "home"),
        M27_CHECKPOINT_DIR=str(checkpoints),
    )
    return env


def md_command(system: Path, out: Path) -> list[str]:
    return [
        sys.executable,
        str(EXAMPLE / "md.py"),
        *("--system", str(system), "--out", str(out), "--steps", str(STEPS)),
        *("--log-every", str(LOG_EVERY), "--frame-every", "200"),
        *("--checkpoint-every-steps", str(CHECKPOINT_EVERY), "--backend", "numpy"),
    ]


def last_logged_step(energy_csv: Path) -> int:
    if not energy_csv.exists():
        return -1
    rows = [line for line in energy_csv.read_text().split("\n")[1:-1] if line]
    return int(rows[-1].split(",", 1)[0]) if rows else -1


def energy_table(path: Path) -> np.ndarray:
    return np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)


def run_uninterrupted(tmp_path: Path, system: Path, out: Path) -> None:
    """The reference: the same run, never stopped."""
    reference = subprocess.run(
        md_command(system, out),
        env=child_env(tmp_path, tmp_path / "reference-checkpoints"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert reference.returncode == 0, reference.stderr


def assert_same_run(out: Path, reference_out: Path) -> None:
    """Logs, trajectory and final state are the uninterrupted run's, bit for bit."""
    assert (out / "energy.csv").read_text() == (reference_out / "energy.csv").read_text()
    assert (out / "trajectory.xyz").read_text() == (reference_out / "trajectory.xyz").read_text()
    final, expected = np.load(out / "final.npz"), np.load(reference_out / "final.npz")
    assert np.array_equal(final["positions"], expected["positions"])
    assert np.array_equal(final["velocities"], expected["velocities"])


@pytest.fixture
def system(tmp_path: Path) -> Path:
    (tmp_path / "small.in").write_text("cells = 3\ndensity = 0.8442\ntemperature = 1.5\nseed = 9\n")
    target = tmp_path / "system.npz"
    prepare = [sys.executable, str(EXAMPLE / "prepare.py")]
    arguments = ["--input", str(tmp_path / "small.in"), "--out", str(target)]
    subprocess.run([*prepare, *arguments], check=True, capture_output=True)
    return target


def test_md_killed_mid_run_resumes_its_step_counter_energy_and_trajectory(
    tmp_path: Path, system: Path
) -> None:
    reference_out, out = tmp_path / "reference", tmp_path / "killed"
    run_uninterrupted(tmp_path, system, reference_out)

    env = child_env(tmp_path, tmp_path / "checkpoints")
    victim = subprocess.Popen(
        md_command(system, out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )

    def far_enough() -> bool:
        assert victim.poll() is None, "md.py ended before it could be killed"
        return last_logged_step(out / "energy.csv") >= KILL_AFTER_STEP

    wait_until(far_enough, timeout=300, what=f"md.py to log step {KILL_AFTER_STEP}")
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=30) == -signal.SIGKILL
    assert victim.stderr is not None
    victim.stderr.close()
    reached = last_logged_step(out / "energy.csv")
    assert KILL_AFTER_STEP <= reached < STEPS

    resumed = subprocess.run(
        md_command(system, out), env=env, capture_output=True, text=True, timeout=120
    )
    assert resumed.returncode == 0, resumed.stderr
    match = re.search(r"resumed from checkpoint at step (\d+)", resumed.stdout)
    assert match, resumed.stdout
    start = int(match.group(1))
    assert 0 < start <= reached and start % CHECKPOINT_EVERY == 0
    assert f"step {STEPS}/{STEPS}" in resumed.stdout

    # The log reads as one run: every step once, in order, up to the last.
    table = energy_table(out / "energy.csv")
    assert table[:, 0].astype(int).tolist() == list(range(0, STEPS + 1, LOG_EVERY))
    # The energy carries on across the resume: no jump beyond the usual fluctuation.
    total = table[:, 4]
    at = start // LOG_EVERY
    usual = np.max(np.abs(np.diff(total[: at + 1])))
    assert abs(total[at + 1] - total[at]) <= 2 * usual
    # And the run is the uninterrupted one, bit for bit.
    assert_same_run(out, reference_out)


def test_md_asked_to_stop_saves_that_step_and_resumes_bit_for_bit(
    tmp_path: Path, system: Path
) -> None:
    """SIGTERM (`m27 cancel`, a timeout, preemption) between two periodic checkpoints: md.py
    saves at the step it reached (m27.watch_stop) and exits 75; run again, it goes on from
    exactly that step, and ends where an uninterrupted run ends, bit for bit."""
    reference_out, out = tmp_path / "reference", tmp_path / "stopped"
    command = md_command(system, out)
    command[command.index("--checkpoint-every-steps") + 1] = str(STEPS)  # none periodic
    run_uninterrupted(tmp_path, system, reference_out)

    env = child_env(tmp_path, tmp_path / "checkpoints")
    victim = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    wait_until(
        lambda: last_logged_step(out / "energy.csv") >= KILL_AFTER_STEP,
        timeout=300,
        what=f"md.py to log step {KILL_AFTER_STEP}",
    )
    victim.send_signal(signal.SIGTERM)
    said, _ = victim.communicate(timeout=60)
    assert victim.returncode == 75, said
    match = re.search(r"stopped at step (\d+) \(asked to\): saved", said)
    assert match, said
    stopped = int(match.group(1))
    assert KILL_AFTER_STEP <= stopped < STEPS

    resumed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from checkpoint at step {stopped}\n" in resumed.stdout
    assert_same_run(out, reference_out)
