"""A lease lost between its grant and its step's start is lost all the same.

The lease's follower thread reads the grant; the step's thread picks it up when it next
wakes. On a loaded node a GpuLost (or the agent taking the lease back) can be read in
between: the step must still learn it, or it starts on a lost GPU and, as a guest, waits
at its gate for good (CI caught this: a requeued guest that never asked again)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from m27 import events as ev
from m27.node.lease import AgentLease, Granted
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
