from __future__ import annotations

import re

import pytest

from m27 import RunError
from m27.runids import RunIdError, from_flow_run, new_run_id, resolve


def test_new_run_ids_sort_by_time_and_are_unique() -> None:
    ids = {new_run_id(1_800_000_000.0) for _ in range(50)}
    assert len(ids) > 40
    assert all(re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", i) for i in ids)
    assert new_run_id(1_800_000_000.0) < new_run_id(1_900_000_000.0)


def test_flow_run_ids_map_to_a_stable_run_id() -> None:
    fid = "0f6b2e9a-1c1d-4a53-9d55-5f1f6f0c2a11"
    assert from_flow_run(fid) == from_flow_run(fid) == "pf-5f1f6f0c2a11"


def test_resolve_accepts_exact_ids_unique_prefixes_and_last() -> None:
    known = ["20261129-100000-aaaa", "20261129-110000-bbbb", "20261130-090000-cccc"]
    assert resolve("20261129-110000-bbbb", known) == "20261129-110000-bbbb"
    assert resolve("20261130", known) == "20261130-090000-cccc"
    assert resolve("last", known) == "20261130-090000-cccc"
    with pytest.raises(RunError, match="matches 2 runs"):
        resolve("20261129", known)
    with pytest.raises(RunError, match="no run matches"):
        resolve("1999", known)


def test_flow_runs_created_in_the_same_millisecond_get_distinct_run_ids() -> None:
    # UUIDv7 ids of two scheduled flow runs: same 48-bit timestamp prefix, different tails.
    a = "01a231a9-34af-7025-8a3e-5d1c2b3a4f01"
    b = "01a231a9-34af-7637-9b4f-6e2d3c4b5a02"
    assert from_flow_run(a) != from_flow_run(b)
    assert from_flow_run(a) == from_flow_run(a)


def test_an_ambiguous_prefix_lists_every_run_it_matches() -> None:
    ids = [f"20261201-1200{i:02d}-abcd" for i in range(6)]
    with pytest.raises(RunIdError) as err:
        resolve("20261201-12", ids)
    assert f"matches 6 runs: {', '.join(ids)}; type more" in str(err.value)
    many = [f"20261201-12{i:04d}-abcd" for i in range(25)]
    with pytest.raises(RunIdError) as err:
        resolve("20261201-12", many)
    assert "matches 25 runs:" in str(err.value) and "and 5 more" in str(err.value)


def test_a_pasted_wall_of_text_is_quoted_by_its_start() -> None:
    # `m27 logs "$(cat somefile)" step` said the whole file back after `no run matches`
    with pytest.raises(RunIdError) as err:
        resolve("a" * 3000, ["20261129-100000-aaaa"])
    assert str(err.value) == f"no run matches {'a' * 80!r}... (3,000 characters) (see `m27 runs`)"
    assert err.value.context["run_id"] == "a" * 3000  # the context keeps what was given
