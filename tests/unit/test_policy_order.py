"""The kept queue order (m27.policy._order) equals the order sorted from scratch, call after
call: as the clock moves (steps age one point at a time), owners' held GPUs and usage
change, and the pending tuple loses and gains steps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from m27.policy import Pending, PolicyConfig
from m27.policy import _order as order_mod
from m27.policy._order import order_pending
from m27.policy._state import effective_priority


def reference(
    pending: Sequence[Pending],
    held: Mapping[str, int],
    usage: Mapping[str, float],
    now: float,
    cfg: PolicyConfig,
) -> list[tuple[Pending, int]]:
    """The documented order, by tuple sort: effective priority, then held + place among
    the owner's steps at that priority, then recent usage, then queue time, then the larger
    GPU need (GPUs x memory, declared or measured), then key."""
    eff = {p.key: effective_priority(p.priority, p.bump, p.queued_at, now, cfg) for p in pending}
    place: dict[tuple[object, ...], int] = {}
    seen: dict[tuple[int, str], int] = {}

    def need(p: Pending) -> int:
        return -max(1, p.gpus) * (p.gpu_memory or p.memory_peak)

    for p in sorted(pending, key=lambda p: (-eff[p.key], p.owner, p.queued_at, need(p), p.key)):
        group = (eff[p.key], p.owner)
        place[p.key] = seen.get(group, 0)
        seen[group] = place[p.key] + 1
    owners = {p.owner for p in pending}

    def key(p: Pending) -> tuple[object, ...]:
        if len(owners) <= 1:
            return (-eff[p.key], p.queued_at, need(p), p.key)
        share = held.get(p.owner, 0) + place[p.key]
        return (-eff[p.key], share, usage.get(p.owner, 0.0), p.queued_at, need(p), p.key)

    return [(p, eff[p.key]) for p in sorted(pending, key=key)]


steps = st.lists(
    st.tuples(
        st.sampled_from([0, 5, 10, 20, -10]),
        st.sampled_from("abc"),
        # steps queued together (equal queue times) are ordered by their GPU need
        st.one_of(st.sampled_from([0.0, 500.0]), st.floats(0, 20_000, allow_nan=False)),
        st.sampled_from(["gpu", "gpu", "gpu_light", "cpu"]),
        st.integers(1, 3),
        st.sampled_from([0, 4 * 2**30, 16 * 2**30]),  # declared gpu_memory
        st.sampled_from([0, 8 * 2**30]),  # measured peak
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(
    first=steps,
    later=steps,
    moves=st.lists(
        st.tuples(
            st.one_of(
                st.sampled_from([0.0, 1.0, 100.0, 299.0, 301.0]),
                st.floats(0, 1500, allow_nan=False),
            ),
            st.dictionaries(st.sampled_from("abc"), st.integers(0, 8)),
            st.dictionaries(st.sampled_from("abc"), st.sampled_from([0.0, 1.0, 5.0])),
            st.integers(0, 4),
        ),
        min_size=1,
        max_size=20,
    ),
)
@pytest.mark.parametrize("small", [0, 48], ids=["arrays", "short-queue path"])
def test_kept_order_equals_a_fresh_sort(
    small: int,
    first: list[tuple[int, str, float, str, int, int, int]],
    later: list[tuple[int, str, float, str, int, int, int]],
    moves: list[tuple[float, dict[str, int], dict[str, float], int]],
) -> None:
    # fast aging (a point every 300 s), a low cap so some steps reach it
    cfg = PolicyConfig(aging_per_s=1 / 300, aging_cap=30)

    def make(specs: list[tuple[int, str, float, str, int, int, int]], tag: str) -> list[Pending]:
        return [
            Pending(
                key=(f"{tag}{i}", "s"),
                type=t,  # type: ignore[arg-type]
                priority=prio,
                owner=owner,
                queued_at=q,
                gpus=k if t != "cpu" else 0,
                gpu_memory=mem if t != "cpu" else 0,
                memory_peak=peak if t != "cpu" else 0,
            )
            for i, (prio, owner, q, t, k, mem, peak) in enumerate(specs)
        ]

    waiting = make(first, "a")
    extra = make(later, "b")
    pending = tuple(waiting)
    now = 20_000.0
    order_mod._memo = order_mod._small_memo = None
    with patch.object(order_mod, "_SMALL", small):
        for dt, held, usage, churn in moves:
            now += dt
            if churn == 1 and len(pending) > 1:  # a grant: a step leaves, the rest stay
                pending = pending[1:]
            elif churn == 2 and extra:  # an arrival, queued now
                p = extra.pop()
                arrived = Pending(
                    key=p.key,
                    type=p.type,
                    priority=p.priority,
                    owner=p.owner,
                    gpus=p.gpus,
                    gpu_memory=p.gpu_memory,
                    memory_peak=p.memory_peak,
                    queued_at=now,
                )
                pending = (*pending, arrived)
            elif churn == 3 and len(extra) >= 2:  # one leaves from the middle, two arrive at once
                pair = [extra.pop(), extra.pop()]
                mid = len(pending) // 2
                pending = (
                    *pending[:mid],
                    *pending[mid + 1 :],
                    *(
                        Pending(
                            key=p.key,
                            type=p.type,
                            priority=p.priority,
                            owner=p.owner,
                            gpus=p.gpus,
                            gpu_memory=p.gpu_memory,
                            memory_peak=p.memory_peak,
                            queued_at=now,
                        )
                        for p in pair
                    ),
                )
            got = order_pending(pending, held, usage, now, cfg)
            want = reference(pending, held, usage, now, cfg)
            assert [(r.pending, r.eff) for r in got] == want
            bg = cfg.background_priority_max
            for r in got:
                assert r.background == (r.pending.type == "gpu_light" or r.eff < bg)
