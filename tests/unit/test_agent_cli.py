"""`m27 queue` and `m27 bump` on a log written the way the agent and the steps write it."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pytest

from m27 import events as ev
from m27.cli.commands import bump, queue
from m27.cli.main import main
from m27.store.sqlite import SqliteEventStore, open_store

GiB = 1024**3


def _log(home: Path) -> None:
    now = time.time()
    store = open_store(home)
    store.append(
        [
            ev.RunSubmitted(
                at=now, run_id="run1", pipeline="p", spec_path="p.yaml", steps=("md", "a", "b")
            ),
            ev.StepRequested(at=now, run_id="run1", step="md", type="gpu", gpus=1, gpu_memory=GiB),
            ev.LeaseGranted(at=now, run_id="run1", step="md", gpus=(0,), tier="immediate"),
            ev.StepRequested(at=now, run_id="run1", step="md2", type="gpu", gpus=1, gpu_memory=GiB),
            ev.LeaseGranted(at=now, run_id="run1", step="md2", gpus=(1,), tier="immediate"),
            ev.StepRequested(at=now + 1, run_id="run1", step="a", type="gpu", gpus=2),
            ev.StepRequested(at=now + 2, run_id="run1", step="b", type="gpu", gpus=1, priority=1),
        ]
    )
    store.close()


def _queue(capsys: pytest.CaptureFixture[str], why: str | None = None) -> str:
    code = queue.run(argparse.Namespace(why=why, json=why is None))
    assert code == 0
    return capsys.readouterr().out


def test_queue_shows_tiers_priorities_and_why_a_step_waits(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _log(m27_home)
    snap = json.loads(_queue(capsys))
    assert [(h["step"], h["tier"], h["role"]) for h in snap["held"]] == [
        ("run1/md", "immediate", "primary"),
        ("run1/md2", "immediate", "primary"),
    ]
    assert [w["step"] for w in snap["waiting"]] == ["run1/b", "run1/a"]
    assert "reserved for run1/a" in snap["waiting"][0]["why"]
    why = _queue(capsys, "a")
    assert why.startswith("run1/a: waiting") and "GPU 0 primary run1/md" in why


def test_bump_reorders_the_queue(m27_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _log(m27_home)
    assert bump.run(argparse.Namespace(run_id="run1", step="a", delta=5)) == 0
    assert "+5" in capsys.readouterr().out
    snap = json.loads(_queue(capsys))
    assert [(w["step"], w["priority"], w["bump"]) for w in snap["waiting"]] == [
        ("run1/a", 5, 5),
        ("run1/b", 1, 0),
    ]


def test_bump_of_a_submitted_run_folds_its_own_events_not_the_whole_log(
    m27_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _log(m27_home)
    store = open_store(m27_home)
    for i in range(50):  # other runs, whose events bump has no need of
        store.append([ev.RunSubmitted(at=time.time(), run_id=f"z{i}", pipeline="p",
                                      spec_path="p.yaml", steps=("s",)),
                      ev.StepRequested(at=time.time(), run_id=f"z{i}", step="s", type="gpu")])  # fmt: skip
    store.close()

    def whole_log(*args: object, **kwargs: object) -> None:
        raise AssertionError("m27 bump read the whole log")

    monkeypatch.setattr(SqliteEventStore, "read", whole_log)
    assert bump.run(argparse.Namespace(run_id="run1", step="b", delta=2)) == 0
    assert bump.run(argparse.Namespace(run_id="run", step="b", delta=3)) == 0
    assert capsys.readouterr().out.splitlines() == [
        "run1/b: priority +2 (bumps now +2)",
        "run1/b: priority +3 (bumps now +5)",
    ]
    assert bump.run(argparse.Namespace(run_id="run1", step="s", delta=1)) == 2  # z0's step
    assert "m27 bump: run run1 has no step 's'" in capsys.readouterr().err


def test_bump_finds_a_run_known_only_by_its_lease_requests(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Steps that asked the agent directly (no `m27 run`, no RunSubmitted)."""
    store = open_store(m27_home)
    store.append([ev.StepRequested(at=time.time(), run_id="bare7", step="x", type="gpu")])
    store.close()
    assert bump.run(argparse.Namespace(run_id="bare", step="x", delta=1)) == 0
    assert capsys.readouterr().out == "bare7/x: priority +1 (bumps now +1)\n"


def test_bump_of_an_unknown_step_is_bad_input(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _log(m27_home)
    assert bump.run(argparse.Namespace(run_id="run1", step="nope", delta=1)) == 2
    assert "m27 bump: run run1 has no step 'nope' (its steps: " in capsys.readouterr().err
    assert bump.run(argparse.Namespace(run_id="run1", step="bb", delta=1)) == 2
    assert "has no step 'bb' (did you mean 'b'? its steps: " in capsys.readouterr().err
    assert queue.run(argparse.Namespace(why="nope", json=False)) == 2
    assert "no waiting or running step matches 'nope'" in capsys.readouterr().err


def test_bump_of_a_matrix_entry_bumps_each_of_its_steps_that_waits_or_runs(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    now = time.time()
    store = open_store(m27_home)
    store.append(
        [
            ev.RunSubmitted(
                at=now, run_id="mx", pipeline="p", spec_path="p.yaml",
                steps=("md.1", "md.2", "md.3", "all"),
            ),
            ev.StepRequested(at=now, run_id="mx", step="md.2", type="gpu", gpus=1),
            ev.StepRequested(at=now, run_id="mx", step="md.3", type="gpu", gpus=1),
            ev.StepSucceeded(now, "mx", "md.1", 1, 1.0),
        ]
    )  # fmt: skip
    assert bump.run(argparse.Namespace(run_id="mx", step="md", delta=4)) == 0
    assert capsys.readouterr().out.splitlines() == [
        "mx/md.2: priority +4 (bumps now +4)",
        "mx/md.3: priority +4 (bumps now +4)",
    ]
    bumped = [r.event for r in store.read() if isinstance(r.event, ev.PriorityBumped)]
    assert [(e.step, e.delta) for e in bumped] == [("md.2", 4), ("md.3", 4)]
    store.append(
        [ev.StepSucceeded(now, "mx", "md.2", 1, 1.0), ev.StepSucceeded(now, "mx", "md.3", 1, 1.0)]
    )
    assert bump.run(argparse.Namespace(run_id="mx", step="md", delta=4)) == 2
    assert "mx/every step of md already ended (succeeded)" in capsys.readouterr().err
    store.close()


def test_bump_of_a_step_that_ended_is_bad_input_and_writes_nothing(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _log(m27_home)
    store = open_store(m27_home)
    now = time.time()
    store.append([ev.StepSucceeded(now, "run1", "md", 1, 1.0), ev.RunCancelled(now, "run1", 1.0)])
    before = store.last_seq()
    assert bump.run(argparse.Namespace(run_id="run1", step="md", delta=1)) == 2
    assert "run1/md already ended (succeeded)" in capsys.readouterr().err
    assert bump.run(argparse.Namespace(run_id="run1", step="b", delta=1)) == 2
    assert "run1/b already ended (cancelled)" in capsys.readouterr().err
    assert store.last_seq() == before
    store.close()


def test_queue_table_has_a_row_per_step_with_its_tier_and_why_it_waits(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _log(m27_home)
    assert queue.run(argparse.Namespace(why=None, json=False)) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert header.split() == ["STEP", "TIER", "ROLE", "GPUS", "PRIO", "STATE"]
    rows = {line.split()[0]: line for line in lines}
    assert list(rows) == ["run1/md", "run1/md2", "run1/b", "run1/a"]  # held first, then by rank
    assert rows["run1/md"].split()[1:5] == ["immediate", "primary", "0", "0"]
    assert rows["run1/b"].split()[1:5] == ["waiting", "gpu", "1", "1"]
    assert "reserved for run1/a" in rows["run1/b"]


def test_a_bump_past_the_priority_limit_is_refused_by_argparse(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`m27 bump R S 99999999999999999999` (a typo) would have stopped the agent at each of
    its starts: the log keeps the event and the queue's int64 arrays overflowed."""
    _log(m27_home)
    before = open_store(m27_home).last_seq()
    with pytest.raises(SystemExit) as exited:
        main(["bump", "run1", "b", "99999999999999999999"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "give a whole number from -1000000000 to 1000000000" in err
    assert open_store(m27_home).last_seq() == before
