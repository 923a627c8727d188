"""A step with `checkpoint:` that saves with m27.Checkpointer, but never does, is said
while it runs (`maybe_save` left out of the loop, a `directory=` of its own, a program
that does not use m27): before, the crash that found nothing to restore said it first."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from m27.checkpoint import Checkpointer
from m27.checkpoint.saves import SaveWatch
from m27.clock import FakeClock
from m27.executors.local import run_step
from m27.store.memory import MemoryEventStore
from tests.unit.runner_helpers import launch
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


def test_the_runner_says_it_in_the_step_s_output_while_the_program_runs(
    tmp_path: Path, m27_home: Path
) -> None:
    """The runner watches a step with a checkpoint interval and no files to capture; its
    note is a `m27: ...` line of the step's output (its log, `m27 run`, Prefect)."""
    store, cancel, lines = MemoryEventStore(), threading.Event(), []

    def on_lines(stream: str, batch: list[str]) -> None:
        lines.extend(batch)

    step = launch(
        "import time; time.sleep(120)",  # a program that never saves
        checkpoint_dir=tmp_path / "ckpt",
        checkpoint_interval=0.05,
        grace=0.2,
    )
    done: list[object] = []
    runner = threading.Thread(
        target=lambda: done.append(run_step(step, store, on_lines=on_lines, cancel=cancel))
    )
    runner.start()
    try:
        wait_until(
            lambda: any("no checkpoint after" in line for line in lines),
            timeout=30,
            what="the runner's note",
        )
    finally:
        cancel.set()
        runner.join(30)
    (note,) = [line for line in lines if "no checkpoint after" in line]
    assert note.startswith("m27: no checkpoint after ") and str(tmp_path / "ckpt") in note
    log = (m27_home / "runs" / "r1" / "s1.log").read_text()
    assert "nothing was saved to" in log


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
