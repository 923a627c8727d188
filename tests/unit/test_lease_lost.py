"""A lease lost between its grant and its step's start is lost all the same.

The lease's follower thread reads the grant; the step's thread picks it up when it next
wakes. On a loaded node a GpuLost (or the agent taking the lease back) can be read in
between: the step must still learn it, or it starts on a lost GPU and, as a guest, waits
at its gate for good (CI caught this: a requeued guest that never asked again)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from m27 import events as ev
from m27.executors.local import StepLaunch, StepResult
from m27.node.lease import AgentLease, Granted, run_leased
from m27.store.sqlite import open_store
from tests.waiting import wait_until


@pytest.mark.parametrize(
    ("taken", "why"),
    [
        (ev.GpuLost(at=2.0, gpu=0, uuid="GPU-sim-0000", reason="lost"), "GPU 0 lost"),
        (ev.LeaseReleased(at=2.0, run_id="r", step="g", gpus=(0,)), "the node agent took"),
    ],
    ids=["gpu-lost", "taken-back"],
)
def test_a_grant_lost_before_its_step_picked_it_up_reaches_the_step(
    m27_home: Path, taken: ev.Event, why: str
) -> None:
    store = open_store(m27_home)
    lease = AgentLease(store, m27_home, embed=False, poll=0.01)
    got: list[Granted | None] = []
    waiter = threading.Thread(target=lambda: got.append(lease.acquire("r", "g", "gpu")))
    waiter.start()
    wait_until(lambda: any(isinstance(r.event, ev.StepRequested) for r in store.read()))
    # One batch: the follower reads and applies both under its lock before the step's
    # thread can wake to pick the grant up, as a slow wake on a loaded node does.
    store.append([ev.LeaseGranted(1.0, "r", "g", (0,), tier="ready"), taken])
    waiter.join(30)
    assert got and got[0] is not None
    assert got[0].lost.is_set() and got[0].why.startswith(why)
    lease.close()
    store.close()


def test_a_step_whose_gpu_was_lost_before_it_started_asks_again_and_runs_once(
    m27_home: Path, tmp_path: Path
) -> None:
    """Through the runner: the step is requeued without starting (no process on the lost
    GPU), gives that lease back, and runs once on the GPU it is granted next."""
    store = open_store(m27_home)
    lease = AgentLease(store, m27_home, embed=False, poll=0.01)
    step = StepLaunch(
        run_id="r",
        step="g",
        argv=(sys.executable, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"),
        log_path=tmp_path / "g.log",
    )
    done: list[StepResult | None] = []
    runner = threading.Thread(
        target=lambda: done.append(run_leased(lease, step, "gpu", cancel=threading.Event()))
    )
    runner.start()

    def asked() -> int:
        return sum(isinstance(r.event, ev.StepRequested) for r in store.read())

    wait_until(lambda: asked() == 1, what="the first request")
    lost = ev.GpuLost(at=2.0, gpu=0, uuid="GPU-sim-0000", reason="lost")
    store.append([ev.LeaseGranted(1.0, "r", "g", (0,)), lost])
    wait_until(lambda: asked() == 2, what="the request after the loss")
    store.append([ev.LeaseGranted(3.0, "r", "g", (1,))])
    runner.join(30)
    assert done and done[0] is not None and done[0].ok
    kinds = [
        (type(e).__name__, getattr(e, "gpus", None))
        for e in (r.event for r in store.read())
        if not isinstance(e, ev.GpuLost)
    ]
    assert kinds == [
        ("StepRequested", 0),
        ("LeaseGranted", (0,)),
        ("StepRequeued", None),
        ("LeaseReleased", (0,)),
        ("StepRequested", 0),
        ("LeaseGranted", (1,)),
        ("StepStarted", (1,)),
        ("StepSucceeded", None),
        ("LeaseReleased", (1,)),
    ]
    (requeued,) = [r.event for r in store.read() if isinstance(r.event, ev.StepRequeued)]
    assert requeued.reason == "GPU 0 lost"
    assert (tmp_path / "g.log").read_text().count("\n1\n") == 1  # it ran on GPU 1, once
    lease.close()
    store.close()
