"""A step with `checkpoint:` that saves with m27.Checkpointer, but never does, is said
while it runs (`maybe_save` left out of the loop, a `directory=` of its own, a program
that does not use m27): before, the crash that found nothing to restore said it first."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from m27.checkpoint import Checkpointer
from m27.checkpoint.saves import SaveWatch
from m27.clock import FakeClock
from m27.store.memory import MemoryEventStore
from tests.waiting import wait_until


def _watch(directory: Path) -> tuple[SaveWatch, FakeClock, list[str]]:
    clock, said = FakeClock(), []
    watch = SaveWatch(directory, 300.0, clock=clock, warn=said.append)
    watch.baseline()
    return watch, clock, said


def test_no_save_in_two_intervals_is_said_once(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"  # the first save makes it: absent until then
    watch, clock, _ = _watch(directory)
    clock.advance(599.0)
    assert watch.overdue() is None  # its first save may come at 300 s, or a bit late
    clock.advance(1.0)
    assert watch.overdue() == (
        f"no checkpoint after 10m00s: nothing was saved to {directory} (M27_CHECKPOINT_DIR; "
        "m27.Checkpointer saves there at most every 5m00s, M27_CHECKPOINT_INTERVAL, when "
        "the program calls `ck.maybe_save(state, step)`); a crash now loses all of this "
        "attempt's work"
    )
    clock.advance(600.0)
    assert watch.overdue() is None  # said once


def test_a_save_of_this_attempt_is_enough_and_an_earlier_one_is_not(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    with Checkpointer(directory) as ck:  # attempt 1 saved, then failed
        ck.save({"x": np.zeros(4)}, step=1)
    retry, clock, _ = _watch(directory)
    clock.advance(600.0)
    said = retry.overdue()
    assert said is not None and said.startswith("no checkpoint after 10m00s: nothing was saved")

    saver, clock, _ = _watch(directory)
    with Checkpointer(directory) as ck:
        ck.save({"x": np.ones(4)}, step=2)
    assert saver.saved()
    clock.advance(3600.0)
    assert saver.overdue() is None


def test_a_short_interval_leaves_the_program_time_to_start(tmp_path: Path) -> None:
    """`checkpoint: 2s` counts from the Checkpointer's creation, after the program's
    imports and its data: a busy machine took longer than two intervals to get there."""
    clock, said = FakeClock(), []
    watch = SaveWatch(tmp_path / "ckpt", 2.0, clock=clock, warn=said.append)
    watch.baseline()
    clock.advance(31.9)
    assert watch.overdue() is None
    clock.advance(0.1)
    note = watch.overdue()
    assert note is not None and note.startswith("no checkpoint after 32.0s: nothing was saved")


def test_the_runner_says_it_in_the_step_s_output_while_the_program_runs(
    tmp_path: Path,
) -> None:
    """open_guard watches a step with a checkpoint interval and no files to capture, and
    hands the watcher the runner's note (a `m27: ...` line of the step's output: its log,
    `m27 run`, Prefect); the watcher's loop looks while the program runs."""
    from m27.executors._guard import open_guard
    from tests.unit.test_checkpoint_files import _Launch

    work, clock, notes = tmp_path / "work", FakeClock(), []
    work.mkdir()
    launch = _Launch(work, tmp_path / "ckpt", None, checkpoint_interval=300.0)  # type: ignore[arg-type]
    g = open_guard(launch, ("prog",), MemoryEventStore(), clock, notes.append)
    g.poll = 0.01
    with g.watching():
        clock.advance(600.0)
        wait_until(lambda: notes, timeout=30, what="the watcher's note")
    assert notes == [
        f"no checkpoint after 10m00s: nothing was saved to {tmp_path / 'ckpt'} "
        "(M27_CHECKPOINT_DIR; m27.Checkpointer saves there at most every 5m00s, "
        "M27_CHECKPOINT_INTERVAL, when the program calls `ck.maybe_save(state, step)`); a "
        "crash now loses all of this attempt's work"
    ]


def test_time_held_as_a_guest_is_not_time_it_had_to_save(tmp_path: Path) -> None:
    """A guest held by the agent while its GPU's primary computes makes no progress: two
    intervals of being held are no reason to say it saved nothing."""
    watch, clock, _ = _watch(tmp_path / "ckpt")
    held = [0.0]
    watch.start(3600.0, held=lambda: held[0])  # (its thread does not look in this test)
    try:
        clock.advance(900.0)
        held[0] = 500.0  # 400 s of running
        assert watch.overdue() is None
        clock.advance(200.0)  # 600 s of running
        said = watch.overdue()
        assert said is not None and said.startswith("no checkpoint after 10m00s: ")
    finally:
        watch.stop()


def test_a_folder_it_cannot_read_never_stops_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from m27.checkpoint import saves

    def unreadable(directory: Path) -> list[Path]:
        raise PermissionError(13, "Permission denied", str(directory))

    monkeypatch.setattr(saves, "manifests", unreadable)
    watch, clock, _ = _watch(tmp_path / "ckpt")  # its baseline looks at the folder
    clock.advance(600.0)
    said = watch.overdue()
    assert said is not None and said.startswith("no checkpoint after 10m00s: nothing was saved")
