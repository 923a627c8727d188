"""benchmarks/gpu_check.sh and the CPU path of its Python helpers (no GPU needed).

The script itself only runs on a GPU node; here its syntax is checked and every helper
runs with --dry-run (NumPy state, simulated GPU), so a lent GPU's time is not spent on
a bug in the logic.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.unit.bench_loader import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    return load_benchmark("gpu_check")


def test_the_script_parses_and_runs_every_part() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text()
    for part in ("pytest -q -m gpu", "SIZE=1GiB", "checkpoint --size", "exporter", "colocate"):
        assert part in text
    assert "$OUT/gpu_check.json" in text


def test_checkpoint_dry_run_round_trips_and_reports_ratios(gpu_check: ModuleType) -> None:
    res = gpu_check.check_checkpoint(4 * 1024 * 1024, dry_run=True)
    assert res["ok"] and res["dry_run"] and res["state"] == "numpy"
    for key in ("1pct", "100pct"):
        row = res[key]
        assert row["identical"] and row["restored_type"] == "numpy"
        assert row["durable_ratio"] > 0 and row["restore_gbps"] > 0


def test_exporter_dry_run_exposes_the_gpu_families(gpu_check: ModuleType) -> None:
    res = gpu_check.check_exporter(dry_run=True)
    assert res["ok"], res["missing"]
    assert any(line.startswith("m27_gpu_memory_total_bytes") for line in res["gpu_lines"])


def test_colocate_dry_run_runs_both_steps_through_the_agent(gpu_check: ModuleType) -> None:
    res = gpu_check.check_colocate(cycles=2, compute=0.1, io=0.1, dry_run=True)
    assert res["ok"], res
    assert res["colocated"]["succeeded"] == {"primary": True, "guest": True}
    alone, together = res["alone"]["busy_fraction"], res["colocated"]["busy_fraction"]
    assert alone is not None and together is not None
    assert 0 < alone <= 1 and 0 < together <= 1
    # The guest computes without I/O, and alone once the primary is done: the GPU is
    # busier with it than with the primary alone, whose I/O leaves half of its time idle.
    assert together > alone


def test_the_helper_prints_json_and_exits_0_on_success() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/gpu_check.py"), "exporter", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] is True


def test_the_whole_script_runs_on_the_cpu_with_dry_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", str(SCRIPT)],
        env={**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "OUT": str(out)},
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "gpu_check.json").read_text())
    assert summary["dry_run"] is True
    assert all(summary[f"rc_{part}"] == 0 for part in ("checkpoint", "exporter", "colocate"))
    for part in ("checkpoint", "exporter", "colocate"):
        assert json.loads((out / f"{part}.json").read_text())["ok"] is True
