"""The agent's queue, driven tick by tick: memory admission, aging, fair share, reservation.

Requests come straight from the log (as other processes would write them) and the agent
is stepped by hand on a FakeClock, so every assertion is about what the agent decided.
"""

from __future__ import annotations

from pathlib import Path

from m27 import events as ev
from m27.clock import FakeClock
from tests.unit.agent_helpers import GiB, Node, make_node


def _cycle(node: Node) -> None:
    node.agent.poll()
    node.agent.tick()
    node.agent.poll()


def _request(node: Node, step: str, *, at: float, **kw: object) -> None:
    fields: dict[str, object] = {"type": "gpu", "gpus": 1, "owner": "u", **kw}
    node.store.append([ev.StepRequested(at=at, run_id="r", step=step, **fields)])  # type: ignore[arg-type]


def _release(node: Node, step: str, at: float) -> None:
    node.store.append([ev.LeaseReleased(at=at, run_id="r", step=step)])


def _grants(node: Node) -> list[ev.LeaseGranted]:
    return [e for e in node.events() if isinstance(e, ev.LeaseGranted)]


def _started(home: Path, gpus: int = 1, memory: int = 16 * GiB, **config: float) -> Node:
    node = make_node(home, gpus=gpus, memory=memory, **config)
    node.agent.clock = FakeClock()
    node.agent.start()
    return node


def test_a_guest_is_admitted_only_if_its_memory_fits_beside_the_primary(m27_home: Path) -> None:
    node = _started(m27_home, memory=10 * GiB)
    now = node.agent.clock.now()
    _request(node, "primary", at=now, gpu_memory=8 * GiB, priority=10)
    _cycle(node)
    _request(node, "big", at=now + 1, gpu_memory=4 * GiB, priority=5)
    _request(node, "small", at=now + 2, gpu_memory=2 * GiB)
    node.agent.poll()
    decision = node.agent.tick()
    node.agent.poll()
    tiers = {g.step: g.tier for g in _grants(node)}
    assert tiers == {"primary": "immediate", "small": "ready"}
    assert "does not fit" in decision.why(("r", "big"))
    node.close()


def test_overprovision_admits_a_guest_that_fits_only_with_it(m27_home: Path) -> None:
    node = _started(m27_home, memory=10 * GiB, memory_overprovision=1.5)
    now = node.agent.clock.now()
    _request(node, "primary", at=now, gpu_memory=8 * GiB, priority=10)
    _cycle(node)
    _request(node, "big", at=now + 1, gpu_memory=4 * GiB)
    _cycle(node)
    assert {g.step: g.tier for g in _grants(node)} == {"primary": "immediate", "big": "ready"}
    node.close()


def test_aging_lets_a_low_priority_step_through_a_stream_of_higher_ones(m27_home: Path) -> None:
    # one point an hour; no guests: undeclared steps would be guests (issue 16.3)
    node = _started(m27_home, aging_per_s=1 / 3600, guests_per_gpu=0)
    clock = node.agent.clock
    assert isinstance(clock, FakeClock)
    _request(node, "holder", at=clock.now())
    _cycle(node)
    _request(node, "low", at=clock.now(), priority=0)
    holder = "holder"
    order = []
    for hour in range(8):
        clock.advance(3600)
        _request(node, f"high{hour}", at=clock.now(), priority=4)
        _release(node, holder, clock.now())
        _cycle(node)
        holder = _grants(node)[-1].step
        order.append(holder)
        if holder == "low":
            break
    # higher priority first while the gap lasts; once aged level, the older step goes
    assert order == ["high0", "high1", "high2", "low"]
    node.close()


def test_equal_priorities_alternate_between_owners(m27_home: Path) -> None:
    node = _started(m27_home, guests_per_gpu=0)  # undeclared steps would be guests
    clock = node.agent.clock
    assert isinstance(clock, FakeClock)
    t0 = clock.now()
    _request(node, "x", at=t0, owner="carol")
    _cycle(node)
    for i, name in enumerate(["a1", "a2", "a3"]):
        _request(node, name, at=t0 + 1 + i, owner="alice")
    _request(node, "b1", at=t0 + 10, owner="bob")
    holder = "x"
    order = []
    for _ in range(4):
        clock.advance(600)
        _cycle(node)  # GPU time accrues to the holder's owner
        _release(node, holder, clock.now())
        _cycle(node)
        holder = _grants(node)[-1].step
        order.append(holder)
    # first in line goes first; then bob, who has had no GPU time, before alice's next
    assert order == ["a1", "b1", "a2", "a3"]
    node.close()


def test_a_multi_gpu_step_reserves_the_gpus_that_free_first(m27_home: Path) -> None:
    node = _started(m27_home, gpus=2, guests_per_gpu=0)  # undeclared steps would be guests
    now = node.agent.clock.now()
    _request(node, "h0", at=now)
    _request(node, "h1", at=now + 1)
    _cycle(node)
    _request(node, "wide", at=now + 2, gpus=2, priority=5)
    _request(node, "narrow", at=now + 3, gpus=1)
    _cycle(node)
    _release(node, "h0", now + 4)
    _cycle(node)
    # GPU freed, but held for the wide step: the narrow one, behind it, does not take it
    assert [g.step for g in _grants(node)] == ["h0", "h1"]
    _release(node, "h1", now + 5)
    _cycle(node)
    grants = _grants(node)
    assert [(g.step, g.gpus) for g in grants[2:]] == [("wide", (0, 1))]
    node.close()


def test_a_grant_that_lands_after_its_request_was_withdrawn_is_taken_back(
    m27_home: Path,
) -> None:
    node = _started(m27_home)
    now = node.agent.clock.now()
    _request(node, "s", at=now)
    node.agent.poll()
    # the client gives up before the agent's grant lands (as AgentLease.acquire does)
    node.store.append(
        [
            ev.StepCancelled(at=now, run_id="r", step="s"),
            ev.LeaseReleased(at=now, run_id="r", step="s"),
        ]
    )
    node.agent.tick()  # decides on what it had read: grants after the withdrawal
    _cycle(node)
    node.agent.poll()
    kinds = [e.kind for e in node.events() if getattr(e, "step", "") == "s"]
    assert kinds[-2:] == ["LeaseGranted", "LeaseReleased"]
    assert node.agent.book.held == {}
    node.close()
