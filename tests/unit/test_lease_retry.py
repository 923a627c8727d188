"""`retry_delay:` on a leased step: the failed attempt's lease is given back for the delay,
so the GPU serves the queue meanwhile, and the next attempt asks again (m27.node.lease)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from m27 import events as ev
from tests.unit.agent_helpers import GiB, Node, make_node, run_step_leased
from tests.waiting import wait_until


@pytest.fixture
def node(m27_home: Path) -> Iterator[Node]:
    n = make_node(m27_home, gpus=1).start()
    yield n
    n.close()


def _of(node: Node, step: str, cls: type[ev.Event]) -> list[tuple[int, ev.Event]]:
    return [
        (r.seq, r.event)
        for r in node.store.read()
        if isinstance(r.event, cls) and getattr(r.event, "step", None) == step
    ]


def test_a_step_waiting_out_its_retry_delay_leaves_its_gpu_to_the_queue(
    node: Node, tmp_path: Path
) -> None:
    lease = node.lease()
    go, again = tmp_path / "go", tmp_path / "again"
    # attempt 1 waits for `go`, then fails; attempt 2 succeeds
    flaky = (
        f"if [ -e {again} ]; then exit 0; fi; touch {again}; "
        f"while [ ! -e {go} ]; do sleep 0.01; done; exit 3"
    )
    md = run_step_leased(
        lease, "r1", "md", ("sh", "-c", flaky), gpu_memory=12 * GiB, retries=1, retry_delay=0.2
    )
    wait_until(lambda: _of(node, "md", ev.StepStarted), what="md's first attempt")
    # too big to be a guest beside md: it waits for the GPU itself
    fit = run_step_leased(lease, "r2", "fit", ("true",), gpu_memory=12 * GiB)
    wait_until(lambda: _of(node, "fit", ev.StepRequested), what="fit's request")
    go.touch()
    m, f = md.wait(60), fit.wait(60)
    assert m is not None and m.ok and m.attempts == 2 and f is not None and f.ok
    failed = [(seq, e) for seq, e in _of(node, "md", ev.StepFailed)]
    # the wait is in the event: `m27 status` and `m27 queue` say when attempt 2 asks
    assert [(e.attempt, e.will_retry, e.retry_delay) for _, e in failed] == [(1, True, 0.2)]  # type: ignore[attr-defined]
    assert [e.attempt for _, e in _of(node, "md", ev.StepStarted)] == [1, 2]  # type: ignore[attr-defined]
    released = [seq for seq, _ in _of(node, "md", ev.LeaseReleased)]
    granted = [seq for seq, _ in _of(node, "md", ev.LeaseGranted)]
    (fit_granted,) = [seq for seq, _ in _of(node, "fit", ev.LeaseGranted)]
    assert len(granted) == len(released) == 2
    # md gave its lease back after attempt 1, fit had the GPU, then md asked again
    assert failed[0][0] < released[0] < fit_granted < granted[1]
    lease.close()


def test_a_step_cancelled_in_its_retry_delay_ends_cancelled_without_a_lease(
    node: Node,
) -> None:
    lease = node.lease()
    cancel = threading.Event()
    md = run_step_leased(
        lease, "r1", "md", ("sh", "-c", "exit 3"), retries=3, retry_delay=3600.0, cancel=cancel
    )
    wait_until(lambda: _of(node, "md", ev.StepFailed), what="md's first attempt failing")
    cancel.set()
    result = md.wait(60)  # not an hour: the delay is cut short by the cancel
    assert result is not None and result.cancelled and result.attempts == 1
    wait_until(lambda: _of(node, "md", ev.StepCancelled), what="md recorded as cancelled")
    assert len(_of(node, "md", ev.LeaseGranted)) == len(_of(node, "md", ev.LeaseReleased)) == 1
    assert len(_of(node, "md", ev.StepRequested)) == 1  # no lease asked for after the cancel
    lease.close()


def test_a_lease_counts_the_time_its_guest_is_held(m27_home: Path) -> None:
    """What the runner leaves out of a guest's `timeout:`: from each GuestPaused to the
    GuestResumed (or Promoted) after it, and a hold still going, as the log says them."""
    from m27.node.lease import AgentLease, Granted
    from m27.store.memory import MemoryEventStore

    lease = AgentLease(MemoryEventStore(), m27_home, embed=False)
    granted = Granted((0,), "ready")
    lease._held[("r1", "ana")] = granted
    for e in [
        ev.GuestPaused(10.0, "r1", "ana", 0),
        ev.GuestPaused(11.0, "r1", "ana", 0),  # said again: still the hold from 10
        ev.GuestResumed(14.0, "r1", "ana", 0),
        ev.GuestPaused(20.0, "r2", "ana", 0),  # another run's step of the same name
        ev.GuestPaused(30.0, "r1", "ana", 0),
    ]:
        lease._dispatch(e)
    assert granted.hold.seconds(now=32.5) == 6.5  # 4 s, and 2.5 s of the hold still going
    lease._dispatch(ev.Promoted(33.0, "r1", "ana", 0))
    assert granted.hold.seconds(now=100.0) == 7.0
    lease.close()
