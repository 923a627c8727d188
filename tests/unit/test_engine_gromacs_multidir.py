"""`mpirun -np N gmx_mpi mdrun -multidir A B ...`: N simulations, each in its own folder,
each writing its own checkpoint there. The recipe named `<deffnm>.cpt` in the step's
folder, which no simulation writes, so nothing was ever captured and a crash lost every
replica's run. Replicas that exchange (`-replex`) write theirs at one moment: a capture
taken between their renames, one new and one from the checkpoint before, is not one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from m27.checkpoint.files import FileGuard, restore_files
from m27.clock import FakeClock
from m27.events import CheckpointWritten
from m27.executors._guard import SelfCheckpoint, open_guard
from m27.executors.engines import plan_checkpoint
from m27.executors.engines.gromacs import Gromacs, multidir
from m27.store.memory import MemoryEventStore
from tests.unit.engine_files import cpt_file
from tests.unit.test_checkpoint_files import _Launch

REMD = ("mpirun", "-np", "2", "gmx_mpi", "mdrun", "-multidir", "t300", "t310/", "-deffnm", "sim")


def test_each_simulation_s_checkpoint_is_in_its_own_folder() -> None:
    plan = plan_checkpoint([*REMD, "-replex", "500"], 300.0)
    assert plan.files == ("t300/sim.cpt", "t310/sim.cpt")
    assert plan.resume == ("-cpi", "sim.cpt")  # mdrun runs each in its folder
    assert plan.argv[:7] == ("mpirun", "-np", "2", "gmx_mpi", "mdrun", "-cpt", "5")
    assert (
        "-multidir: 2 simulations, each writes its own sim.cpt (t300/sim.cpt, t310/sim.cpt); "
        "with -replex they are captured only once all have written theirs"
    ) in plan.notes
    alone = plan_checkpoint(["gmx", "mdrun", "-multidir", "a", "b", "c", "d", "-v"], 60.0)
    assert alone.files == ("a/state.cpt", "b/state.cpt", "c/state.cpt", "d/state.cpt")
    assert (
        "-multidir: 4 simulations, each writes its own state.cpt (a/state.cpt, b/state.cpt, "
        "c/state.cpt and 1 more); captured together, each at its own step; gmx without MPI "
        "stops: -multidir needs gmx_mpi"
    ) in alone.notes
    assert plan_checkpoint(["gmx", "mdrun", "-deffnm", "s"], 60.0).files == ("s.cpt",)


def test_only_replicas_that_exchange_are_captured_together() -> None:
    gmx = Gromacs()
    assert gmx.together((*REMD, "-replex", "500"))
    assert not gmx.together(REMD)  # independent simulations: each on its own clock
    assert not gmx.together(("gmx", "mdrun", "-replex", "500"))  # (mdrun refuses it)
    assert multidir(REMD) == ("t300", "t310/")
    assert multidir(("gmx_mpi", "mdrun", "-multidir")) == ()
    assert multidir(("gmx_mpi", "mdrun", "-v")) == ()


def _guard(tmp_path: Path, together: bool, store: MemoryEventStore | None = None) -> FileGuard:
    work = tmp_path / "work"
    for d in ("t300", "t310"):
        (work / d).mkdir(parents=True, exist_ok=True)
    return FileGuard(
        tmp_path / "ckpt", work, ["t300/sim.cpt", "t310/sim.cpt"], store=store, run_id="r1",
        step="remd", validate=Gromacs().valid_file, read_step=Gromacs().recorded_step,
        together=together, clock=FakeClock(), every=1.0,
    )  # fmt: skip


def _write(guard: FileGuard, folder: str, step: int) -> None:
    path = guard.workdir / folder / "sim.cpt"
    tmp = path.with_name("sim.cpt.tmp")
    tmp.write_bytes(cpt_file(step, fill=folder.encode()))
    tmp.replace(path)  # as mdrun does: a new file renamed into place


def test_a_set_caught_between_two_replicas_renames_is_not_captured(tmp_path: Path) -> None:
    """Measured with GROMACS 2022, `-multidir t300 t310 -replex 200`: each checkpoint of
    the pair was written at steps 5 apart (2425 and 2420, then 5025 and 5020), each
    renamed into place on its own."""
    store = MemoryEventStore()
    guard = _guard(tmp_path, together=True, store=store)
    _write(guard, "t300", 2425)
    assert not guard.poll(final=True)  # t310 has written nothing yet
    _write(guard, "t310", 2420)
    assert guard.poll(final=True)
    _write(guard, "t300", 5025)
    assert not guard.poll(final=True)  # t310/sim.cpt is still the one captured
    _write(guard, "t310", 5020)
    assert guard.poll(final=True)
    captured = [r.event for r in store.read() if isinstance(r.event, CheckpointWritten)]
    assert [(e.files, e.engine_step) for e in captured] == [
        (("t300/sim.cpt", "t310/sim.cpt"), 2420),  # how far every replica got
        (("t300/sim.cpt", "t310/sim.cpt"), 5020),
    ]
    guard.stop()

    work = tmp_path / "resumed"
    restored = restore_files([guard._ckpt.directory], work, read_step=Gromacs().recorded_step)
    assert restored is not None and restored.files == ("t300/sim.cpt", "t310/sim.cpt")
    assert (work / "t300" / "sim.cpt").read_bytes() == cpt_file(5025, fill=b"t300")
    assert (work / "t310" / "sim.cpt").read_bytes() == cpt_file(5020, fill=b"t310")


def test_independent_simulations_are_captured_as_each_has_written(tmp_path: Path) -> None:
    guard = _guard(tmp_path, together=False)
    _write(guard, "t300", 100)
    _write(guard, "t310", 90)
    assert guard.poll(final=True)
    _write(guard, "t300", 200)  # the other writes on its own clock: no waiting for it
    assert guard.poll(final=True)
    guard.stop()


def test_a_replica_that_never_writes_is_named_in_the_note(tmp_path: Path) -> None:
    guard = _guard(tmp_path, together=True)
    _write(guard, "t300", 50)
    _write(guard, "t310", 50)
    guard.baseline()  # last run's files: not this attempt's
    guard._poll_every, guard._started = 1.0, guard._clock.monotonic()
    _write(guard, "t300", 2425)
    assert not guard.poll()
    guard._clock.advance(60.0)  # type: ignore[attr-defined]
    assert guard.overdue() == (
        "no checkpoint after 1m00s: t310/sim.cpt not written since the step started, while "
        "the others were; files written together are captured only once each is new; a "
        "crash now loses all of this attempt's work"
    )
    guard.stop()


def test_the_runner_s_guard_captures_replicas_together_for_replex(tmp_path: Path) -> None:
    """open_guard asks the recipe with the command the step runs."""
    work = tmp_path / "work"
    for d in ("t300", "t310"):
        (work / d).mkdir(parents=True)
    spec = SelfCheckpoint(
        files=("t300/sim.cpt", "t310/sim.cpt"), resume=("-cpi", "sim.cpt"), recipe="gromacs"
    )
    launch = _Launch(work, tmp_path / "ckpt", spec)
    for argv, together in [((*REMD, "-replex", "9"), True), (REMD, False)]:
        g = open_guard(launch, argv, MemoryEventStore(), FakeClock(), lambda _: None)
        assert g.guard is not None and g.guard._together is together
        g.guard.stop()  # closes its store


@pytest.mark.parametrize("written", ["t300", "t310"])
def test_a_program_killed_between_the_renames_leaves_the_last_whole_set(
    tmp_path: Path, written: str
) -> None:
    guard = _guard(tmp_path, together=True)
    _write(guard, "t300", 10)
    _write(guard, "t310", 5)
    assert guard.poll(final=True)
    _write(guard, written, 20)  # then kill -9: the other never renamed its new file
    assert not guard.poll(final=True)
    guard.stop()
    restored = restore_files(
        [guard._ckpt.directory], tmp_path / "resumed", read_step=Gromacs().recorded_step
    )
    assert restored is not None and restored.engine_step == 5


def test_a_dry_run_names_the_step_every_replica_s_file_in_the_workdir_reached(
    tmp_path: Path, m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The dry run named the first file's step (t300's, 5025) as where the resume goes on
    from; t310 goes on from 5020."""
    from m27 import events as ev
    from m27.checkpoint.files import capture_dir
    from m27.cli.main import main
    from m27.store.sqlite import open_store

    run = "20261207-080000-aaaa"
    spec = tmp_path / "remd.yaml"
    spec.write_text(
        "name: remd\npipeline:\n  - name: remd\n    type: gpu\n    checkpoint: 60s\n"
        f"    command: {' '.join(REMD)} -replex 500\n"
    )
    guard = FileGuard(
        capture_dir(m27_home / "checkpoints" / run / "remd"), tmp_path,
        ["t300/sim.cpt", "t310/sim.cpt"], store=None, run_id=run, step="remd",
        validate=Gromacs().valid_file, read_step=Gromacs().recorded_step, together=True,
    )  # fmt: skip
    for folder in ("t300", "t310"):
        (tmp_path / folder).mkdir()
    _write(guard, "t300", 2425)
    _write(guard, "t310", 2420)
    guard.stop()  # captured at 2420
    store = open_store(m27_home)
    store.append([ev.RunSubmitted(1.0, run, "remd", str(spec), ("remd",)),
                  ev.RunCrashed(1.2, run, "process 4242 died")])  # fmt: skip
    store.close()
    _write(guard, "t300", 5025)  # written after the last capture, then m27 was killed
    _write(guard, "t310", 5020)
    captured = max(p.stat().st_mtime_ns for p in (m27_home / "checkpoints").rglob("*"))
    for folder in ("t300", "t310"):  # later than the capture, however coarse the clock
        os.utime(tmp_path / folder / "sim.cpt", ns=(captured + 10**9, captured + 10**9))
    assert main(["run", "--resume", run, "--dry-run"]) == 0
    assert (
        "remd  gpu   run, from t300/sim.cpt, t310/sim.cpt in the workdir at step 5020 "
        f"(complete, newer than run {run}'s checkpoint at step 2420)"
    ) in capsys.readouterr().out
