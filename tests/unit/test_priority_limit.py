"""Priorities and bumps stay within PRIORITY_LIMIT wherever they reach the policy: a value
past int64 in a long queue raised OverflowError inside `decide()`, every tick."""

from __future__ import annotations

from pathlib import Path

import pytest

from m27 import events as ev
from m27._exceptions import SpecError
from m27.node.book import fold_book, policy_input
from m27.policy import PRIORITY_LIMIT, GpuView, Grant, PolicyConfig, bounded, decide
from m27.sim.trace import load_trace
from m27.spec._limits import PRIORITY_LIMIT as SPEC_PRIORITY_LIMIT

GIB = 2**30


def test_the_policy_bound_is_the_pipeline_files_bound() -> None:
    assert PRIORITY_LIMIT == SPEC_PRIORITY_LIMIT
    assert [bounded(v) for v in (-(10**30), -5, 0, 7, 10**30)] == [
        -PRIORITY_LIMIT,
        -5,
        0,
        7,
        PRIORITY_LIMIT,
    ]


def test_a_huge_bump_in_the_log_orders_a_long_queue_without_overflow() -> None:
    """200 waiting steps (ordered in numpy int64 arrays), one bumped by 10^20 in an event
    written by hand and one requested with priority -10^30: decide() ranks them first and
    last instead of raising."""
    requests = [
        ev.StepRequested(at=float(i), run_id="r", step=f"s{i}", type="gpu", gpus=1)
        for i in range(200)
    ]
    low = ev.StepRequested(at=0.5, run_id="r", step="low", type="gpu", gpus=1, priority=-(10**30))
    book = fold_book([*requests, low, ev.PriorityBumped(1.0, "r", "s150", 10**20)])
    gpus = (GpuView(0, memory_total=16 * GIB, memory_used=0),)
    inp = policy_input(book, gpus, 300.0, PolicyConfig(guests_per_gpu=0))
    by_key = {p.key: p for p in inp.pending}
    assert (by_key["r", "s150"].bump, by_key["r", "low"].priority) == (
        PRIORITY_LIMIT,
        -PRIORITY_LIMIT,
    )
    decision = decide(inp)
    grants = [a.key for a in decision.actions if isinstance(a, Grant)]
    assert grants == [("r", "s150")]
    assert decision.reasons["r", "low"].startswith(
        "waiting: rank 1 of 1 in the background queue, prio -1000000000"
    )
    assert decision.reasons["r", "s0"].startswith("waiting: rank 2 of 200 in the gpu queue")


def test_a_trace_job_past_the_priority_limit_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"trace": {"name": "x"}}\n'
        '{"id": "a", "arrival": 0, "phases": [["compute", 1]], "priority": 1000000001}\n'
    )
    with pytest.raises(SpecError) as caught:
        load_trace(path)
    assert f"{path}:2:" in str(caught.value)
    assert "priority must be within ±1,000,000,000, not 1000000001" in str(caught.value)
