"""benchmarks/bench_checkpoint.py's 100 % rows: each save is compared with the baseline
write beside it, not with one baseline from another moment of a drifting disk."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from tests.unit.bench_loader import load_benchmark


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("bench_checkpoint")


def test_a_full_row_keeps_the_median_of_its_paired_ratios(
    bench: ModuleType, tmp_path: Path
) -> None:
    x = np.random.default_rng(0).random(64 * 1024, dtype=np.float32)
    slow_then_fast = iter([1000.0, 1e-9, 1000.0])  # baseline seconds, as a drifting disk
    row = bench.bench_m27(
        x, 1.0, tmp_path, np.random.default_rng(1), repeats=3, paired=lambda: next(slow_then_fast)
    )
    assert row["baseline_durable"] == 1000.0
    # two of three saves sat beside a 1000 s baseline: the median ratio is tiny, whatever
    # this machine's speed; against the single 1 ns baseline it would be huge
    assert 0 < row["durable_ratio"] < 1.0
    assert row["repeats"] == 3
    baseline = {"durable": 1e-9, "restore": 1.0}
    (kept,) = bench.with_ratios([row], baseline)
    assert kept["durable_ratio"] == row["durable_ratio"]


def test_without_pairs_a_row_is_compared_with_the_runs_baseline(
    bench: ModuleType, tmp_path: Path
) -> None:
    x = np.random.default_rng(0).random(64 * 1024, dtype=np.float32)
    row = bench.bench_m27(x, 0.01, tmp_path, np.random.default_rng(1), repeats=3)
    assert "baseline_durable" not in row
    (kept,) = bench.with_ratios([row], {"durable": row["durable"] * 2, "restore": 1.0})
    assert kept["durable_ratio"] == pytest.approx(0.5)
