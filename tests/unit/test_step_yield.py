"""A primary yields to a guest as high in rank that is in the middle of the compute phase
it began in the primary's I/O wait (m27.step._channel yield mode, Decision.yield_to,
m27.node.follow): equals take turns a whole phase at a time."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from m27 import events as ev
from m27.node.book import Held
from m27.node.follow import arm_standby
from m27.policy import Decision, PolicyConfig, StepKey, decide
from m27.policy._model import GpuView, PolicyInput, Running
from m27.step import Channel
from tests.unit.agent_helpers import Node, end_steps, make_node, phases, run_step_leased
from tests.unit.agent_helpers import step_argv as argv_of
from tests.waiting import wait_until


@pytest.fixture
def pages(tmp_path: Path) -> Iterator[dict[str, Channel]]:
    """A primary and two guests: each page seen from the agent (`p`, `g`, `h`) and from
    the step (`P`, `G`, `H`); both guests follow the primary, `h` behind `g`."""
    out = {}
    for name, gate_open in (("p", True), ("g", False), ("h", False)):
        out[name] = Channel.create(tmp_path / f"{name}.chan", gate_open=gate_open)
        out[name.upper()] = Channel.open(tmp_path / f"{name}.chan")
    out["g"].set_follow(out["p"].path)
    out["h"].set_follow(out["p"].path, ahead=(out["g"].path,))
    yield out
    for ch in out.values():
        ch.close()


def test_a_yielding_primary_waits_until_the_borrowing_guest_enters_its_own_io(
    pages: dict[str, Channel],
) -> None:
    p, P, G = pages["p"], pages["P"], pages["G"]
    p.set_yield((pages["g"].path,), bound=3600.0)  # a bound no test run reaches
    assert p.yields() and not p.following()
    assert P.wait_gate(timeout=0)  # no guest computes: plain open
    P.enter_io()
    assert G.wait_gate(timeout=0) and pages["g"].borrowing()  # its phase, in the wait
    P.exit_io()
    assert p.yielding()
    assert not P.wait_gate(timeout=0)  # the guest is mid-phase: the primary waits
    assert G.wait_gate(timeout=0)  # and the guest goes on through its gate meanwhile
    assert G.wait_gate(timeout=0)
    G.enter_io()  # the guest's phase ends
    assert not pages["g"].borrowing()
    assert P.wait_gate(timeout=0)  # the primary computes
    assert not p.yielding()
    G.exit_io()
    assert not G.wait_gate(timeout=0)  # back from its I/O, the guest waits its turn
    assert P.wait_gate(timeout=0)  # the primary yields once per wait, not mid-compute


def borrowing_in_a_wait(pages: dict[str, Channel], bound: float) -> None:
    """The primary yields to `g` (at most `bound` s) and waits on I/O; `g` computes."""
    pages["p"].set_yield((pages["g"].path,), bound=bound)
    pages["P"].enter_io()
    assert pages["G"].wait_gate(timeout=0)


def test_a_primary_yields_no_longer_than_its_bound(pages: dict[str, Channel]) -> None:
    P, G = pages["P"], pages["G"]
    borrowing_in_a_wait(pages, bound=0.0)
    P.exit_io()
    assert P.wait_gate(timeout=0)  # the bound is over at once: the primary computes
    assert not G.wait_gate(timeout=0)  # and the guest stops at its next gate call


def test_a_guest_killed_mid_phase_holds_its_primary_no_longer_than_the_bound(
    pages: dict[str, Channel],
) -> None:
    """A guest killed by signal mid-phase leaves its page saying it borrows; the primary's
    gate still opens once the bound has passed (an unbounded wait would hang here)."""
    p, P = pages["p"], pages["P"]
    borrowing_in_a_wait(pages, bound=0.2)
    pages["G"].close()  # the guest's process is gone; its page still says it borrows
    P.exit_io()
    assert pages["g"].borrowing()
    passed: list[bool] = []
    waiter = threading.Thread(target=lambda: passed.append(P.wait_gate()), daemon=True)
    waiter.start()
    waiter.join(30)  # a bound for a broken run, not a speed claim
    assert passed == [True]
    assert not p.yielding()
    pages["G"] = Channel.open(pages["g"].path)  # for the fixture's close


def test_a_guest_at_its_gate_is_not_waited_for(pages: dict[str, Channel]) -> None:
    P, G = pages["P"], pages["G"]
    borrowing_in_a_wait(pages, bound=3600.0)
    G.enter_io()
    G.exit_io()  # a short I/O of its own: it is no longer in the phase it began
    P.exit_io()
    assert P.wait_gate(timeout=0)


def test_a_primary_does_not_wait_for_a_guest_it_does_not_yield_to(
    pages: dict[str, Channel],
) -> None:
    p, P, G, H = pages["p"], pages["P"], pages["G"], pages["H"]
    p.set_yield((pages["h"].path,), bound=3600.0)  # h only: g ranks lower
    P.enter_io()
    assert G.wait_gate(timeout=0) and not H.wait_gate(timeout=0)  # g is ahead of h
    P.exit_io()
    assert P.wait_gate(timeout=0)
    assert not G.wait_gate(timeout=0)
    # h's turn comes when g waits on its own I/O; then the primary waits for h
    P.enter_io()
    pages["G"].enter_io()
    assert H.wait_gate(timeout=0)
    P.exit_io()
    assert not P.wait_gate(timeout=0)
    assert H.wait_gate(timeout=0)
    p.set_gate(True)  # the agent's plain open (the policy no longer says yield) wins
    assert P.wait_gate(timeout=0)


def test_a_guest_that_is_gone_is_not_waited_for(pages: dict[str, Channel]) -> None:
    p, P, G = pages["p"], pages["P"], pages["G"]
    p.set_yield((p.path.with_name("gone.chan"), pages["g"].path), bound=3600.0)
    P.enter_io()
    assert G.wait_gate(timeout=0)
    P.exit_io()
    assert not P.wait_gate(timeout=0)  # the guest that is gone is skipped, g is not


def test_a_torn_yield_sidecar_leaves_the_gate_open(pages: dict[str, Channel]) -> None:
    p, P, G = pages["p"], pages["P"], pages["G"]
    p.set_yield((pages["g"].path,), bound=3600.0)
    p.yield_path.write_text("garbage")  # before the step read it
    P.enter_io()
    assert G.wait_gate(timeout=0)
    P.exit_io()
    assert P.wait_gate(timeout=0)
    assert not G.wait_gate(timeout=0)


def _inp(*running: Running, cfg: PolicyConfig | None = None) -> PolicyInput:
    view = GpuView(0, 1 << 34, None, False, 100.0)
    return PolicyInput((), running, (view,), 10.0, cfg or PolicyConfig())


def test_the_policy_yields_a_primary_only_to_guests_that_rank_as_high() -> None:
    prim = Running(("r", "md"), gpus=(0,), priority=5)
    equal = Running(("r", "equal"), role="guest", gpus=(0,), paused=True, priority=5)
    higher = Running(("r", "higher"), role="guest", gpus=(0,), paused=True, priority=9)
    lower = Running(("r", "lower"), role="guest", gpus=(0,), paused=True, priority=1)
    bg = Running(("r", "bg"), role="guest", tier="background", gpus=(0,), paused=True, priority=7)
    d: Decision = decide(_inp(prim, equal, higher, lower, bg))
    assert d.standby == {0: ("r", "higher")}
    assert d.yield_to == {0: (("r", "higher"), ("r", "equal"))}
    assert decide(_inp(prim, lower)).yield_to == {}
    off = PolicyConfig(primary_yield=0.0)
    assert decide(_inp(prim, equal, cfg=off)).yield_to == {}


@pytest.fixture
def yield_node(m27_home: Path) -> Iterator[Node]:
    # a bound no phase here reaches: the primary always waits for the guest's phase
    n = make_node(m27_home, gpus=1, primary_yield=30.0).start()
    yield n
    end_steps()
    n.close()


def test_an_equal_guest_ends_its_phase_before_its_primary_computes_again(
    yield_node: Node, m27_home: Path, tmp_path: Path
) -> None:
    """The guest's phase (0.2 s) is four times its primary's I/O wait (0.05 s): stopped
    at its gate it would compute only in the waits; yielded to, it computes on after the
    wait until its own I/O (past `gate_grace`, without being stopped by signal), and the
    primary computes after that."""
    lease = yield_node.lease()
    stop = tmp_path / "stop"
    prim_out, guest_out = tmp_path / "p.txt", tmp_path / "g.txt"
    prim = run_step_leased(
        lease, "r1", "md", argv_of(prim_out, compute=0.05, io=0.05, until=stop), priority=3
    )
    wait_until(lambda: yield_node.of(ev.StepStarted), what="the primary's start")
    guest = run_step_leased(
        lease, "r2", "md", argv_of(guest_out, compute=0.2, io=0.3, until=stop), priority=3
    )

    def a_turn_taken_whole() -> bool:
        """A primary wait in which the guest began its phase, and after it the guest's
        chunks going on until its own I/O, not stopped by signal meanwhile, and only then
        the primary's next chunk. (A stop by signal elsewhere is timing, not this: a guest
        slow to its first gate call under load is stopped as one that uses none.)"""
        p_chunks, g_chunks = phases(prim_out, "compute"), phases(guest_out, "compute")
        g_io = phases(guest_out, "io")
        stops = [e.at for e in yield_node.of(ev.GuestPaused) if getattr(e, "how", "") == "signal"]
        for a, b in phases(prim_out, "io"):
            began = [c for c, _ in g_chunks if a <= c <= b]
            own_io = [x for x, _ in g_io if x > b]
            again = [c for c, _ in p_chunks if c > b]
            if not began or not own_io or not again:
                continue
            on = [c for c, _ in g_chunks if b < c < min(own_io)]
            stopped = any(b <= t <= min(own_io) for t in stops)
            if len(on) >= 3 and min(again) >= min(own_io) and not stopped:
                return True
        return False

    wait_until(a_turn_taken_whole, timeout=60, what="a guest phase ended before its primary")
    stop.touch()
    p, g = prim.wait(60), guest.wait(60)
    assert p is not None and p.ok and g is not None and g.ok
    lease.close()


def test_a_wide_primary_yields_to_its_guests_on_every_gpu_and_stops_when_told(
    tmp_path: Path,
) -> None:
    """`arm_standby` gives a 2-GPU primary one yield list with the guests of both GPUs,
    and plain opens its gate again once the policy names nobody to yield to."""
    prim = Held(("r", "wide"), (0, 1), "immediate", 0.0, None)
    g0 = Held(("r", "g0"), (0,), "ready", 0.0, None, guest=True, paused=True)
    g1 = Held(("r", "g1"), (1,), "ready", 0.0, None, guest=True, paused=True)
    held = {h.key: h for h in (prim, g0, g1)}
    channels = {
        h.key: Channel.create(tmp_path / f"{h.key[1]}.chan", gate_open=not h.guest)
        for h in held.values()
    }
    for ch in channels.values():  # each step has called gate() and io_wait() once
        step = Channel.open(ch.path)
        step.wait_gate(timeout=0)
        step.enter_io()
        step.exit_io()
        step.close()
    standby = {0: g0.key, 1: g1.key}
    primaries = {0: prim, 1: prim}

    def arm(yield_to: dict[int, tuple[StepKey, ...]]) -> None:
        arm_standby(standby, held, primaries, channels, set(), {}, lambda k: True,
                    yield_to=yield_to, yield_bound=0.02)  # fmt: skip

    arm({0: (g0.key,), 1: (g1.key,)})
    pch = channels[prim.key]
    assert pch.yields()
    lines = pch.yield_path.read_text().split("\n")
    assert float(lines[0]) == 0.02
    assert sorted(lines[1:]) == sorted(str(channels[k].path) for k in (g0.key, g1.key))
    assert channels[g0.key].following(pch.path) and channels[g1.key].following(pch.path)
    arm({0: (g0.key,), 1: (g1.key,)})
    assert pch.yields()  # the same list again: still yielding, the sidecar unchanged
    arm({})
    assert not pch.yields() and pch.gate_open()
    for ch in channels.values():
        ch.close()
