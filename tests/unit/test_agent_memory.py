"""Guests without declarations: admitted by observed free memory or a measured peak, with
real step processes on a simulated GPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from m27 import events as ev
from m27.node.book import fold_book, policy_input
from tests.unit.agent_helpers import GiB, Node, make_node, run_step_leased, step_argv
from tests.waiting import wait_until


@pytest.fixture
def node(m27_home: Path) -> Iterator[Node]:
    n = make_node(m27_home, gpus=1).start()
    yield n
    n.close()


def test_a_gpu_step_without_declared_memory_runs_as_a_guest_in_the_primarys_io(
    node: Node, m27_home: Path, tmp_path: Path
) -> None:
    lease = node.lease()
    prim = run_step_leased(
        lease, "r1", "md", step_argv(tmp_path / "p.txt", cycles=6, compute=0.05, io=0.2),
        gpu_memory=0, priority=10,
    )  # fmt: skip
    wait_until(lambda: node.of(ev.StepStarted), what="the primary's start")
    guest = run_step_leased(
        lease, "r2", "ana", step_argv(tmp_path / "g.txt", cycles=2, compute=0.2, io=0.0),
        gpu_memory=0,
    )  # fmt: skip
    wait_until(
        lambda: any(e.step == "ana" for e in node.of(ev.GuestResumed)),  # type: ignore[attr-defined]
        what="the undeclared guest resumed in the primary's I/O wait",
    )
    p, g = prim.wait(60), guest.wait(60)
    assert p is not None and p.ok and g is not None and g.ok
    grants = {e.step: e.tier for e in node.of(ev.LeaseGranted)}  # type: ignore[attr-defined]
    assert grants == {"md": "immediate", "ana": "ready"}
    lease.close()


def test_a_steps_peak_gpu_memory_is_recorded_at_release_and_admits_its_next_run(
    node: Node, m27_home: Path, tmp_path: Path
) -> None:
    lease = node.lease()
    run = run_step_leased(
        lease, "r1", "fit", step_argv(tmp_path / "a.txt", cycles=3, compute=0.1, io=0.05),
        gpu_memory=3 * GiB,
    )  # fmt: skip
    done = run.wait(60)
    assert done is not None and done.ok
    (measured,) = wait_until(
        lambda: node.of(ev.StepMemoryMeasured), what="the step's measured peak"
    )
    assert isinstance(measured, ev.StepMemoryMeasured)
    assert (measured.step, measured.gpu, measured.peak_bytes) == ("fit", 0, 3 * GiB)

    # the next run of the same pipeline step declares nothing: the policy sees its peak
    request = ev.StepRequested(at=1.0, run_id="r9", step="fit", type="gpu", gpus=1)
    book = fold_book([*node.store.read(), request])
    assert book.memory_peaks == {"fit": 3 * GiB}
    inp = policy_input(book, (), 2.0, node.agent.config)
    (pending,) = [p for p in inp.pending if p.key == ("r9", "fit")]
    assert pending.gpu_memory == 0 and pending.memory_peak == 3 * GiB
    lease.close()
