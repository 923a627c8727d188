"""A full disk (issue 15): the event log and the checkpoint store fail with one M27Error,
never a bare OSError or sqlite3 traceback, and a run stopped by it is closed truthfully.

The disk is a real 2 MiB tmpfs (`mount -t tmpfs`; we are root, CI is root). Where it cannot
be mounted the tests skip, unless CI=true: then they fail.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from m27 import events as ev
from m27._exceptions import CheckpointError, StoreError
from m27.checkpoint import Checkpointer
from m27.cli.commands.run import _end_truthfully
from m27.events.state import fold
from m27.store.sqlite import SqliteEventStore
from tests.services import small_tmpfs


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, unmounted afterwards."""
    with small_tmpfs(tmp_path / "disk", "2m") as where:
        yield where


def _fill(disk: Path, leave: int) -> None:
    """Fill `disk` so that about `leave` bytes stay free."""
    stat = os.statvfs(disk)
    free = stat.f_bavail * stat.f_frsize
    with open(disk / f"filler-{uuid.uuid4().hex}", "wb") as fh:
        fh.write(b"\0" * max(0, free - leave))


def _started(run_id: str, step: str) -> list[ev.Event]:
    return [
        ev.RunSubmitted(
            at=1.0,
            run_id=run_id,
            pipeline="p",
            spec_path="p.yaml",
            steps=(step,),
            pid=os.getpid(),
            host="h",
        ),
        # a pid above Linux's pid_max: nothing real is signalled when the run is closed
        ev.StepStarted(
            at=2.0,
            run_id=run_id,
            step=step,
            attempt=1,
            pid=2**22 + 1,
            pgid=2**22 + 1,
            command=("true",),
            host="h",
        ),
    ]


def test_a_full_disk_under_the_event_log_is_one_store_error(small_disk: Path) -> None:
    store = SqliteEventStore(small_disk / "events.db")
    store.append(_started("r1", "a"))
    _fill(small_disk, 16 * 1024)
    big = "x" * 200_000
    with pytest.raises(StoreError) as caught:
        for _ in range(50):
            store.append([ev.CancelRequested(at=3.0, run_id="r1", by=big)])
    # the reason, after the file's path (the test's folder has "full" in its name)
    assert "full" in str(caught.value).split("events.db: ", 1)[1]
    # what was committed before is still there and readable
    assert fold(store.read()).runs["r1"].steps["a"].status == "running"
    store.close()


def test_a_version_2_log_on_a_full_disk_is_refused_whole_and_migrated_once_there_is_room(
    small_disk: Path,
) -> None:
    """Opening a log written before the run column (schema 2) adds and fills it; on a full
    disk that fails with one StoreError that says so, and the file stays as it was."""
    path = small_disk / "events.db"
    with SqliteEventStore(path) as store:
        store.append(_started("r1", "a") + _started("r2", "b"))
    with sqlite3.connect(path) as conn:  # as schema version 2 wrote it
        conn.execute("DROP INDEX events_by_run")
        conn.execute("ALTER TABLE events DROP COLUMN run")
        conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    conn.close()
    for leftover in small_disk.glob("events.db-*"):
        leftover.unlink()  # the WAL files: SQLite makes them again on open
    before = path.read_bytes()
    _fill(small_disk, 0)
    with pytest.raises(StoreError) as caught:
        SqliteEventStore(path)
    # (the test's folder has "full" in its name: the reason is what follows the path)
    assert f"cannot open event log {path}: " in str(caught.value)
    assert "full" in str(caught.value).split(f"{path}: ", 1)[1]
    assert path.read_bytes() == before
    for filler in small_disk.glob("filler-*"):
        filler.unlink()
    with SqliteEventStore(path) as store:
        assert [r.event.run_id for r in store.read_runs(["r2"])] == ["r2", "r2"]  # type: ignore[attr-defined]


def test_a_run_stopped_by_a_full_disk_ends_with_no_step_left_running(
    small_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = SqliteEventStore(small_disk / "events.db")
    store.append(_started("r2", "a"))
    _fill(small_disk, 0)
    with pytest.raises(StoreError):  # what stopped the run
        store.append([ev.CancelRequested(at=3.0, run_id="r2", by="x" * 100_000)])
    for filler in small_disk.glob("filler-*"):
        filler.unlink()
    # space is back: the run's end is recorded, its running step failed, the run crashed
    assert _end_truthfully(store, "r2", "the event log failed: disk full")
    run = fold(store.read()).runs["r2"]
    assert run.status != "running" and run.steps["a"].status == "failed"
    failed = [e for e in (r.event for r in store.read()) if isinstance(e, ev.StepFailed)]
    assert failed[0].attempt == 1 and "disk full" in failed[0].reason
    store.close()


def test_a_full_disk_under_the_checkpoints_is_a_checkpoint_error(small_disk: Path) -> None:
    state = {"x": np.random.default_rng(0).random(1 << 19)}  # 4 MiB of noise: > the disk
    with pytest.raises(CheckpointError), Checkpointer(small_disk / "ckpt", interval=1.0) as ckpt:
        ckpt.save(state, 1)
        ckpt.flush()
    # nothing half-written is taken for a checkpoint
    assert Checkpointer(small_disk / "ckpt", interval=1.0).restore() is None


def test_m27_run_with_a_full_home_prints_no_traceback(small_disk: Path) -> None:
    home = small_disk / "home"
    home.mkdir()
    spec = small_disk.parent / "p.yaml"
    spec.write_text("pipeline:\n  - {name: a, type: cpu, command: 'true'}\n")
    _fill(small_disk, 8 * 1024)
    env = {**os.environ, "M27_HOME": str(home), "M27_GPUS": "sim:1"}
    done = subprocess.run(
        [sys.executable, "-m", "m27.cli.main", "run", "--plain", str(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr + done.stdout, done.stderr[-2000:]


def test_a_channel_the_full_disk_refuses_is_an_oserror_and_leaves_no_half_file(
    small_disk: Path,
) -> None:
    from m27.step import Channel

    _fill(small_disk, leave=0)
    with pytest.raises(OSError) as refused:
        Channel.create(small_disk / "s.chan")
    assert refused.value.errno == 28  # ENOSPC: the agent leaves the step waiting (outage.py)
    assert not [p for p in small_disk.iterdir() if "chan" in p.name]
