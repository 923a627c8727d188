"""A standby guest follows its primary's ``io_wait()`` hint through the channel pages, with
no agent round trip (m27.step._channel follow mode, m27.node.follow)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from m27 import events as ev
from m27.node.agent import Agent
from m27.node.book import Held
from m27.node.follow import IoWatch
from m27.policy import Decision, PolicyConfig, StepKey, decide
from m27.policy._model import GpuView, PolicyInput, Running
from m27.step import Channel
from tests.unit.agent_helpers import Node, make_node, phases, run_step_leased, step_argv
from tests.waiting import wait_until


def test_a_following_gate_opens_exactly_while_the_primary_is_in_io(tmp_path: Path) -> None:
    primary = Channel.create(tmp_path / "p.chan")
    other = Channel.create(tmp_path / "q.chan")
    agent_side = Channel.create(tmp_path / "g.chan", gate_open=False)
    step_side = Channel.open(tmp_path / "g.chan")
    assert not step_side.wait_gate(timeout=0)

    agent_side.set_follow(primary.path)
    assert agent_side.following()
    assert not step_side.wait_gate(timeout=0)  # the primary computes
    primary.enter_io()
    assert step_side.wait_gate(timeout=0)
    primary.exit_io()
    assert not step_side.wait_gate(timeout=0)

    agent_side.set_follow(other.path)  # a new primary (promotion): the step reloads
    primary.enter_io()
    assert not step_side.wait_gate(timeout=0)
    other.enter_io()
    assert step_side.wait_gate(timeout=0)

    agent_side.set_gate(False)  # closed wins over the primary's I/O
    assert not agent_side.following() and not step_side.wait_gate(timeout=0)
    agent_side.set_follow(other.path)  # the same target again after a close
    assert step_side.wait_gate(timeout=0)
    agent_side.set_gate(True)
    other.exit_io()
    assert step_side.wait_gate(timeout=0)
    for ch in (primary, other, agent_side, step_side):
        ch.close()


def test_a_follower_passes_only_while_the_primary_and_every_guest_ahead_are_in_io(
    tmp_path: Path,
) -> None:
    primary = Channel.create(tmp_path / "p.chan")
    first = Channel.create(tmp_path / "a.chan")
    second = Channel.create(tmp_path / "b.chan")
    agent_side = Channel.create(tmp_path / "g.chan", gate_open=False)
    step_side = Channel.open(tmp_path / "g.chan")

    agent_side.set_follow(primary.path, ahead=(first.path, second.path))
    primary.enter_io()
    assert not step_side.wait_gate(timeout=0)  # the guests ahead compute
    first.enter_io()
    assert not step_side.wait_gate(timeout=0)  # the second still does
    second.enter_io()
    assert step_side.wait_gate(timeout=0)  # everyone ahead waits on I/O: its turn
    first.exit_io()
    assert not step_side.wait_gate(timeout=0)  # a guest ahead computes again
    first.enter_io()
    primary.exit_io()
    assert not step_side.wait_gate(timeout=0)  # the primary computes
    primary.enter_io()
    assert step_side.wait_gate(timeout=0)

    agent_side.set_follow(primary.path, ahead=(first.path,))  # a new chain: reloaded
    second.exit_io()
    assert step_side.wait_gate(timeout=0)
    agent_side.set_follow(primary.path)  # the standby itself: the primary alone
    first.exit_io()
    assert step_side.wait_gate(timeout=0)
    (tmp_path / "a.chan").unlink()
    agent_side.set_follow(primary.path, ahead=(str(tmp_path / "a.chan"),))  # gone: closed
    assert not step_side.wait_gate(timeout=0)
    for ch in (primary, first, second, agent_side, step_side):
        ch.close()


def test_a_follow_with_a_deadline_opens_the_gate_once_the_deadline_has_passed(
    tmp_path: Path,
) -> None:
    primary = Channel.create(tmp_path / "p.chan")
    agent_side = Channel.create(tmp_path / "g.chan", gate_open=False)
    step_side = Channel.open(tmp_path / "g.chan")

    agent_side.set_follow("", at=time.monotonic() + 3600)  # not yet
    assert not step_side.wait_gate(timeout=0) and not agent_side.follow_due()
    agent_side.set_follow("", at=time.monotonic() - 1)  # passed: the step goes on by itself
    assert step_side.wait_gate(timeout=0) and agent_side.follow_due()
    agent_side.set_follow("")  # taken back (the primary computes again)
    assert not step_side.wait_gate(timeout=0) and not agent_side.follow_due()

    agent_side.set_follow(primary.path, at=time.monotonic() + 3600)  # a primary and a deadline
    assert not step_side.wait_gate(timeout=0)
    primary.enter_io()
    assert step_side.wait_gate(timeout=0)
    primary.exit_io()
    assert not step_side.wait_gate(timeout=0)
    agent_side.set_gate(False)
    assert not agent_side.follow_due()
    for ch in (primary, agent_side, step_side):
        ch.close()


def test_the_policy_names_the_guest_that_computes_in_the_next_io_wait() -> None:
    guests = (
        Running(("r", "low"), role="guest", gpus=(0,), paused=True, priority=1),
        Running(("r", "high"), role="guest", gpus=(0,), paused=True, priority=5),
    )
    prim = Running(("r", "md"), gpus=(0,), priority=9)
    inp = PolicyInput((), (prim, *guests), (GpuView(0, 1 << 34, None, False, 100.0),), 10.0)
    d: Decision = decide(inp)
    assert d.standby == {0: ("r", "high")}
    assert d.actions == ()


class _SlowTickAgent(Agent):
    """Ticks on events and once a second, never on I/O: what a guest does in between is
    the guest's own doing."""

    def _wait(self, timeout: float) -> int:
        return self.poll(timeout)


@pytest.fixture
def slow_node(m27_home: Path) -> Iterator[Node]:
    n = make_node(m27_home, gpus=1)
    n.agent = _SlowTickAgent(
        n.store, n.backend, m27_home, config=PolicyConfig(io_timeout=0.02), tick=1.0
    )
    n.start()
    yield n
    n.close()


def test_a_standby_guest_computes_in_its_primarys_io_wait_before_the_agent_says_so(
    slow_node: Node, m27_home: Path, tmp_path: Path
) -> None:
    lease = slow_node.lease()
    prim_out, guest_out = tmp_path / "p.txt", tmp_path / "g.txt"
    prim = run_step_leased(
        lease, "r1", "md", step_argv(prim_out, cycles=12, compute=0.05, io=0.25), priority=10
    )
    wait_until(lambda: slow_node.of(ev.StepStarted), what="the primary's start")
    guest = run_step_leased(
        lease, "r2", "next", step_argv(guest_out, cycles=1, compute=3.0, io=0.0, chunk=0.005)
    )

    def ahead_of_the_agent() -> bool:
        """A guest compute chunk inside a primary I/O wait, begun before any GuestResumed
        of that wait: the guest's gate opened on the primary's own hint."""
        resumed = [e.at for e in slow_node.of(ev.GuestResumed)]
        for a, b in phases(prim_out, "io"):
            for c, _ in phases(guest_out, "compute"):
                if a <= c <= b and not any(a <= r <= c for r in resumed):
                    return True
        return False

    wait_until(ahead_of_the_agent, what="a guest chunk ahead of the agent's word")
    p, g = prim.wait(60), guest.wait(60)
    assert p is not None and p.ok and g is not None and g.ok
    lease.close()


class _NoWake(IoWatch):
    """Never reports an I/O change: the agent ticks only on events and its slow tick."""

    def state(
        self,
        primaries: Mapping[int, Held],
        hosted: set[int],
        channels: Mapping[StepKey, Channel],
        hints: object,
        low_since: Mapping[int, tuple[StepKey, float]],
        now: float,
    ) -> dict[int, bool]:
        return {}


class _BlindSlowAgent(Agent):
    """Reads no hints (every I/O wait is inferred from utilization), samples between
    ticks as usual, but never ticks on an I/O change: only on events and once a second."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._watch = _NoWake(self.config)

    def _io_waiting(self, key: StepKey) -> bool:
        return False

    def _hints(self, key: StepKey) -> bool:
        return False


def test_a_standby_guest_behind_a_primary_without_hints_starts_at_its_deadline(
    m27_home: Path, tmp_path: Path
) -> None:
    """The gate's deadline (first idle sample + io_timeout) opens it without the agent."""
    node = make_node(m27_home, gpus=1)
    node.agent = _BlindSlowAgent(
        node.store, node.backend, m27_home, config=PolicyConfig(io_timeout=0.02), tick=1.0
    )
    node.start()
    lease = node.lease()
    prim_out, guest_out = tmp_path / "p.txt", tmp_path / "g.txt"
    prim = run_step_leased(
        lease, "r1", "md", step_argv(prim_out, cycles=12, compute=0.05, io=0.25), priority=10
    )
    wait_until(lambda: node.of(ev.StepStarted), what="the primary's start")
    guest = run_step_leased(
        lease, "r2", "next", step_argv(guest_out, cycles=1, compute=3.0, io=0.0, chunk=0.005)
    )

    def ahead_of_the_agent() -> bool:
        resumed = [e.at for e in node.of(ev.GuestResumed)]
        for a, b in phases(prim_out, "io"):
            for c, _ in phases(guest_out, "compute"):
                if a <= c <= b and not any(a <= r <= c for r in resumed):
                    return True
        return False

    try:
        wait_until(ahead_of_the_agent, what="a guest chunk started by its gate's deadline")
        p, g = prim.wait(60), guest.wait(60)
        assert p is not None and p.ok and g is not None and g.ok
    finally:
        lease.close()
        node.close()


def _primary_and_two_guests(
    node: Node,
    tmp_path: Path,
    io: tuple[float, float],
    until: Callable[[dict[str, Path]], bool],
    what: str,
) -> None:
    """A primary (0.05 s compute, `io[0]` s I/O) and two guests on one GPU, loaded in turn:
    `first` (0.1 s compute, `io[1]` s of its own I/O) and `second` (compute only); wait
    (bounded) until `until` holds on their records, then end all three, each ok."""
    node.start()
    lease = node.lease()
    outs = {name: tmp_path / f"{name}.txt" for name in ("md", "first", "second")}
    done = tmp_path / "done"
    md = step_argv(outs["md"], compute=0.05, io=io[0], until=done)
    runs = [run_step_leased(lease, "r1", "md", md, priority=9)]
    wait_until(lambda: node.of(ev.StepStarted), what="the primary's start")
    for name, own in (("first", io[1]), ("second", 0.0)):
        argv = step_argv(outs[name], compute=0.1 if own else 5.0, io=own, until=done)
        runs.append(run_step_leased(lease, f"r-{name}", name, argv))
        wait_until(lambda n=name: outs[n].exists(), what=f"guest {name} loaded")  # type: ignore[misc]
    try:
        wait_until(lambda: until(outs), timeout=60, what=what)
    finally:
        done.write_text("done")
        results = [r.wait(60) for r in runs]
        lease.close()
        node.close()
    assert all(r is not None and r.ok for r in results)


def test_when_the_computing_guest_enters_its_own_io_the_next_guest_takes_the_gap_at_once(
    m27_home: Path, tmp_path: Path
) -> None:
    """The agent ticks when the standby guest's own hint flips, not only its primary's:
    with ticks otherwise only on events and every 30 s, the second guest computes in the
    same primary I/O wait in which the first guest entered its own."""
    node = make_node(m27_home, gpus=1)
    node.agent = Agent(
        node.store, node.backend, m27_home, config=PolicyConfig(io_timeout=0.02), tick=30.0
    )

    def filled(outs: dict[str, Path]) -> bool:
        """A chunk of the second guest inside a primary I/O wait, begun after the first
        guest entered its own I/O wait in that same wait (both guests loaded by then)."""
        loaded = max(b for n in ("first", "second") for _, b in phases(outs[n], "load"))
        first_io = [x for x, _ in phases(outs["first"], "io")]
        second = [c for c, _ in phases(outs["second"], "compute")]
        for a, b in phases(outs["md"], "io"):
            if a < loaded:
                continue
            if any(a < x < c < b for x in first_io for c in second):
                return True
        return False

    _primary_and_two_guests(
        node, tmp_path, (3.0, 1.0), filled, "the second guest in the first guest's place"
    )


class _NoWakeAtAll(_NoWake):
    """Not on a primary's I/O change, nor on a guest's."""

    @staticmethod
    def guests_io(
        standby: Mapping[int, StepKey], channels: Mapping[StepKey, Channel], hints: object
    ) -> frozenset[StepKey]:
        return frozenset()


class _DeafSlowAgent(Agent):
    """Ticks on events and once a second, never on an I/O change."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._watch = _NoWakeAtAll(self.config)


def test_a_follower_takes_the_gap_when_the_standby_enters_its_own_io_before_the_agent_says_so(
    m27_home: Path, tmp_path: Path
) -> None:
    """The second guest's gate is chained on the primary's and the first guest's hints: it
    computes in the primary's I/O wait once the first guest waits on its own, with no
    GuestResumed for it in that wait (the agent, deaf to I/O changes, did not say so)."""
    node = make_node(m27_home, gpus=1)
    node.agent = _DeafSlowAgent(
        node.store, node.backend, m27_home, config=PolicyConfig(io_timeout=0.02), tick=1.0
    )

    def chained(outs: dict[str, Path]) -> bool:
        resumed = [e.at for e in node.of(ev.GuestResumed) if e.step == "second"]  # type: ignore[attr-defined]
        first_io = [x for x, _ in phases(outs["first"], "io")]
        second = [c for c, _ in phases(outs["second"], "compute")]
        for a, b in phases(outs["md"], "io"):
            for x in first_io:
                for c in second:
                    if a < x < c < b and not any(a <= r <= c for r in resumed):
                        return True
        return False

    _primary_and_two_guests(
        node, tmp_path, (2.0, 0.6), chained, "the second guest on its chained gate"
    )
