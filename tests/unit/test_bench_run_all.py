"""`make bench`'s runner: a name it does not know is an error, not an empty run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RUN_ALL = Path(__file__).resolve().parents[2] / "benchmarks" / "run_all.py"


def _run_all(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(RUN_ALL), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_unknown_benchmark_name_is_refused_naming_those_there_are() -> None:
    # `run_all.py chekpoint` (and `--help`) ran nothing and exited 0
    done = _run_all("chekpoint")
    assert done.returncode == 2 and done.stdout == ""
    assert "no benchmark chekpoint (there are: agent, checkpoint," in done.stderr


def test_help_lists_the_benchmarks_and_runs_none() -> None:
    done = _run_all("--help")
    assert done.returncode == 0 and "===" not in done.stdout
    assert "benchmarks: agent, checkpoint," in done.stdout
