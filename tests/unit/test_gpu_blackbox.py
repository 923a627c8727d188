"""A black-box step (mdrun, any program that never calls m27.io_wait) on simulated GPUs.

It has a channel (the runner gives every leased step one) but never enters an I/O block,
so the simulator must count it as computing the whole time it runs, even while it is busy
writing and fsyncing files as mdrun does with its trajectory: never a false I/O gap that
would let a guest onto its GPU. Only a real stop (SIGSTOP by the agent) makes it idle.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from m27.gpu.sim import SimBackend
from m27.step._channel import Channel
from tests.waiting import wait_until

GiB = 1024**3

WRITER = r"""
import os, sys
print("ready", flush=True)
with open(sys.argv[1], "ab") as f:
    while True:  # a trajectory writer: append a frame, flush it to disk, again
        f.write(os.urandom(65536))
        f.flush()
        os.fsync(f.fileno())
"""


def test_a_black_box_step_counts_as_computing_all_the_time_even_while_writing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "step.chan"
    Channel.create(path).close()
    env = {**os.environ, "M27_CHANNEL": str(path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path / "traj.bin")],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    sim = SimBackend(1)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        sim.attach(0, proc.pid, 2 * GiB, channel_path=path)
        samples = [sim.sample(float(t))[0] for t in range(200)]
        assert {s.utilization_gpu for s in samples} == {100.0}
        assert {s.processes[0].sm_util for s in samples} == {100.0}
        assert (tmp_path / "traj.bin").stat().st_size > 0  # it really was writing
        proc.send_signal(signal.SIGSTOP)
        wait_until(lambda: sim.sample(300.0)[0].utilization_gpu == 0.0, 30, what="stopped")
        proc.send_signal(signal.SIGCONT)
    finally:
        proc.kill()
        proc.wait()
        sim.close()
