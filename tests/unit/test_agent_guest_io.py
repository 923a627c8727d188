"""A guest that gives no I/O hint, in its own I/O: the agent tells the policy (its own
utilization is low while it may compute) and does not stop it by signal while that I/O
goes on, only once a sample shows it computing again (docs/policy.md, "Filling the gaps")."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from m27 import events as ev
from m27 import liveness
from m27.clock import FakeClock
from m27.gpu.sim import SimBackend
from m27.node.agent import Agent, channel_path
from m27.node.book import policy_input
from m27.step._channel import Channel
from m27.store.memory import MemoryEventStore
from tests.waiting import wait_until

#: Far above any pid_max: the primary is a made-up process, never signalled.
PRIMARY_PID = 90_000_000
GIB = 2**30


@pytest.fixture
def guest_process() -> Iterator[subprocess.Popen[bytes]]:
    """A real process in its own group, standing for a ``gmx`` guest (stopped by signal)."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield proc
    proc.send_signal(signal.SIGCONT)
    proc.kill()
    proc.wait()


def _node(
    home: Path, guest_pid: int, primary_pid: int = PRIMARY_PID
) -> tuple[Agent, SimBackend, Channel]:
    store = MemoryEventStore()
    backend = SimBackend(1, memory_total=16 * GIB)
    path = channel_path(home, ("g", "md"))
    path.parent.mkdir(parents=True, exist_ok=True)
    chan = Channel.create(path, gate_open=True)
    events: list[ev.Event] = []
    for run, pid, tier in (("a", primary_pid, "immediate"), ("g", guest_pid, "ready")):
        events.append(
            ev.StepRequested(at=0.0, run_id=run, step="md", type="gpu", priority=5,
                             gpus=1, gpu_memory=4 * GIB, owner="ann", pid=PRIMARY_PID)
        )  # fmt: skip
        channel = str(path) if run == "g" else ""
        events.append(ev.LeaseGranted(0.0, run, "md", (0,), tier, channel))
        if run == "g":
            events.append(ev.GuestStarted(at=0.0, run_id=run, step="md", gpu=0))
        events.append(
            ev.StepStarted(at=0.0, run_id=run, step="md", attempt=1, pid=pid, pgid=pid,
                           command=("gmx",), gpus=(0,))
        )  # fmt: skip
    store.append(events)
    agent = Agent(store, backend, home, clock=FakeClock(100.0), snapshot_every=None)
    for rec in store.read():
        agent._apply(rec)
    return agent, backend, chan


def _stopped(pid: int) -> bool:
    return liveness.status(pid) in liveness.STOPPED


def _stops_by_signal(agent: Agent, backend: SimBackend, pid: int, now: float) -> None:
    """At `now` the agent stops the paused guest by SIGSTOP (it did not reach its gate)."""
    (paused,) = agent._escalate(now, set(), backend.sample(now))
    assert isinstance(paused, ev.GuestPaused) and paused.how == "signal"
    wait_until(lambda: _stopped(pid), what="the guest stopped by SIGSTOP")


def test_a_guest_without_hints_in_its_own_io_is_reported_and_not_stopped_until_it_computes(
    m27_home: Path, guest_process: subprocess.Popen[bytes]
) -> None:
    pid = guest_process.pid
    agent, backend, chan = _node(m27_home, pid)
    key = ("g", "md")
    try:
        backend.set_computing(PRIMARY_PID, False)
        backend.set_computing(pid, False)  # its gate is open, it shows no compute: I/O
        agent._track_guests(backend.sample(100.0), 100.0)
        # paused (the primary computes again, or another guest fills the gap) while its
        # own utilization is low: its own I/O goes on, no SIGSTOP
        held = agent.book.held[key]
        assert agent._pause(key, held, 100.02) == "gate" and not _stopped(pid)
        agent.book.apply(ev.GuestPaused(at=100.02, run_id="g", step="md", gpu=0))
        samples = backend.sample(100.2)
        agent._track_guests(samples, 100.2)
        inp = policy_input(agent.book, agent._views(samples, 100.2), 100.2, agent.config,
                           util_low_since=agent._guest_low.get)  # fmt: skip
        assert {r.key: r.util_low_since for r in inp.running} == {("a", "md"): None, key: 100.0}
        assert agent._escalate(101.0, set(), backend.sample(101.0)) == []
        assert not _stopped(pid)
        # while paused the time is kept (it has not computed since), so it stays in its I/O
        agent._track_guests(backend.sample(101.0), 101.0)
        assert agent._guest_low.get(key) == 100.0
        # its I/O ends and it computes: stopped by signal at once, and no longer in I/O
        backend.set_computing(pid, True)
        samples = backend.sample(101.1)
        agent._track_guests(samples, 101.1)
        assert key not in agent._guest_low
        (paused,) = agent._escalate(101.1, set(), samples)
        assert isinstance(paused, ev.GuestPaused) and paused.how == "signal"
        wait_until(lambda: _stopped(pid), what="the guest stopped by SIGSTOP")
    finally:
        agent.close()
        chan.close()


def test_a_primary_without_hints_demoted_in_its_own_io_is_not_stopped_until_it_computes(
    m27_home: Path, guest_process: subprocess.Popen[bytes]
) -> None:
    # the simulator lets a demoted primary's own I/O go on as a guest's: so does the agent
    pid = guest_process.pid
    agent, backend, chan = _node(m27_home, PRIMARY_PID, primary_pid=pid)
    try:
        backend.set_computing(pid, False)
        agent._track_guests(backend.sample(100.0), 100.0)
        held = agent.book.held[("a", "md")]
        assert agent._pause(("a", "md"), held, 100.02) == "gate" and not _stopped(pid)
    finally:
        agent.close()
        chan.close()


def test_a_guest_whose_follow_ends_mid_compute_gets_gate_grace_from_then_not_from_its_pause(
    m27_home: Path, guest_process: subprocess.Popen[bytes]
) -> None:
    """A paused standby guest computes while its gate follows the primary's I/O; when the
    agent ends that follow (another guest became the standby) or the follow stops letting
    it through, it may be mid-compute: it is stopped by signal only if it has not reached
    its gate ``gate_grace`` after that, however long ago it was paused (it was SIGSTOPped
    at once before: a guest kept from its gate for a whole primary compute phase)."""
    pid = guest_process.pid
    agent, backend, chan = _node(m27_home, pid)
    key = ("g", "md")
    step_side = Channel.open(chan.path)
    clock = agent.clock
    assert isinstance(clock, FakeClock)
    gate = agent._channels[key]  # the agent's side of the guest's channel
    try:
        assert step_side.wait_gate(timeout=0)  # it uses its gate; now computing
        backend.set_computing(pid, True)
        agent.book.apply(ev.GuestPaused(at=100.0, run_id="g", step="md", gpu=0))
        grace = agent.gate_grace
        # 1. its follow is ended by the agent (the standby moved on) long after its pause
        gate.set_follow("", at=time.monotonic() + 3600)
        clock.advance(10.0)
        agent._standby = {}
        agent._arm()
        assert not gate.following()
        assert agent._escalate(clock.now() + grace / 2, set(), backend.sample(110.0)) == []
        assert not _stopped(pid)
        # 2. following again: while the follow lets it compute it is left alone, and when
        # the follow closes (its primary computes again) it gets gate_grace from then
        clock.advance(10.0)
        gate.set_follow("", at=time.monotonic() - 1)  # let through
        assert agent._escalate(clock.now(), set(), backend.sample(120.0)) == []
        gate.set_follow("")  # the primary computes again: closed, still following
        assert agent._escalate(clock.now() + grace / 2, set(), backend.sample(120.0)) == []
        assert not _stopped(pid)
        # never at its gate: stopped once gate_grace has passed
        _stops_by_signal(agent, backend, pid, clock.now() + 2 * grace)
    finally:
        step_side.close()
        agent.close()
        chan.close()


def test_a_paused_guest_leaving_its_own_io_gets_gate_grace_to_reach_its_gate(
    m27_home: Path, guest_process: subprocess.Popen[bytes]
) -> None:
    """A paused guest that uses its gate waits in its own I/O; when that ends it computes
    on to its next gate call. Its ``gate_grace`` counts from when it was last seen in the
    I/O, not from its pause long before (it was SIGSTOPped if a tick fell between its
    I/O's end and its gate call: seen in CI as a guest stopped by signal mid-yield)."""
    pid = guest_process.pid
    agent, backend, chan = _node(m27_home, pid)
    step_side = Channel.open(chan.path)
    grace = agent.gate_grace
    try:
        assert step_side.wait_gate(timeout=0)  # it uses its gate
        agent.book.apply(ev.GuestPaused(at=100.0, run_id="g", step="md", gpu=0))
        step_side.enter_io()
        assert agent._escalate(110.0, set(), backend.sample(110.0)) == []  # in its I/O
        step_side.exit_io()  # on its way to its gate
        assert agent._escalate(110.0 + grace / 2, set(), backend.sample(110.0)) == []
        assert not _stopped(pid)
        # it does not reach its gate within gate_grace: stopped by signal
        _stops_by_signal(agent, backend, pid, 110.0 + 2 * grace)
    finally:
        step_side.close()
        agent.close()
        chan.close()


def test_a_guest_that_opens_its_channel_gets_gate_grace_from_then_to_reach_its_gate(
    m27_home: Path, guest_process: subprocess.Popen[bytes]
) -> None:
    """A guest paused as it starts is left alone until its step opens the channel; from
    then it gets ``gate_grace`` to reach its gate, however long its start took."""
    pid = guest_process.pid
    agent, backend, chan = _node(m27_home, pid)
    grace, start_grace = agent.gate_grace, agent.start_grace
    assert start_grace > 2 * grace  # a start slower than the grace is the case here
    try:
        backend.set_computing(pid, False)  # starting: no kernel yet (one would be stopped)
        agent.book.apply(ev.GuestPaused(at=0.0, run_id="g", step="md", gpu=0))
        opened = start_grace / 2  # started at 0.0; the channel has no pid yet
        assert agent._escalate(opened, set(), backend.sample(opened)) == []
        chan.mark_owner()  # the step opened its channel (this process stands in for it)
        now = opened + grace / 2
        assert agent._escalate(now, set(), backend.sample(now)) == []
        assert not _stopped(pid)
        _stops_by_signal(agent, backend, pid, opened + 2 * grace)
    finally:
        agent.close()
        chan.close()


def test_a_guest_paused_in_its_io_wait_before_its_first_gate_call_is_not_stopped_then(
    m27_home: Path, guest_process: subprocess.Popen[bytes]
) -> None:
    """A step that reads its input inside `io_wait()` before its first gate call had not
    used its gate yet, so a pause then stopped it by SIGSTOP mid-read. Its I/O goes on;
    if it computes after it without reaching a gate, it is stopped then."""
    pid = guest_process.pid
    agent, backend, chan = _node(m27_home, pid)
    step_side = Channel.open(chan.path)
    grace = agent.gate_grace
    try:
        chan.mark_owner()  # the step opened its channel (this process stands in for it)
        step_side.enter_io()  # reading its input: no gate call yet
        h = agent.book.held[("g", "md")]
        assert agent._pause(("g", "md"), h, 100.0) == "gate"
        assert not _stopped(pid)
        agent.book.apply(ev.GuestPaused(at=100.0, run_id="g", step="md", gpu=0))
        assert agent._escalate(110.0, set(), backend.sample(110.0)) == []  # still reading
        step_side.exit_io()  # computes, and never calls its gate
        _stops_by_signal(agent, backend, pid, 110.0 + 2 * grace)
    finally:
        step_side.close()
        agent.close()
        chan.close()
