"""A guest that has not computed moves to a GPU that frees while its primary computes.

Found by a CI-like run of the replica example's power cut: the resumed run's two mdruns
were granted as guests beside the killed run's leases (not yet known dead); when those
were released, one guest was promoted on GPU 0 and the other stayed paused behind it,
for the whole MD run, beside an idle GPU 1. The agent now takes such a guest's lease back
(`moved to GPU 1, which is free`): the step stops, asks again and runs on the free GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

from m27 import events as ev
from m27.clock import FakeClock
from m27.gpu.sim import SimBackend
from m27.node.agent import Agent, channel_path
from m27.node.guests import MOVE_HOLD_S
from m27.policy import Move
from m27.step import Channel
from m27.store.memory import MemoryEventStore
from tests.unit.agent_helpers import STEP_RUNS, make_node, run_step_leased
from tests.waiting import wait_until

#: Far above any pid_max: a requester that never exists (nothing is signalled).
PID = 90_000_000

#: A primary that computes until it is stopped (the sim GPU counts a live process busy).
BUSY = (sys.executable, "-c", "import time; time.sleep(600)")


def _waits_at_its_gate(out: Path) -> tuple[str, ...]:
    """A step that computes only past its gate, then records the GPU it was given."""
    code = (
        "import os, sys, m27; m27.gate(); "
        "open(sys.argv[1], 'a').write(os.environ['CUDA_VISIBLE_DEVICES'] + '\\n')"
    )
    return (sys.executable, "-c", code, str(out))


def test_a_guest_that_never_computed_moves_to_the_gpu_that_freed(
    m27_home: Path, tmp_path: Path
) -> None:
    node = make_node(m27_home, gpus=2).start()
    try:
        lease = node.lease()
        first = run_step_leased(lease, "r", "a", BUSY)
        second = run_step_leased(lease, "r", "b", BUSY)
        wait_until(lambda: len(node.of(ev.StepStarted)) == 2, what="both primaries running")
        out = tmp_path / "gpu.txt"
        guest = run_step_leased(lease, "r", "g", _waits_at_its_gate(out))
        wait_until(lambda: len(node.of(ev.StepStarted)) == 3, what="the guest started")
        (granted,) = [g for g in node.of(ev.LeaseGranted) if g.step == "g"]  # type: ignore[attr-defined]
        assert granted.tier == "ready"  # type: ignore[attr-defined]
        on = granted.gpus[0]  # type: ignore[attr-defined]
        other = second if on == _gpu_of(node, "a") else first  # the primary on the other GPU
        # at its gate: a guest moved before it got there took the lease's removed channel
        # for none and computed on GPU `on` (test_a_moved_guests_gate_stays_shut...)
        gate = Channel.open(granted.channel, writable=False)  # type: ignore[attr-defined]
        try:
            wait_until(gate.at_gate, what="the guest waiting at its gate")
        finally:
            gate.close()
        other.cancel.set()  # the other GPU frees; nothing waits for it
        result = guest.wait(60)
        assert result is not None and result.ok, result
        free = 1 - on
        assert out.read_text() == f"{free}\n"  # it ran once, on the GPU that freed
        released = [e for e in node.of(ev.LeaseReleased) if e.step == "g"]  # type: ignore[attr-defined]
        assert released[0].reason == f"moved to GPU {free}, which is free"  # type: ignore[attr-defined]
        (requeued,) = node.of(ev.StepRequeued)
        assert requeued.reason == f"moved to GPU {free}, which is free"  # type: ignore[attr-defined]
        grants = [(g.gpus, g.tier) for g in node.of(ev.LeaseGranted) if g.step == "g"]  # type: ignore[attr-defined]
        assert grants == [((on,), "ready"), ((free,), "immediate")]
        log = (m27_home / "runs" / "r" / "g.log").read_text()
        assert f"stopped: moved to GPU {free}, which is free; requeued" in log, log
    finally:
        for run in STEP_RUNS:  # a failed test leaves the guest at its gate
            run.cancel.set()
        node.close()  # ends the steps and the lease


def _gpu_of(node: object, step: str) -> int:
    (g,) = [e for e in node.of(ev.LeaseGranted) if e.step == step]  # type: ignore[attr-defined]
    return int(g.gpus[0])


def test_a_gpu_a_guest_was_moved_to_takes_no_second_guest_until_the_first_asks_again(
    m27_home: Path,
) -> None:
    """Until the moved step asks again the GPU still looks idle, and each decision would
    move one more guest to it (to be granted back as a guest elsewhere)."""
    store = MemoryEventStore()
    agent = Agent(store, SimBackend(2), m27_home, clock=FakeClock(0.0), snapshot_every=None)
    log: list[ev.Event] = []
    for step, role in (("a", "primary"), ("g", "guest"), ("h", "guest")):
        log.append(ev.StepRequested(at=1.0, run_id="r", step=step, type="gpu", pid=PID))
        log.append(
            ev.LeaseGranted(1.0, "r", step, (0,), "immediate" if role == "primary" else "ready")
        )
        if role == "guest":
            log.append(ev.GuestStarted(at=1.0, run_id="r", step=step, gpu=0))
            log.append(ev.GuestPaused(at=1.0, run_id="r", step=step, gpu=0))
    store.append(log)
    for rec in store.read():
        agent.book.apply(rec)
    try:
        moved = agent._move(Move(("r", "g"), 0, 1), 10.0)
        assert isinstance(moved, ev.LeaseReleased)
        assert (moved.step, moved.gpus, moved.reason) == (
            "g",
            (0,),
            "moved to GPU 1, which is free",
        )
        assert agent._move(Move(("r", "h"), 0, 1), 11.0) is None  # g has not asked again
        again = [moved, ev.StepRequested(at=12.0, run_id="r", step="g", type="gpu", pid=PID)]
        store.append(again)
        for rec in store.read(agent.book.last_seq):
            agent.book.apply(rec)
        assert agent._move(Move(("r", "h"), 0, 1), 13.0) is not None  # it has: h may go
        # a moved step that never asks again (cancelled) holds the GPU for MOVE_HOLD_S
        store.append([ev.StepRequested(at=1.0, run_id="r", step="g2", type="gpu", pid=PID)])
        store.append([ev.LeaseGranted(1.0, "r", "g2", (0,), "ready")])
        for rec in store.read(agent.book.last_seq):
            agent.book.apply(rec)
        assert agent._move(Move(("r", "g2"), 0, 1), 14.0) is None
        assert agent._move(Move(("r", "g2"), 0, 1), 13.0 + MOVE_HOLD_S - 0.1) is None
        assert agent._move(Move(("r", "g2"), 0, 1), 13.0 + MOVE_HOLD_S) is not None
    finally:
        agent.close()


def test_a_moved_guests_gate_stays_shut_until_its_step_releases_the_lease(
    m27_home: Path,
) -> None:
    """The agent removed a lease's channel file when it took the lease back: a guest whose
    step had not reached its first gate yet then found no channel, took itself for a step
    run outside the agent (its gate passes at once) and computed on the GPU it was moved
    from (a CI run beside two CPU hogs: the guest wrote GPU 0, not 1)."""
    store = MemoryEventStore()
    agent = Agent(store, SimBackend(2), m27_home, clock=FakeClock(0.0), snapshot_every=None)
    try:
        path = channel_path(m27_home, ("r", "g"))
        path.parent.mkdir(parents=True, exist_ok=True)
        agent._channels[("r", "g")] = Channel.create(path, gate_open=False)
        store.append(
            [
                ev.StepRequested(at=1.0, run_id="r", step="g", type="gpu", pid=PID),
                ev.LeaseGranted(1.0, "r", "g", (0,), "ready", str(path)),
                ev.LeaseReleased(2.0, "r", "g", (0,), reason="moved to GPU 1, which is free"),
            ]
        )
        for rec in store.read():
            agent._apply(rec)
        step_side = Channel.open(path)  # what the step maps when it reaches gate()
        try:
            assert not step_side.gate_open()
            assert not step_side.wait_gate(timeout=0.05)  # shut: it does not pass
        finally:
            step_side.close()
        store.append([ev.LeaseReleased(3.0, "r", "g", (0,))])  # its runner's, once stopped
        for rec in store.read(agent.book.last_seq):
            agent._apply(rec)
        assert not path.exists()
    finally:
        agent.close()


def test_a_guest_whose_gate_opened_before_its_process_started_has_not_computed() -> None:
    """The events of a CI run of the replica example's power cut (two hogs beside it): the
    resumed run's two mdruns were let in as guests beside the killed run's primaries, one
    gate opened (the dead primary looked idle) and shut again before its mdrun started.
    Counted as having computed, that guest was never moved: it sat paused behind the other
    replica for the whole run, beside the GPU that freed."""
    from m27.node.book import Book, policy_input
    from m27.policy import GpuView, PolicyConfig, decide

    book = Book()

    def key(step: str) -> dict[str, object]:
        return {"at": 5.9, "run_id": "r2", "step": step}

    for e in [
        ev.StepRequested(**key("md.1"), type="gpu", gpus=1, pid=PID),  # type: ignore[arg-type]
        ev.StepRequested(**key("md.2"), type="gpu", gpus=1, pid=PID),  # type: ignore[arg-type]
        ev.LeaseGranted(**key("md.1"), gpus=(0,), tier="ready"),  # type: ignore[arg-type]
        ev.GuestStarted(**key("md.1"), gpu=0),  # type: ignore[arg-type]
        ev.GuestPaused(**key("md.1"), gpu=0),  # type: ignore[arg-type]
        ev.GuestResumed(**key("md.1"), gpu=0),  # type: ignore[arg-type]  # before its start
        ev.LeaseGranted(**key("md.2"), gpus=(0,), tier="ready"),  # type: ignore[arg-type]
        ev.GuestStarted(**key("md.2"), gpu=0),  # type: ignore[arg-type]
        ev.GuestPaused(**key("md.1"), gpu=0),  # type: ignore[arg-type]
        ev.StepStarted(**key("md.2"), attempt=1, pid=PID, pgid=PID, command=("gmx",), gpus=(0,)),  # type: ignore[arg-type]
        ev.StepStarted(**key("md.1"), attempt=1, pid=PID + 1, pgid=PID + 1, command=("gmx",), gpus=(0,)),  # type: ignore[arg-type]
        ev.Promoted(**key("md.2"), gpu=0),  # type: ignore[arg-type]  # the killed run's leases went
    ]:  # fmt: skip
        book.apply(e)
    views = (GpuView(0, 80 << 30, primary_util=100.0), GpuView(1, 80 << 30))
    inp = policy_input(book, views, 7.0, PolicyConfig())
    (guest,) = [r for r in inp.running if r.role == "guest"]
    assert guest.key == ("r2", "md.1") and guest.paused and not guest.computed
    assert Move(("r2", "md.1"), 0, 1) in decide(inp).actions
