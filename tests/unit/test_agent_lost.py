"""A GPU lost mid-run with a primary and a guest on it: both are stopped and requeued on
the GPU that is left, the lost GPU is never granted again, and everything finishes.

(Which of the two gets the remaining GPU's guest slot first depends on which process
stops first, so only what holds either way is asserted.)"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from m27 import events as ev
from m27.cli.commands import queue
from tests.unit.agent_helpers import GiB, make_node, run_step_leased, step_argv
from tests.waiting import wait_until


def test_losing_a_gpu_requeues_its_primary_and_guest_on_the_gpu_left(
    m27_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    node = make_node(m27_home, gpus=2).start()
    lease = node.lease()
    flags = {name: tmp_path / f"{name}.done" for name in ("a", "b", "g")}

    def step(name: str, priority: int) -> object:
        argv = step_argv(tmp_path / f"{name}.txt", compute=0.02, io=0.02, until=flags[name])
        # 7 GiB each: beside the primary on the GPU left (16 GiB) only one more fits, so of
        # the two steps requeued there one must wait
        return run_step_leased(lease, "r", name, argv, priority=priority, gpu_memory=7 * GiB)

    # the steps loop until their flag exists: written in any case, so that a failing test
    # leaves no step process behind
    try:
        runs = {"a": step("a", 9)}
        wait_until(lambda: len(node.of(ev.StepStarted)) == 1)
        runs["b"] = step("b", 8)
        wait_until(lambda: len(node.of(ev.StepStarted)) == 2)
        runs["g"] = step("g", 1)  # a guest beside one of them
        # its process started (GuestStarted is the grant's: a GPU lost before the step's
        # start is another story, in test_lease_lost.py)
        wait_until(lambda: any(e.step == "g" for e in node.of(ev.StepStarted)))  # type: ignore[attr-defined]
        (guest,) = [e for e in node.of(ev.GuestStarted) if e.step == "g"]  # type: ignore[attr-defined]
        lost_gpu = guest.gpu  # type: ignore[attr-defined]
        granted = node.of(ev.LeaseGranted)
        (host,) = [e.step for e in granted if e.gpus == (lost_gpu,) and e.step != "g"]  # type: ignore[attr-defined]

        node.backend.lose(lost_gpu)

        def count(cls: type[ev.Event], name: str) -> int:
            return sum(getattr(e, "step", "") == name for e in node.of(cls))

        # both steps that were on it are stopped and ask again (for the GPU that is left)
        wait_until(lambda: count(ev.StepRequested, host) == 2 and count(ev.StepRequested, "g") == 2)
        # one of them takes the remaining GPU's guest slot; the other waits, and says why
        wait_until(lambda: count(ev.LeaseGranted, host) + count(ev.LeaseGranted, "g") == 3)
        waiting = host if count(ev.LeaseGranted, host) == 1 else "g"
        monkeypatch.setenv("M27_GPUS", "sim:2x16GiB")  # as the node's GPUs
        assert queue.run(argparse.Namespace(why=f"r/{waiting}", json=False)) == 0
        assert f"GPU {lost_gpu} lost" in capsys.readouterr().out
    finally:
        for f in flags.values():
            f.write_text("done")
    for r in runs.values():
        result = r.wait()  # type: ignore[attr-defined]
        assert result is not None and result.ok
    assert count(ev.StepStarted, host) == 2 and count(ev.StepStarted, "g") == 2
    events = node.events()
    (lost,) = [e for e in events if isinstance(e, ev.GpuLost)]
    assert lost.gpu == lost_gpu and lost.uuid == f"GPU-sim-{lost_gpu:04d}"
    after = events[events.index(lost) :]
    regrants = [e for e in after if isinstance(e, ev.LeaseGranted)]
    assert regrants and all(lost_gpu not in e.gpus for e in regrants)
    assert {e.step for e in regrants} == {host, "g"}
    # each requeued step gave its first lease back before asking again
    for name in (host, "g"):
        # The measured GPU memory is recorded after the release; a pause, resume or
        # promotion of the guest may land in the same tick as its end (the agent acts on
        # the log as it last read it: the primary ended, so it promotes a guest whose own
        # StepSucceeded it has not read yet; the book ignores it for a released lease):
        # none of them is the step's story.
        agent_roles = ("StepMemoryMeasured", "GuestPaused", "GuestResumed", "Promoted")
        kinds = [
            e.kind for e in after if getattr(e, "step", "") == name and e.kind not in agent_roles
        ]
        assert kinds.index("LeaseReleased") < kinds.index("StepRequested")
        assert kinds[-2:] == ["StepSucceeded", "LeaseReleased"]
    # nothing holds a lease now, and the queue says the GPU is lost
    node.agent.poll()
    assert node.agent.book.held == {} and node.agent.book.lost_gpus == {lost_gpu}
    lease.close()
    node.close()
