"""`m27 runs`: each run's steps done, counting those a resumed run took over as done."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from m27 import events as ev
from m27.cli.main import main
from m27.store.sqlite import open_store


def test_a_resumed_run_counts_the_steps_done_in_the_run_it_resumes(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = open_store(m27_home)
    store.append(
        [
            ev.RunSubmitted(1.0, "r1", "p", "p.yaml", ("prep", "sim")),
            ev.StepSucceeded(2.0, "r1", "prep", 1, 1.0),
            ev.StepFailed(3.0, "r1", "sim", 1, 1.0, "exited with code 1", exit_code=1),
            ev.RunFailed(3.0, "r1", 2.0, ("sim",), "step sim failed"),
            ev.RunSubmitted(4.0, "r2", "p", "p.yaml", ("prep", "sim"), resume_of="r1"),
            ev.StepSkipped(4.0, "r2", "prep", "succeeded in the resumed run"),
            ev.StepSucceeded(5.0, "r2", "sim", 1, 1.0),
            ev.RunSucceeded(5.0, "r2", 1.0),
        ]
    )
    store.close()
    assert main(["runs", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["run_id"], r["steps_succeeded"], r["steps"]) for r in rows] == [
        ("r1", 1, 2),
        ("r2", 2, 2),
    ]
    assert main(["runs"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[2].split()[0] == "r2" and table[2].split()[-1] == "2/2"
