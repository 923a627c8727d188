"""A step whose lease has not come after WAIT_TOLD_S says so once per request: its Prefect
task is Running from the moment it asks, and its log told nothing until it started."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from flows._run import waiting_line
from m27 import events as ev
from m27.clock import FakeClock
from m27.node.lease import WAIT_TOLD_S, AgentLease, Granted
from m27.store.sqlite import open_store
from tests.waiting import wait_until


def test_a_request_not_granted_in_time_is_told_once_then_granted(m27_home: Path) -> None:
    store, clock = open_store(m27_home), FakeClock()
    lease = AgentLease(store, m27_home, embed=False, poll=0.01, clock=clock)
    told: list[float] = []
    polls = [0]

    def polled() -> bool:  # called once per turn of the wait: lets the test see it turn
        polls[0] += 1
        return False

    def turns(n: int) -> None:
        seen = polls[0]
        wait_until(lambda: polls[0] >= seen + n, what=f"{n} more turns of the wait")

    got: list[Granted | None] = []
    waiter = threading.Thread(
        target=lambda: got.append(
            lease.acquire(
                "r", "md", "gpu", gpus=2, cancelled=polled, on_wait=lambda: told.append(clock.now())
            )
        )
    )
    start = clock.now()
    waiter.start()
    turns(3)
    clock.advance(WAIT_TOLD_S - 0.1)
    turns(3)
    assert told == []
    clock.advance(0.1)
    wait_until(lambda: told, what="the wait told")
    clock.advance(10 * WAIT_TOLD_S)
    turns(3)
    assert told == [start + WAIT_TOLD_S]  # once per request
    store.append([ev.LeaseGranted(clock.now(), "r", "md", (0, 1))])
    waiter.join(30)
    assert got and got[0] is not None and got[0].gpus == (0, 1)
    lease.close()
    store.close()


def test_the_waiting_line_says_what_where_and_how_to_learn_why() -> None:
    host = socket.gethostname()
    assert waiting_line("md", 2) == (
        f"waiting for 2 GPUs on {host} (`m27 queue --why md` there says why)"
    )
    assert waiting_line("prep", 0).startswith("waiting for a CPU slot on ")
    assert waiting_line("fit", 1).startswith("waiting for a GPU on ")
