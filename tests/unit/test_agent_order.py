"""The queue's order with the agent and real step processes: memory admission, aging,
fair share, multi-GPU reservation, `m27 bump` and `m27 queue --why`.

The agent is stepped by hand on a FakeClock (so aging and fair-share usage move by hours
in no time, and nothing depends on how fast this machine is); the steps are real
processes leased through :func:`m27.node.lease.run_leased`, as the flow runs them. Each
step runs until the test writes its flag file, so the test decides when a GPU frees, and
every assertion reads the order of events in the log.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from m27 import events as ev
from m27.cli.commands import bump, gpus, queue
from m27.clock import FakeClock
from m27.executors.local import StepLaunch, StepResult
from m27.node.lease import AgentLease, run_leased
from m27.policy import Decision, Reserve
from tests.unit.agent_helpers import GiB, Node, make_node, step_argv
from tests.waiting import wait_until

#: A step that holds its lease until its flag file exists (no m27 import: starts fast).
HOLD = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.005)\n"


class Hand:
    """One node: sim GPUs, the agent ticked by hand, real steps on runner threads."""

    def __init__(self, home: Path, tmp: Path, gpus: int = 1, **config: float) -> None:
        self.clock = FakeClock(start=time.time())
        self.node: Node = make_node(
            home, gpus=gpus, memory=int(config.pop("memory", 16 * GiB)), **config
        )
        self.node.agent.clock = self.clock
        self.node.agent.start()
        self.lease = AgentLease(self.node.store, home, embed=False, poll=0.02, clock=self.clock)
        self.tmp = tmp
        self.threads: dict[str, tuple[threading.Thread, list[StepResult | None]]] = {}
        self.cancels: list[threading.Event] = []

    def submit(
        self,
        step: str,
        *,
        gpus: int = 1,
        gpu_memory: int = 0,
        priority: int = 0,
        owner: str = "u",
        gated: bool = False,
        time_limit: float | None = None,
    ) -> None:
        """Ask for a lease (as a step task does) and wait until the request is logged."""
        flag = self.tmp / f"{step}.done"
        if gated:  # loads, waits at its gate while a guest, computes in gated chunks
            argv = step_argv(self.tmp / f"{step}.txt", compute=0.02, io=0.0, until=flag)
        else:
            argv = (sys.executable, "-c", HOLD, str(flag))
        launch = StepLaunch(run_id="r", step=step, argv=argv, grace=1.0)
        out: list[StepResult | None] = [None]
        cancel = threading.Event()

        def body() -> None:
            out[0] = run_leased(
                self.lease,
                launch,
                "gpu",
                cancel=cancel,
                gpus=gpus,
                gpu_memory=gpu_memory,
                priority=priority,
                owner=owner,
                time_limit=time_limit,
            )

        t = threading.Thread(target=body, daemon=True)
        self.threads[step] = (t, out)
        self.cancels.append(cancel)
        t.start()
        wait_until(lambda: any(getattr(e, "step", "") == step for e in self.of(ev.StepRequested)))

    def cycle(self, advance: float = 0.0) -> Decision:
        self.clock.advance(advance)
        self.node.agent.poll()
        decision = self.node.agent.tick()
        self.node.agent.poll()
        return decision

    def started(self, step: str) -> ev.StepStarted:
        wait_until(lambda: any(e.step == step for e in self.of(ev.StepStarted)))  # type: ignore[attr-defined]
        (e,) = [e for e in self.of(ev.StepStarted) if e.step == step]  # type: ignore[attr-defined]
        return e  # type: ignore[return-value]

    def finish(self, step: str) -> None:
        """Let the step's process end and wait for its lease to come back."""
        (self.tmp / f"{step}.done").write_text("done")
        t, out = self.threads[step]
        t.join(20)
        assert not t.is_alive() and out[0] is not None and out[0].ok, out[0]

    def of(self, cls: type[ev.Event]) -> list[ev.Event]:
        return self.node.of(cls)

    def grants(self) -> list[ev.LeaseGranted]:
        return self.of(ev.LeaseGranted)  # type: ignore[return-value]

    def close(self) -> None:
        """Stop whatever still waits or runs (a failed test leaves guests at their gate)."""
        for cancel in self.cancels:
            cancel.set()
        self.lease.close()
        for t, _ in self.threads.values():
            t.join(10)
        self.node.close()


@pytest.fixture
def hands(m27_home: Path, tmp_path: Path) -> Iterator[Callable[..., Hand]]:
    made: list[Hand] = []

    def make(gpus: int = 1, **config: float) -> Hand:
        h = Hand(m27_home, tmp_path, gpus, **config)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def test_memory_admission_decides_which_real_step_starts_as_a_guest(
    hands: Callable[..., Hand],
) -> None:
    h = hands(memory=10 * GiB)
    h.submit("primary", gpu_memory=8 * GiB, priority=10, gated=True)
    h.cycle()
    h.started("primary")
    # first in line (equal priority, so the promotion below is not displaced by it)
    h.submit("big", gpu_memory=4 * GiB, gated=True)
    h.submit("small", gpu_memory=2 * GiB, gated=True)
    decision = h.cycle(0.01)
    assert "needs 4.0 GiB, GPU 0 has 2.0 GiB free of 10.0 GiB" in decision.why(("r", "big"))
    assert [(g.step, g.tier) for g in h.grants()] == [("primary", "immediate"), ("small", "ready")]
    h.started("small")  # loaded beside the primary, held at its gate
    h.cycle(0.01)
    (gpu,) = h.node.backend.sample(h.clock.now())
    assert gpu.memory_used == 10 * GiB  # 8 + 2 GiB of two live processes
    h.finish("primary")
    h.cycle(0.01)  # the guest is promoted in place; now the 4 GiB fit beside its 2
    assert [e.step for e in h.of(ev.Promoted)] == ["small"]  # type: ignore[attr-defined]
    h.cycle(0.01)
    assert [(g.step, g.tier) for g in h.grants()][2:] == [("big", "ready")]
    assert len([e for e in h.of(ev.StepStarted) if e.step == "small"]) == 1  # type: ignore[attr-defined]


def test_aging_lets_a_real_low_priority_step_through_a_stream_of_higher_ones(
    hands: Callable[..., Hand],
) -> None:
    # one point an hour; no guests: undeclared steps would be guests, this is about order
    h = hands(aging_per_s=1 / 3600, guests_per_gpu=0)
    h.submit("holder")
    h.cycle()
    h.submit("low", priority=0)
    holder, order = "holder", []
    for hour in range(6):
        h.clock.advance(3600)
        h.submit(f"high{hour}", priority=4)
        h.finish(holder)
        h.cycle()
        holder = h.grants()[-1].step
        h.started(holder)
        order.append(holder)
        if holder == "low":
            break
    # the newer, higher-priority steps go first while the gap lasts; aged level, the
    # older one goes: it does not starve
    assert order == ["high0", "high1", "high2", "low"]


def test_equal_priorities_alternate_between_owners_with_real_steps(
    hands: Callable[..., Hand],
) -> None:
    h = hands(guests_per_gpu=0)  # no guests: undeclared steps would be guests (issue 16.3)
    h.submit("x", owner="carol")
    h.cycle()
    for name in ["a1", "a2", "a3"]:
        h.submit(name, owner="alice")
        h.clock.advance(1)
    h.submit("b1", owner="bob")
    holder, order = "x", []
    for _ in range(4):
        h.started(holder)
        h.cycle(600)  # GPU time accrues to the holder's owner
        h.finish(holder)
        h.cycle()
        holder = h.grants()[-1].step
        order.append(holder)
    # first in line goes first; then bob, who has had no GPU time, before alice's next
    assert order == ["a1", "b1", "a2", "a3"]


def test_a_real_multi_gpu_step_gets_its_gpus_together_and_the_narrow_one_waits(
    hands: Callable[..., Hand], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("M27_GPUS", "sim:2")
    h = hands(gpus=2, guests_per_gpu=0)  # no guests: undeclared steps would be guests
    h.submit("h0")
    h.submit("h1")
    h.cycle()
    h.submit("wide", gpus=2, priority=5)
    h.submit("narrow")
    h.cycle(1)
    h.finish("h0")
    h.cycle(1)
    # GPU 0 is free but held for the wide step: the narrow one, behind it, may not take it
    assert [g.step for g in h.grants()] == ["h0", "h1"]
    assert queue.run(argparse.Namespace(why="narrow", json=False)) == 0
    assert "reserved for r/wide" in capsys.readouterr().out
    h.finish("h1")
    h.cycle(1)
    assert [(g.step, g.gpus) for g in h.grants()][2:] == [("wide", (0, 1))]
    assert h.started("wide").gpus == (0, 1)  # one process, both GPUs
    h.finish("wide")
    h.cycle(1)
    assert [g.step for g in h.grants()][3:] == ["narrow"]  # and then it runs: no starvation


def test_bump_moves_a_waiting_real_step_ahead_and_queue_why_says_why(
    hands: Callable[..., Hand], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("M27_GPUS", "sim:1")
    h = hands(guests_per_gpu=0)  # no guests: undeclared steps would be guests
    h.submit("holder")
    h.cycle()
    h.started("holder")
    h.submit("a")
    h.clock.advance(1)
    h.submit("b")
    h.cycle(1)
    assert queue.run(argparse.Namespace(why="r/b", json=False)) == 0
    why = capsys.readouterr().out
    assert why.startswith("r/b: waiting: rank 2 of 2 in the gpu queue")
    assert "GPU 0 primary r/holder" in why
    assert bump.run(argparse.Namespace(run_id="r", step="b", delta=3)) == 0
    capsys.readouterr()
    assert queue.run(argparse.Namespace(why=None, json=True)) == 0
    waiting = json.loads(capsys.readouterr().out)["waiting"]
    assert [(w["step"], w["bump"]) for w in waiting] == [("r/b", 3), ("r/a", 0)]
    h.finish("holder")
    h.cycle(1)
    h.started("b")
    h.finish("b")
    h.cycle(1)
    assert [g.step for g in h.grants()] == ["holder", "b", "a"]


def test_a_black_box_primary_lends_its_gpu_when_its_own_utilization_stays_low(
    hands: Callable[..., Hand],
) -> None:
    h = hands()  # io_timeout 20 ms
    h.submit("prim", gpu_memory=4 * GiB, priority=5)  # never says io_wait: a black box
    h.cycle()
    prim = h.started("prim")
    h.submit("guest", gpu_memory=2 * GiB, gated=True)
    h.cycle(0.001)
    h.started("guest")
    channel = h.node.agent._channels[("r", "guest")]
    wait_until(channel.at_gate)  # loaded, waiting for the agent (no tick meanwhile)
    h.cycle(0.001)

    def guest_events() -> list[str]:
        return [e.kind for e in h.node.events() if getattr(e, "step", "") == "guest"]

    sim = h.node.backend
    sim.set_computing(prim.pid, False)  # its own SM utilization drops (I/O, no hint)
    h.cycle(0.005)  # the agent sees it low from now
    h.cycle(0.015)  # low for 15 ms: not yet io_timeout
    assert "GuestResumed" not in guest_events()
    h.cycle(0.015)  # low for 30 ms
    assert guest_events()[-1] == "GuestResumed" and channel.gate_open()
    sim.set_computing(prim.pid, True)  # computes again: the guest is paused at once
    h.cycle(0.001)
    assert guest_events()[-1] == "GuestPaused" and not channel.gate_open()


def test_a_real_higher_priority_step_takes_the_gpu_before_the_loaded_guest_is_promoted(
    hands: Callable[..., Hand],
) -> None:
    h = hands(guests_per_gpu=1)  # one guest slot, so the urgent step cannot also be a guest
    h.submit("holder", gpu_memory=4 * GiB, priority=5)
    h.cycle()
    h.started("holder")
    h.submit("guest", gpu_memory=2 * GiB, priority=1, gated=True)
    h.cycle(0.01)
    h.started("guest")  # loaded beside the holder, held at its gate
    h.submit("urgent", gpu_memory=2 * GiB, priority=9)
    h.cycle(0.01)  # the only guest slot is taken: it waits
    assert [g.step for g in h.grants()] == ["holder", "guest"]
    h.finish("holder")
    h.cycle(0.01)
    # the priority-9 step gets the GPU; the priority-1 guest stays loaded and paused
    assert [(g.step, g.tier) for g in h.grants()][2:] == [("urgent", "immediate")]
    assert h.of(ev.Promoted) == []
    assert not h.node.agent._channels[("r", "guest")].gate_open()
    h.started("urgent")
    h.finish("urgent")
    h.cycle(0.01)  # now it is promoted in place: one start, no reload
    assert [e.step for e in h.of(ev.Promoted)] == ["guest"]  # type: ignore[attr-defined]
    h.finish("guest")
    assert len([e for e in h.of(ev.StepStarted) if e.step == "guest"]) == 1  # type: ignore[attr-defined]


def test_a_real_step_with_a_declared_timeout_backfills_a_gpu_held_for_a_wide_step(
    hands: Callable[..., Hand],
) -> None:
    h = hands(gpus=2)
    h.submit("h0", time_limit=3600)  # declared ends: the wide step's start is known
    h.submit("h1", time_limit=3600)
    h.cycle()
    h.started("h0")
    h.started("h1")
    h.submit("wide", gpus=2, priority=5)
    h.submit("long")  # no timeout: ahead of "short" in the queue, but never backfilled
    h.clock.advance(1)
    h.submit("short", time_limit=60)
    requests = {e.step: e.time_limit for e in h.of(ev.StepRequested)}  # type: ignore[attr-defined]
    assert requests == {"h0": 3600, "h1": 3600, "wide": None, "long": None, "short": 60}
    h.cycle(1)
    h.finish("h1")
    decision = h.cycle(1)
    # GPU 1 is free and held for the wide step; the 60 s step ends long before h0 (and
    # so the reservation) can: it runs there meanwhile; the step without a limit waits
    assert [(g.step, g.gpus) for g in h.grants()][2:] == [("short", (1,))]
    assert any(isinstance(a, Reserve) and a.key == ("r", "wide") for a in decision.actions)
    assert "reserved for r/wide (gpus: 2)" in decision.why(("r", "long"))
    h.finish("short")


def test_a_gpu_held_by_a_process_m27_did_not_start_waits_for_it(
    hands: Callable[..., Hand], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another user's job on the node's only GPU (a pid no lease has, 60 GiB): the agent
    grants nothing there and `m27 queue --why` says so; once it is gone the step starts.
    A step that just ended is not such a process: the next one starts at once."""
    monkeypatch.setenv("M27_GPUS", "sim:1")
    h = hands()
    backend = h.node.agent.backend
    h.submit("first")
    h.cycle()
    h.started("first")
    h.finish("first")  # its process is gone and its lease back: nothing foreign on GPU 0
    h.cycle(1)
    foreign = 4_000_000  # a made-up pid: no step of this node has it
    backend.attach(0, foreign, memory=60 * GiB)  # type: ignore[attr-defined]
    backend.set_computing(foreign, True)  # type: ignore[attr-defined]
    h.submit("mine")
    h.cycle(1)
    assert [g.step for g in h.grants()] == ["first"]
    assert queue.run(argparse.Namespace(why="mine", json=False)) == 0
    assert "GPU 0 used outside m27 (60.0 GiB by processes m27 did not start)" in (
        capsys.readouterr().out
    )
    assert gpus.run(argparse.Namespace(json=False, watch=None)) == 0
    assert "outside m27 (60.0GiB)" in capsys.readouterr().out  # in the PRIMARY column
    backend.detach(0, foreign)  # type: ignore[attr-defined]
    h.cycle(1)
    assert [g.step for g in h.grants()] == ["first", "mine"]
    h.started("mine")
    h.finish("mine")
