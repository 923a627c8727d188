"""benchmarks/bench_sim.py --json: the figures benchmarks/README.md quotes, as one object
whose ratios are computed from the same run's policies (virtual clock: deterministic)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests/unit/data/openb_pod_list_sample.csv"


def test_bench_sim_json_has_every_part_with_ratios_from_the_same_run() -> None:
    argv = [sys.executable, str(ROOT / "benchmarks/bench_sim.py"), "--seeds", "1", "--jobs",
            "100", "--speed-jobs", "200", "--alibaba", str(SAMPLE), "--json"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)

    lab = data["lab"]
    assert lab["load"] == 1.3  # issue 16's saturated week by default
    week = lab["seeds"]["0"]
    per = week["policies"]
    assert set(per) == {"manual", "fifo", "backfill", "m27"}
    assert week["ratios"]["busy_m27_over_fifo"] == round(
        per["m27"]["busy_pct"] / per["fifo"]["busy_pct"], 3
    )
    assert per["m27"]["busy_pct"] > per["fifo"]["busy_pct"]
    assert per["m27"]["idle_queued_pct"] < per["fifo"]["idle_queued_pct"]

    ali = data["alibaba"]
    assert ali["source"] == str(SAMPLE) and set(ali["policies"]) == set(per)
    m27, backfill = ali["policies"]["m27"], ali["policies"]["backfill"]
    assert ali["ratios"]["makespan_m27_over_backfill"] == round(
        m27["makespan_s"] / backfill["makespan_s"], 3
    )
    assert "cpu_m27_over_backfill" in ali["ratios"] and len(m27["schedule"]) == 12

    speed = data["speed"]
    assert speed["jobs"] == 200
    assert all(p["jobs_done"] == 200 for p in speed["policies"].values())
