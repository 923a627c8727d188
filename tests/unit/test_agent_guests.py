"""The agent with real step processes on simulated GPUs: primaries, guests, promotion."""

from __future__ import annotations

import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from m27 import events as ev
from m27 import liveness
from m27.policy import Decision
from m27.step._channel import Channel
from tests.unit.agent_helpers import (
    GiB,
    Node,
    make_node,
    phases,
    run_step_leased,
    step_argv,
)
from tests.waiting import wait_until

#: A primary whose phases the test drives with files in its directory: it computes until
#: ``io`` exists, waits on I/O until ``compute`` exists, then computes until ``end`` exists.
#: Every claim below is then ordered by events the test made, not by a stopwatch.
PRIMARY = textwrap.dedent("""\
    import os, sys, time
    from m27.step import io_wait
    def wait(name):
        while not os.path.exists(os.path.join(sys.argv[1], name)):
            time.sleep(0.002)
    wait("io")
    with io_wait():
        wait("compute")
    wait("end")
""")


class Ticks:
    """Counts the agent's finished passes, so a test can wait for whole decisions."""

    def __init__(self, node: Node) -> None:
        self.count = 0
        inner = node.agent.tick

        def tick() -> Decision:
            decision = inner()
            self.count += 1
            return decision

        node.agent.tick = tick  # type: ignore[method-assign]

    def wait(self, passes: int = 3) -> None:
        """Return after `passes` more complete ticks (each: sample, decide, act)."""
        target = self.count + passes
        wait_until(lambda: self.count >= target, what=f"{passes} agent passes")


@pytest.fixture
def node(m27_home: Path) -> Iterator[Node]:
    n = make_node(m27_home, gpus=1)
    yield n
    n.close()


def _granted(node: Node, step: str) -> Callable[[], bool]:
    return lambda: any(getattr(e, "step", "") == step for e in node.of(ev.LeaseGranted))


def _stopped(pid: int) -> bool:
    """Whether `pid` is stopped by a signal (SIGSTOP)."""
    return liveness.status(pid) in liveness.STOPPED


def _of_step(node: Node, cls: type[ev.Event], step: str) -> list[ev.Event]:
    return [e for e in node.of(cls) if getattr(e, "step", "") == step]


def test_guest_computes_only_while_the_primary_waits_on_io_and_is_promoted_without_reload(
    node: Node, m27_home: Path, tmp_path: Path
) -> None:
    ticks = Ticks(node)
    node.start()
    lease = node.lease()
    ctl, guest_out = tmp_path / "ctl", tmp_path / "g.txt"
    ctl.mkdir()
    prim = run_step_leased(
        lease, "r1", "md", (sys.executable, "-c", PRIMARY, str(ctl)), priority=10
    )
    wait_until(_granted(node, "md"))
    wait_until(lambda: _of_step(node, ev.StepStarted, "md"))
    guest = run_step_leased(
        lease,
        "r2",
        "next",
        step_argv(guest_out, compute=0.05, io=0.0, load=0.05, until=ctl / "guest-end"),
        gpu_memory=2 * GiB,
    )
    wait_until(_granted(node, "next"))
    grants = {e.step: e for e in node.of(ev.LeaseGranted)}  # type: ignore[attr-defined]
    assert grants["md"].tier == "immediate" and grants["next"].tier == "ready"
    assert grants["next"].gpus == grants["md"].gpus == (0,)
    channel = Channel.open(grants["next"].channel, writable=False)
    try:
        # 1. The primary computes: the guest is held, at its closed gate or (if the agent
        #    saw it busy before it reached the gate: interpreter start-up counts as compute
        #    on a simulated GPU) by SIGSTOP; whole agent passes later it is still held.
        (started,) = wait_until(lambda: _of_step(node, ev.StepStarted, "next"))
        pid = started.pid  # type: ignore[attr-defined]

        def held() -> bool:
            return channel.at_gate() or _stopped(pid)

        wait_until(held, what="the guest held at its gate or stopped")
        ticks.wait()
        assert not _of_step(node, ev.GuestResumed, "next")
        assert not phases(guest_out, "compute") and held()

        # 2. The primary waits on I/O: the agent opens the guest's gate and it computes.
        (ctl / "io").touch()
        wait_until(lambda: _of_step(node, ev.GuestResumed, "next"), what="GuestResumed")
        wait_until(lambda: len(phases(guest_out, "compute")) >= 2, what="guest compute")

        # 3. The primary computes again: the agent closes the gate, the guest stops there,
        #    and it stays there through whole agent passes.
        (ctl / "compute").touch()
        wait_until(lambda: len(_of_step(node, ev.GuestPaused, "next")) >= 2, what="GuestPaused")
        wait_until(channel.at_gate, what="the guest back at its gate")
        done = len(phases(guest_out, "compute"))
        ticks.wait()
        assert len(_of_step(node, ev.GuestResumed, "next")) == 1
        assert len(phases(guest_out, "compute")) == done and channel.at_gate()
        assert not _of_step(node, ev.Promoted, "next")

        # 4. The primary ends: the guest is promoted in place and computes on.
        (ctl / "end").touch()
        wait_until(lambda: _of_step(node, ev.Promoted, "next"), what="Promoted")
        wait_until(lambda: len(phases(guest_out, "compute")) > done, what="promoted compute")
        (ctl / "guest-end").touch()
        p, g = prim.wait(), guest.wait()
        assert p is not None and p.ok and g is not None and g.ok
    finally:
        channel.close()
    events = node.events()
    # promotion kept the process and its loaded data: one start, one load
    started = [e for e in events if isinstance(e, ev.StepStarted) and e.step == "next"]
    assert len(started) == 1 and len(phases(guest_out, "load")) == 1
    released = [e.step for e in events if isinstance(e, ev.LeaseReleased)]
    assert sorted(released) == ["md", "next"]
    # the agent removes a step's channel file when it applies its LeaseReleased
    channels = m27_home / "channels"
    wait_until(lambda: not list(channels.rglob("*.chan")), what="channel files removed")
    lease.close()


def test_a_guests_timeout_does_not_count_the_time_it_is_held(node: Node, tmp_path: Path) -> None:
    """A `timeout: 10m` guest held nine minutes beside a computing primary was killed
    `timed out` after one minute of running: the lease now tells the runner how long it
    was held, and the deadline moves on by that much."""
    node.start()
    lease = node.lease()
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    (ctl / "io").touch()  # the primary goes straight to computing until `end`
    (ctl / "compute").touch()
    prim = run_step_leased(
        lease, "r1", "md", (sys.executable, "-c", PRIMARY, str(ctl)), priority=10
    )
    wait_until(lambda: _of_step(node, ev.StepStarted, "md"))
    # computes 0.2 s in chunks, each after its gate: held there while the primary computes
    ana = step_argv(tmp_path / "g.txt", cycles=1, compute=0.2, io=0.0)
    guest = run_step_leased(lease, "r2", "ana", ana, gpu_memory=GiB, timeout=1.0)
    (started,) = wait_until(lambda: _of_step(node, ev.StepStarted, "ana"), what="ana started")
    wait_until(lambda: _of_step(node, ev.GuestPaused, "ana"), what="ana held")
    # held past its whole timeout (a wait for time to pass, not a measure of it)
    passed = started.at + 2.0  # type: ignore[attr-defined]
    wait_until(lambda: time.time() > passed, timeout=30, what="ana held past its timeout")
    assert not _of_step(node, ev.StepFailed, "ana")
    (ctl / "end").touch()
    p, g = prim.wait(), guest.wait()
    assert p is not None and p.ok
    assert g is not None and g.ok, g.reason
    lease.close()


def test_a_guest_without_a_gate_is_stopped_by_signal_and_continued_when_promoted(
    node: Node, m27_home: Path, tmp_path: Path
) -> None:
    node.start()
    lease = node.lease()
    flag = tmp_path / "finish"
    prim = run_step_leased(
        lease, "r1", "md", step_argv(tmp_path / "p.txt", compute=0.05, io=0.0, until=flag)
    )
    wait_until(_granted(node, "md"))
    guest = run_step_leased(
        lease,
        "r2",
        "blackbox",
        step_argv(tmp_path / "g.txt", cycles=1, compute=0.1, io=0.0, gated=False),
        gpu_memory=GiB,
    )
    wait_until(lambda: any(e.how == "signal" for e in node.of(ev.GuestPaused)))  # type: ignore[attr-defined]
    (started,) = [e for e in node.of(ev.StepStarted) if e.step == "blackbox"]  # type: ignore[attr-defined]
    pid = started.pid  # type: ignore[attr-defined]

    # stopped while the primary computes (SIGSTOP lands when the kernel next runs it)
    wait_until(lambda: _stopped(pid), timeout=30.0)
    seen_stopped = time.time()
    flag.write_text("done")
    p, g = prim.wait(), guest.wait()
    assert p is not None and p.ok and g is not None and g.ok
    promoted = [e for e in node.of(ev.Promoted)]
    assert [e.step for e in promoted] == ["blackbox"]  # type: ignore[attr-defined]
    # once seen stopped, it began no compute chunk until the agent let it go on: at its
    # promotion, or earlier when the primary's process had ended and the GPU showed no
    # compute for io_timeout (an inferred I/O wait); the agent takes the event's time
    # before it sends SIGCONT, and a stopped process records nothing
    let_go = [e.at for e in node.of(ev.GuestResumed) + promoted if e.at > seen_stopped]
    for a, _ in phases(tmp_path / "g.txt", "compute"):
        assert not seen_stopped < a < min(let_go), (seen_stopped, a, min(let_go))
    lease.close()
