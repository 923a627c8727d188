"""`make bench`'s runner: a name it does not know is an error, not an empty run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RUN_ALL = Path(__file__).resolve().parents[2] / "benchmarks" / "run_all.py"


def test_an_unknown_benchmark_name_is_refused_naming_those_there_are() -> None:
    # `run_all.py chekpoint` (and `--help`) ran nothing and exited 0
    done = subprocess.run(
        [sys.executable, str(RUN_ALL), "chekpoint"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert "no benchmark chekpoint (there are: agent, checkpoint," in done.stderr


def test_help_lists_the_benchmarks_and_runs_none() -> None:
    done = subprocess.run(
        [sys.executable, str(RUN_ALL), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and "===" not in done.stdout
    assert "benchmarks: agent, checkpoint," in done.stdout
