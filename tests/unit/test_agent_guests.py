"""The agent with real step processes on simulated GPUs: primaries, guests, promotion."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from m27 import events as ev
from m27.node.lease import AgentLease
from tests.unit.agent_helpers import (
    GiB,
    Node,
    make_node,
    phases,
    run_step_leased,
    step_argv,
    windows,
)

#: Slack for comparing event times with the steps' own records: a few agent ticks plus the
#: guest's compute chunk, which it finishes before stopping at its gate.
TOL = 0.15


@pytest.fixture
def node(m27_home: Path) -> Iterator[Node]:
    n = make_node(m27_home, gpus=1).start()
    yield n
    n.close()


def _until(pred: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def _granted(node: Node, step: str) -> Callable[[], bool]:
    return lambda: any(getattr(e, "step", "") == step for e in node.of(ev.LeaseGranted))


def _inside(t: float, spans: list[tuple[float, float]], tol: float = TOL) -> bool:
    return any(a - tol <= t <= b + tol for a, b in spans)


def test_guest_computes_only_while_the_primary_waits_on_io_and_is_promoted_without_reload(
    node: Node, m27_home: Path, tmp_path: Path
) -> None:
    lease = AgentLease(node.store, m27_home, embed=False)
    prim_out, guest_out = tmp_path / "p.txt", tmp_path / "g.txt"
    prim = run_step_leased(
        lease, "r1", "md", step_argv(prim_out, cycles=3, compute=0.1, io=0.12), priority=10
    )
    _until(_granted(node, "md"))
    guest = run_step_leased(
        lease,
        "r2",
        "next",
        step_argv(guest_out, cycles=1, compute=0.5, io=0.0, load=0.05),
        gpu_memory=2 * GiB,
    )
    p, g = prim.wait(), guest.wait()
    assert p is not None and p.ok and g is not None and g.ok
    events = node.events()
    grants = {e.step: e for e in events if isinstance(e, ev.LeaseGranted)}
    assert grants["md"].tier == "immediate" and grants["next"].tier == "ready"
    assert grants["next"].gpus == grants["md"].gpus == (0,)

    # the primary's I/O waits, and its exit after its last phase (no compute either)
    io = phases(prim_out, "io")
    io.append((max(b for _, b in io), float("inf")))
    opened = list(windows(events, ("r2", "next")))
    assert opened, "the guest never ran beside the primary"
    prim_compute = phases(prim_out, "compute")
    for start, end in opened:  # the agent let the guest compute only during the primary's I/O
        assert _inside(start, io), (start, io)
        # ... and paused it as soon as the primary computed again
        assert not any(start + TOL < c < end - TOL for c, _ in prim_compute), (start, end)

    (promoted,) = [e for e in events if isinstance(e, ev.Promoted)]
    assert promoted.step == "next"
    assert promoted.at >= max(b for _, b in phases(prim_out, "compute"))
    for a, _ in phases(guest_out, "compute"):  # each chunk began with its gate open
        assert a >= promoted.at - TOL or any(s - TOL <= a <= e + TOL for s, e in opened)
    # the guest's computation never overlapped the primary's
    for a, b in phases(guest_out, "compute"):
        for c, d in phases(prim_out, "compute"):
            assert min(b, d) - max(a, c) <= TOL
    # promotion kept the process and its loaded data: one start, one load
    started = [e for e in events if isinstance(e, ev.StepStarted) and e.step == "next"]
    assert len(started) == 1 and len(phases(guest_out, "load")) == 1
    released = [e.step for e in events if isinstance(e, ev.LeaseReleased)]
    assert sorted(released) == ["md", "next"]
    assert not list((m27_home / "channels").rglob("*.chan"))
    lease.close()


def test_a_guest_without_a_gate_is_stopped_by_signal_and_continued_when_promoted(
    node: Node, m27_home: Path, tmp_path: Path
) -> None:
    lease = AgentLease(node.store, m27_home, embed=False)
    flag = tmp_path / "finish"
    prim = run_step_leased(
        lease, "r1", "md", step_argv(tmp_path / "p.txt", compute=0.05, io=0.0, until=flag)
    )
    _until(_granted(node, "md"))
    guest = run_step_leased(
        lease,
        "r2",
        "blackbox",
        step_argv(tmp_path / "g.txt", cycles=1, compute=0.1, io=0.0, gated=False),
        gpu_memory=GiB,
    )
    _until(lambda: any(e.how == "signal" for e in node.of(ev.GuestPaused)))  # type: ignore[attr-defined]
    (started,) = [e for e in node.of(ev.StepStarted) if e.step == "blackbox"]  # type: ignore[attr-defined]
    pid = started.pid  # type: ignore[attr-defined]

    def state() -> str:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rfind(")") + 2]

    # stopped while the primary computes (SIGSTOP lands when the kernel next runs it)
    _until(lambda: state() == "T", timeout=10.0)
    flag.write_text("done")
    p, g = prim.wait(), guest.wait()
    assert p is not None and p.ok and g is not None and g.ok
    promoted = [e for e in node.of(ev.Promoted)]
    assert [e.step for e in promoted] == ["blackbox"]  # type: ignore[attr-defined]
    # once stopped, it computed no more until its promotion
    stopped = min(e.at for e in node.of(ev.GuestPaused) if e.how == "signal")  # type: ignore[attr-defined]
    for a, _ in phases(tmp_path / "g.txt", "compute"):
        assert not stopped + TOL < a < promoted[0].at - TOL
    lease.close()
