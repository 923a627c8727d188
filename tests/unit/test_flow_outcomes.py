"""The walk's bookkeeping: which waiting step is ready, which is doomed, and by which of
its dependencies (the first it lists that did not succeed), kept up to date per outcome
instead of asked of every dependency on every pass."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from flows._outcomes import NOT_DONE, Outcomes


def test_a_step_is_ready_when_every_dependency_succeeded_and_named_by_the_first_that_did_not() -> (
    None
):
    o = Outcomes([("a", ()), ("b", ()), ("c", ()), ("join", ("c", "b", "a", "b"))])
    assert o.ready("a") and not o.ready("join")
    o.settle("a", "failed")
    assert not o.ready("join") and o.first_failed("join") == "a"
    o.settle("b", "cancelled")  # listed before `a`: now the first that did not succeed
    assert o.first_failed("join") == "b"
    o.settle("c", "succeeded")
    assert not o.ready("join") and o.first_failed("join") == "b"
    assert o.outcome == {"a": "failed", "b": "cancelled", "c": "succeeded"}


def test_a_repeated_dependency_counts_once() -> None:
    o = Outcomes([("a", ()), ("b", ("a", "a"))])
    o.settle("a", "succeeded")
    assert o.ready("b") and o.first_failed("b") is None


_RESULTS = ("succeeded", *NOT_DONE)


@given(
    n=st.integers(1, 8),
    edges=st.sets(st.tuples(st.integers(0, 7), st.integers(0, 7))),
    results=st.lists(st.sampled_from(_RESULTS), min_size=8, max_size=8),
    settled=st.integers(0, 8),
)
def test_it_answers_as_asking_every_dependency_would(
    n: int, edges: set[tuple[int, int]], results: list[str], settled: int
) -> None:
    """The walk's old questions, asked of the outcomes directly, give the same answers
    after any outcomes in any order."""
    deps = {
        f"s{i}": tuple(f"s{j}" for j, k in sorted(edges) if k == i and j < i < n) for i in range(n)
    }
    o = Outcomes(deps.items())
    for name, result in itertools.islice(zip(deps, results, strict=False), settled):
        o.settle(name, result)
        for waiting, listed in deps.items():
            bad = [d for d in listed if o.outcome.get(d) in NOT_DONE]
            assert o.first_failed(waiting) == (bad[0] if bad else None)
            ready = all(o.outcome.get(d) == "succeeded" for d in listed) and not bad
            assert o.ready(waiting) == ready
