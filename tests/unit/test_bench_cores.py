"""benchmarks/bench_cores.py on real GROMACS: both sides run two mdruns to the end, each
mdrun of the shared side with as many threads as its share has cores (the runner's `-nt`,
as GROMACS's own log says). No speed is asserted: the figure is the benchmark's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from m27.gpu.cpus import node_cpus
from tests.services import need_program
from tests.unit.bench_loader import load_benchmark

pytestmark = pytest.mark.slow

need_program("gmx", "GROMACS", "apt-get install gromacs")


def test_one_pair_runs_both_sides_to_the_end_and_reports_their_ratio(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = load_benchmark("bench_cores")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert bench.main(["--nsteps", "200", "--pairs", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    (pair,) = result["pairs"]
    assert result["cpus"] == list(node_cpus())
    assert sorted(c for share in result["shares"].values() for c in share) == list(node_cpus())
    for side in ("all", "share"):
        assert pair[side]["wall_s"] > 0 and len(pair[side]["ns_per_day"]) == 2
        assert all(x > 0 for x in pair[side]["ns_per_day"])  # each mdrun ran to its end
    # every hardware thread each, against its share each (the runner's -nt)
    assert pair["all"]["threads"] == [len(node_cpus())] * 2
    assert pair["share"]["threads"] == [len(result["shares"][g]) for g in ("0", "1")]
    assert pair["ratio"] == pytest.approx(pair["all"]["wall_s"] / pair["share"]["wall_s"])
