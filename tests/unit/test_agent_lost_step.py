"""A step whose process and requester are both gone is `lost` to the agent, unless the log
already says how it ended: the node service's crash watcher stops a dead run's steps, then
records `run crashed: ...`. The agent, its copy of the log a moment old, recorded `lost`
over that end (seen under load in tests/e2e/test_crash_truth.py)."""

from __future__ import annotations

from pathlib import Path

from m27 import events as ev
from m27.clock import FakeClock
from m27.gpu.sim import SimBackend
from m27.node.agent import Agent
from m27.store.memory import MemoryEventStore

#: Far above any pid_max: a process that is gone.
GONE = 90_000_000


def _agent(home: Path) -> tuple[Agent, MemoryEventStore]:
    store = MemoryEventStore()
    store.append(
        [
            ev.StepRequested(at=0.0, run_id="r", step="md", type="gpu", priority=5,
                             gpus=1, gpu_memory=0, owner="ann", pid=GONE),
            ev.LeaseGranted(0.0, "r", "md", (0,)),
            ev.StepStarted(at=0.0, run_id="r", step="md", attempt=1, pid=GONE + 1,
                           pgid=GONE + 1, command=("gmx",), gpus=(0,)),
        ]
    )  # fmt: skip
    agent = Agent(store, SimBackend(1), home, clock=FakeClock(100.0), snapshot_every=None)
    agent.poll()
    return agent, store


def test_a_step_the_crash_watcher_closed_a_moment_ago_is_not_called_lost(m27_home: Path) -> None:
    agent, store = _agent(m27_home)
    crashed = "run crashed: flow run process 7 on vm died without recording an end"
    store.append([ev.StepFailed(5.0, "r", "md", 1, 5.0, crashed)])  # not read by the agent yet
    found = agent._check_lost(100.0)
    assert [type(e).__name__ for e in found] == ["LeaseReleased"]  # its GPU, nothing more


def test_a_step_nobody_closed_is_lost(m27_home: Path) -> None:
    agent, _store = _agent(m27_home)
    found = agent._check_lost(100.0)
    assert [type(e).__name__ for e in found] == ["LeaseReleased", "StepFailed"]
    failed = found[1]
    assert isinstance(failed, ev.StepFailed)
    assert failed.reason == f"lost: its process and its requester (pid {GONE}) are gone"
