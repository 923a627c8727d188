"""A program that checkpoints itself, but whose files m27 never captures, is said while
it runs: a typo in `files:` (`state.dat` for `stat.dat`), files in another folder, a file
never complete or never still. Without the note, the first sign was the crash that found
nothing to restore, days into the run."""

from __future__ import annotations

from pathlib import Path

from m27.checkpoint.files import FileGuard
from m27.clock import FakeClock
from m27.executors.engines.gromacs import Gromacs

HEAD = (171817).to_bytes(4, "big")


def _guard(tmp_path: Path, pattern: str = "state.dat", **kw: object) -> tuple[FileGuard, FakeClock]:
    clock = FakeClock()
    work = tmp_path / "work"
    work.mkdir(parents=True, exist_ok=True)
    guard = FileGuard(
        tmp_path / "ckpt", work, [pattern], store=None, run_id="r1", step="sim",
        clock=clock, every=300.0, **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    # as start(1.0) sets them, without its thread: the program starts now, polls each 1 s
    guard._poll_every, guard._started = 1.0, clock.monotonic()
    return guard, clock


def test_no_file_matching_files_is_said_after_two_intervals_once(tmp_path: Path) -> None:
    guard, clock = _guard(tmp_path)
    (guard.workdir / "stat.dat").write_text("1")  # what the program really writes
    clock.advance(599.0)
    assert guard.overdue() is None  # its first checkpoint may come at 300 s, or a bit late
    clock.advance(1.0)
    assert guard.overdue() == (
        f"no checkpoint after 10m00s: no file in {guard.workdir} matches state.dat (check "
        "`files:`, and how often the program writes it); a crash now loses all of this "
        "attempt's work"
    )
    clock.advance(600.0)
    assert guard.overdue() is None  # said once
    guard.stop()


def test_time_held_as_a_guest_is_not_time_it_had_to_write(tmp_path: Path) -> None:
    guard, clock = _guard(tmp_path)
    held = [0.0]
    guard.start(3600.0, held=lambda: held[0])  # (its thread does not look in this test)
    guard._poll_every = 1.0
    try:
        clock.advance(900.0)
        held[0] = 500.0  # held while the primary computed: 400 s of running
        assert guard.overdue() is None
        clock.advance(200.0)
        said = guard.overdue()
        assert said is not None and said.startswith("no checkpoint after 10m00s: no file")
    finally:
        guard.stop()


def test_a_file_never_complete_or_never_changed_is_said_as_such(tmp_path: Path) -> None:
    torn, clock = _guard(tmp_path / "a", "*.cpt", validate=Gromacs().valid_file)
    (torn.workdir / "sim.cpt").write_bytes(HEAD + b"x" * 100)  # no footer: mdrun died writing
    assert not torn.poll()
    clock.advance(600.0)
    said = torn.overdue()
    assert said is not None and said.startswith(
        "no checkpoint after 10m00s: sim.cpt is not complete: "
    )
    torn.stop()

    stale, clock = _guard(tmp_path / "b")
    (stale.workdir / "state.dat").write_text("last week's")
    stale.baseline()  # there before the program started: not this attempt's checkpoint
    clock.advance(600.0)
    assert stale.overdue() == (
        "no checkpoint after 10m00s: state.dat has not changed since the step started; a "
        "crash now loses all of this attempt's work"
    )
    stale.stop()


def test_nothing_is_said_once_a_capture_was_taken(tmp_path: Path) -> None:
    guard, clock = _guard(tmp_path)
    (guard.workdir / "state.dat").write_text("1")
    assert not guard.poll() and guard.poll()  # still on two looks: captured
    clock.advance(3600.0)
    assert guard.overdue() is None
    guard.stop()
    assert guard.none_at_exit() is None


def test_a_program_that_ran_an_interval_and_left_no_file_is_said_at_its_exit(
    tmp_path: Path,
) -> None:
    quick, clock = _guard(tmp_path / "a")
    clock.advance(10.0)  # failed at once, say: not the place for a checkpoint note
    assert quick.none_at_exit() is None
    quick.stop()

    ran, clock = _guard(tmp_path / "b")
    clock.advance(400.0)  # one interval, not two: nothing said while it ran
    assert ran.overdue() is None
    said: list[str] = []
    ran._warn = said.append
    ran.stop()
    assert said == [
        f"no checkpoint was captured: no file in {ran.workdir} matches state.dat (check "
        "`files:`, and how often the program writes it)"
    ]


def test_the_runner_s_watcher_says_it_in_the_step_s_output_while_the_program_runs(
    tmp_path: Path,
) -> None:
    """open_guard hands the watcher the runner's note (a `m27: ...` line of the step's
    output: its log, `m27 run`, Prefect), and the watcher's loop looks while it runs."""
    from m27.executors._guard import SelfCheckpoint, open_guard
    from m27.store.memory import MemoryEventStore
    from tests.unit.test_checkpoint_files import _Launch
    from tests.waiting import wait_until

    work = tmp_path / "work"
    work.mkdir()
    spec = SelfCheckpoint(files=("state.dat",), every=300.0, poll=0.01)
    clock = FakeClock()
    notes: list[str] = []
    g = open_guard(
        _Launch(work, tmp_path / "ckpt", spec), ("prog",), MemoryEventStore(), clock, notes.append
    )
    with g.watching():
        clock.advance(600.0)
        wait_until(lambda: notes, timeout=30, what="the watcher's note")
    assert notes == [
        f"no checkpoint after 10m00s: no file in {work} matches state.dat (check "
        "`files:`, and how often the program writes it); a crash now loses all of this "
        "attempt's work"
    ]
