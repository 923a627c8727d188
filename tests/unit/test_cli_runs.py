"""`m27 runs`: the newest runs, filtered by status or pipeline, and said when cut short."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from m27 import events as ev
from m27.cli.main import main
from m27.store.sqlite import open_store


@pytest.fixture
def history(m27_home: Path) -> Path:
    """25 runs of `md` (every 5th failed), one of `prep` that crashed (its process is
    gone), one of `prep` cancelled."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    events: list[ev.Event] = []
    for i in range(25):
        run = f"20261203-1000{i:02d}-md{i:02d}"
        events.append(ev.RunSubmitted(float(i), run, "md", "md.yaml", ("s",)))
        if i % 5:
            events.append(ev.RunSucceeded(i + 0.5, run, 0.5))
        else:
            events.append(ev.RunFailed(i + 0.5, run, 0.5, ("s",), "step s failed"))
    events += [
        ev.RunSubmitted(30.0, "20261203-110000-prep", "prep", "p.yaml", ("s",), pid=dead.pid),
        ev.RunCrashed(31.0, "20261203-110000-prep", "flow run process died"),
        ev.RunSubmitted(32.0, "20261203-110001-prep", "prep", "p.yaml", ("s",)),
        ev.RunCancelled(33.0, "20261203-110001-prep"),
    ]
    store = open_store(m27_home)
    store.append(events)
    store.close()
    return m27_home


def _listed(capsys: pytest.CaptureFixture[str]) -> tuple[list[str], str]:
    out, err = capsys.readouterr()
    return [line.split()[0] for line in out.splitlines()[1:]], err


def test_the_newest_are_shown_and_a_person_is_told_of_the_rest(
    history: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["runs"]) == 0  # piped (`m27 runs | tail -1`): the table only
    shown, _ = _listed(capsys)
    assert len(shown) == 20 and shown[-1] == "20261203-110001-prep"
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(["runs"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 22 and out[-1] == "(the newest 20 of 27; --limit 0 shows all)"
    assert main(["runs", "--limit", "0"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 28  # header and all 27


def test_runs_are_filtered_by_status_and_pipeline(
    history: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", "--status", "failed", "--status", "crashed", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["pipeline"], r["status"]) for r in rows] == [("md", "failed")] * 5 + [
        ("prep", "crashed")
    ]
    assert main(["runs", "--pipeline", "prep"]) == 0
    assert _listed(capsys)[0] == ["20261203-110000-prep", "20261203-110001-prep"]
    # a pipeline name no run has: a typo is named (it said only `no run matches`)
    assert main(["runs", "--pipeline", "perp"]) == 0
    assert capsys.readouterr().out == "no run of a pipeline called 'perp'; did you mean 'prep'?\n"
    assert main(["runs", "--pipeline", "nope"]) == 0
    assert capsys.readouterr().out == "no run of a pipeline called 'nope' (pipelines: md, prep)\n"
    assert main(["runs", "--pipeline", "prep", "--status", "succeeded"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == "no run matches; this node has 27 (`m27 runs --limit 0`)"


def test_a_negative_limit_is_bad_input(history: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as bad:
        main(["runs", "--limit", "-1"])
    assert bad.value.code == 2
    assert "argument --limit: must be 0 (all) or more, got -1" in capsys.readouterr().err
