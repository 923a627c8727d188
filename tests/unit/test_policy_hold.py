"""decide()'s busy-node shortcut (m27.policy._hold) returns what the full pass returns."""

from __future__ import annotations

from dataclasses import replace
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from m27.policy import (
    Decision,
    GpuView,
    Pending,
    PolicyConfig,
    PolicyInput,
    Reserve,
    Running,
    decide,
)
from tests.unit.test_policy import node_inputs

G = 2**30


def full_pass(inp: PolicyInput) -> Decision:
    with patch("m27.policy.nothing_starts", return_value=False):
        return decide(inp)


@st.composite
def busy_nodes(draw: st.DrawFn) -> PolicyInput:
    """Every GPU has a primary (some 2-GPU, some background) and mostly full guest slots;
    a long queue with multi-GPU steps, several owners, time limits, cpu steps."""
    n = draw(st.integers(1, 6))
    slots = draw(st.integers(0, 2))
    running: list[Running] = []
    i = 0
    while i < n:
        k = 2 if i + 1 < n and draw(st.booleans()) else 1
        tier = draw(st.sampled_from(["immediate", "immediate", "background"]))
        running.append(
            Running(
                ("p", str(i)), tier=tier, gpus=tuple(range(i, i + k)), gpu_memory=4 * G,
                owner=draw(st.sampled_from("ab")), started_at=float(draw(st.integers(0, 50))),
                time_limit=draw(st.sampled_from([None, 100.0, 300.0])),
                io_waiting=draw(st.booleans()),
            )
        )  # fmt: skip
        for j in range(draw(st.integers(0, slots)) if draw(st.booleans()) else slots):
            running.append(Running(("g", f"{i}.{j}"), role="guest", tier="ready", gpus=(i,),
                                   paused=draw(st.booleans()), gpu_memory=G))  # fmt: skip
        i += k
    for c in range(draw(st.integers(0, 2))):
        running.append(Running(("c", str(c)), type="cpu", role="cpu"))
    pending = tuple(
        Pending(
            ("q", str(j)),
            type=draw(st.sampled_from(["cpu", "gpu", "gpu", "gpu", "gpu_light"])),
            priority=draw(st.integers(-10, 30)),
            bump=draw(st.sampled_from([0, 0, 5])),
            owner=draw(st.sampled_from(["a", "b", "c"])),
            gpus=draw(st.sampled_from([1, 1, 1, 2, 3, 8])),
            gpu_memory=draw(st.integers(0, 20)) * G,
            queued_at=float(draw(st.integers(0, 100))),
            time_limit=draw(st.sampled_from([None, 50.0, 500.0])),
        )
        for j in range(draw(st.integers(1, 30)))
    )
    lost = draw(st.booleans()) and n > 1
    views = tuple(GpuView(g, 16 * G, None, lost and g == n - 1, 100.0) for g in range(n))
    cfg = PolicyConfig(
        guests_per_gpu=slots,
        cpu_slots=draw(st.integers(0, 2)),
        aging_per_s=draw(st.sampled_from([0.0, 1 / 1800, 0.1])),
    )
    usage = {"a": float(draw(st.integers(0, 9))), "b": 0.0}
    return PolicyInput(pending, tuple(running), views, 200.0, cfg, usage)


def _same(inp: PolicyInput) -> None:
    fast, full = decide(inp), full_pass(inp)
    assert fast.actions == full.actions
    assert fast.next_check == full.next_check
    assert fast.standby == full.standby
    assert fast.followers == full.followers
    assert fast.yield_to == full.yield_to
    assert fast.reasons == full.reasons


@settings(max_examples=400, deadline=None)
@given(busy_nodes())
def test_a_busy_node_is_decided_as_the_full_pass_decides_it(inp: PolicyInput) -> None:
    _same(inp)


@settings(max_examples=200, deadline=None)
@given(node_inputs())
def test_any_node_is_decided_as_the_full_pass_decides_it(inp: PolicyInput) -> None:
    _same(inp)


def test_on_a_busy_node_the_first_multi_gpu_step_by_rank_still_reserves() -> None:
    running = (Running(("p", "0"), gpus=(0,)), Running(("p", "1"), gpus=(1,)))
    running += (Running(("g", "0"), role="guest", gpus=(0,), paused=True, gpu_memory=G),)
    running += (Running(("g", "1"), role="guest", gpus=(1,), paused=True, gpu_memory=G),)
    pending = (
        Pending(("q", "wide-late"), priority=10, gpus=2, queued_at=50.0),
        Pending(("q", "one"), priority=20),
        Pending(("q", "wide-early"), priority=10, gpus=2, queued_at=10.0),
    )
    views = (GpuView(0, 16 * G), GpuView(1, 16 * G))
    d = decide(PolicyInput(pending, running, views, 100.0))
    assert d.actions == (Reserve(("q", "wide-early"), (0, 1)),)
    assert (
        "reserves GPU 0, 1: it starts once both are free (no new primary starts there meanwhile)"
        in d.why(("q", "wide-early"))
    )


@settings(max_examples=200, deadline=None)
@given(busy_nodes())
def test_gating_with_nothing_pending_names_what_the_full_pass_names(inp: PolicyInput) -> None:
    """With nothing pending decide() gates the leases themselves (no Slots); beside a
    pending CPU step that cannot start, the full pass gates the same way: the same
    standby, followers and guests the primaries yield to."""
    idle = PolicyInput((), inp.running, inp.gpus, inp.now, inp.config, inp.usage_by_owner)
    cpu = Pending(("z", "cpu"), type="cpu", queued_at=inp.now)
    config = replace(inp.config, cpu_slots=0)
    blocked = PolicyInput((cpu,), inp.running, inp.gpus, inp.now, config, inp.usage_by_owner)
    lean, full = decide(idle), full_pass(blocked)
    assert lean.standby == full.standby
    assert lean.followers == full.followers
    assert lean.yield_to == full.yield_to
