"""decide() reuses what it built from inputs it saw before (the guests by GPU of a lease
tuple, the views of a view tuple, the queue order); that must never show in a decision."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from m27.policy import Decision, GpuView, PolicyConfig, PolicyInput, Running, Tier, decide
from m27.policy._state import GpuState, Slot, by_guest_rank, place_leases
from tests.unit.test_policy import node_inputs
from tests.unit.test_policy_hold import busy_nodes

TIERS: list[Tier] = ["ready", "background", "immediate"]


def fresh_copy(inp: PolicyInput) -> PolicyInput:
    """The same input in new objects (no memo can know them)."""
    return PolicyInput(
        tuple(replace(p) for p in inp.pending),
        tuple(replace(r) for r in inp.running),
        tuple(replace(v) for v in inp.gpus),
        inp.now,
        replace(inp.config),
        dict(inp.usage_by_owner),
    )


def same(a: Decision, b: Decision) -> None:
    assert a.actions == b.actions
    assert a.next_check == b.next_check
    assert dict(a.standby) == dict(b.standby)


@settings(max_examples=300, deadline=None)
@given(st.one_of(node_inputs(), busy_nodes()), st.floats(0.0, 5000.0))
def test_a_decision_does_not_depend_on_what_was_decided_before(
    inp: PolicyInput, later: float
) -> None:
    first = decide(inp)
    # the same leases at another time (other priorities by aging), then a fresh copy
    decide(replace(inp, now=inp.now + later))
    again, copy = decide(inp), decide(fresh_copy(inp))
    same(first, again)
    same(first, copy)
    # reasons are built on first access, after the other decisions shared its Slots
    assert first.reasons == copy.reasons


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(TIERS),
            st.integers(-10, 30),
            st.floats(0.0, 10_000.0),
        ),
        min_size=1,
        max_size=5,
    ),
    st.floats(0.0, 20_000.0),
    st.booleans(),
)
def test_leases_rank_as_their_slots_would(
    specs: list[tuple[Tier, int, float]], now: float, fifo: bool
) -> None:
    cfg = PolicyConfig(aging_per_s=0.01, aging_cap=50, fifo=fifo)  # aging counts here
    leases = [
        Running(("s", str(n)), role="guest", tier=t, gpus=(0,), priority=p, queued_at=q)
        for n, (t, p, q) in enumerate(specs)
    ]
    gpus = {0: GpuState(GpuView(0))}
    place_leases(leases, now, cfg, gpus)
    slots = sorted(gpus[0].guests, key=Slot.guest_rank)
    assert [r.key for r in by_guest_rank(leases, now, cfg)] == [s.key for s in slots]
