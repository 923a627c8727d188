"""Fair-share usage is folded from the log: a restarted agent and `m27 queue --why` see the
same recent GPU time per owner as the agent that watched it happen."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from m27 import events as ev
from m27.cli.main import main
from m27.clock import FakeClock
from m27.node.book import USAGE_HALF_LIFE_S, fold_book
from m27.store.sqlite import SqliteEventStore
from tests.unit.agent_helpers import GiB, Node, make_node

H = USAGE_HALF_LIFE_S


def _held_for(run: str, step: str, owner: str, at: float, seconds: float) -> list[ev.Event]:
    """A primary that held GPU 0 for `seconds` from `at`."""
    return [
        ev.StepRequested(at=at, run_id=run, step=step, type="gpu", gpus=1, owner=owner),
        ev.LeaseGranted(at, run, step, (0,), "immediate", ""),
        ev.LeaseReleased(at=at + seconds, run_id=run, step=step, gpus=(0,)),
    ]


def test_usage_is_decayed_gpu_time_per_owner_and_the_same_however_it_is_folded() -> None:
    t0 = 1_700_000_000.0
    log = [
        *_held_for("r", "a", "alice", t0, H),  # one half-life of GPU time
        ev.StepRequested(at=t0, run_id="r", step="g", type="gpu", gpus=1, owner="bob"),
        ev.LeaseGranted(t0, "r", "g", (0,), "ready", ""),
        ev.GuestStarted(at=t0, run_id="r", step="g", gpu=0),  # a guest: no primary time
        ev.LeaseReleased(at=t0 + H, run_id="r", step="g", gpus=(0,)),
    ]
    book = fold_book(log)
    # the integral of 2^-(t_end - t)/H over one half-life: H / ln 2 * (1 - 1/2)
    assert book.usage.at(t0 + H) == pytest.approx({"alice": H / math.log(2) / 2})
    assert book.usage.at(t0 + 2 * H)["alice"] == pytest.approx(H / math.log(2) / 4)
    # event by event or in one go, now or later: the same numbers
    again = fold_book([])
    for e in log:
        again.apply(e)
    assert again.usage.at(t0 + 2 * H) == book.usage.at(t0 + 2 * H)
    assert book.usage.at(t0 + 2 * H) == book.usage.at(t0 + 2 * H)  # reading changes nothing


def _cycle(node: Node) -> None:
    node.agent.poll()
    node.agent.tick()
    node.agent.poll()


def _agent(home: Path, clock: FakeClock) -> Node:
    node = make_node(home, gpus=1, memory=16 * GiB, guests_per_gpu=0)  # no guests: one queue
    node.agent.clock = clock
    node.agent.start()
    return node


def test_a_restarted_agent_keeps_fair_share_usage(m27_home: Path) -> None:
    clock = FakeClock()
    first = _agent(m27_home, clock)
    t0 = clock.now()
    first.store.append(
        [ev.StepRequested(at=t0, run_id="r", step="old", type="gpu", gpus=1, owner="alice")]
    )
    _cycle(first)
    clock.advance(3600)  # alice's step holds the GPU for an hour
    first.store.append([ev.LeaseReleased(at=clock.now(), run_id="r", step="old", gpus=(0,))])
    _cycle(first)
    before = first.agent.book.usage.at(clock.now())
    assert before["alice"] > 2000
    first.close()

    second = _agent(m27_home, clock)  # the node agent restarts and replays the log
    try:
        assert second.agent.book.usage.at(clock.now()) == pytest.approx(before)
        now = clock.now()
        second.store.append(
            [
                ev.StepRequested(at=now, run_id="r", step="x", type="gpu", gpus=1, owner="carol"),
            ]
        )
        _cycle(second)  # carol's step takes the GPU; alice and bob queue behind it
        second.store.append(
            [
                ev.StepRequested(at=now + 1, run_id="r", step="a1", type="gpu", owner="alice"),
                ev.StepRequested(at=now + 2, run_id="r", step="b1", type="gpu", owner="bob"),
            ]
        )
        clock.advance(60)
        _cycle(second)
        second.store.append([ev.LeaseReleased(at=clock.now(), run_id="r", step="x", gpus=(0,))])
        _cycle(second)
        grants = [e.step for e in second.of(ev.LeaseGranted)]  # type: ignore[attr-defined]
        # bob has had no GPU time, alice an hour of it before the restart: bob goes first
        assert grants == ["old", "x", "b1"]
    finally:
        second.close()


def test_queue_why_ranks_waiting_steps_with_the_agents_usage(
    m27_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("M27_GPUS", "sim:1x16GiB")
    t0 = time.time() - H - 100
    store = SqliteEventStore(m27_home / "events.db")
    store.append(
        [
            *_held_for("r", "old", "alice", t0, H),
            ev.StepRequested(at=t0 + H, run_id="r", step="x", type="gpu", gpus=1, owner="carol"),
            ev.LeaseGranted(t0 + H, "r", "x", (0,), "immediate", ""),
            # alice asked first, but she has had an hour of GPU time and bob none (neither
            # fits beside carol's step as a guest: both wait for the GPU)
            ev.StepRequested(
                at=t0 + H + 1, run_id="r", step="a1", type="gpu", owner="alice", gpu_memory=20 * GiB
            ),
            ev.StepRequested(
                at=t0 + H + 2, run_id="r", step="b1", type="gpu", owner="bob", gpu_memory=20 * GiB
            ),
        ]
    )
    store.close()
    assert main(["queue", "--why", "r/a1"]) == 0
    assert main(["queue", "--why", "r/b1"]) == 0
    a1, b1 = capsys.readouterr().out.splitlines()
    assert "rank 2 of 2" in a1 and "rank 1 of 2" in b1, (a1, b1)
