"""An engine that stops before its end and exits 0 (`mdrun -maxh`, CP2K's WALLTIME,
LAMMPS's `timer timeout`) is retried only when the attempt left a newer checkpoint: the
next one then goes on from it. Without one it would begin where this one began and stop
at the same point: CP2K with a WALLTIME shorter than its `&EACH MD n` steps ran its
`retries: 100` attempts from the same restart file, a hundred times the same work."""

from __future__ import annotations

from pathlib import Path

from m27.events import CheckpointWritten, StepFailed, StepStarted
from m27.executors.local import SelfCheckpoint, StepResult, run_step
from m27.store.memory import MemoryEventStore
from tests.unit.runner_helpers import events, launch

#: mdrun's line at -maxh (GROMACS 2022), printed by the stand-in program
MAXH = "Step 15325: Run time exceeded 0.002 hours, will terminate the run within 25 steps"


def _program(writes: str) -> str:
    """A stand-in engine: on attempt 1 and 2 it stops at -maxh after `writes` (Python
    code run first), on attempt 3 it ends."""
    return (
        f"import os, pathlib\n{writes}\nif os.environ['M27_ATTEMPT'] != '3':\n    print({MAXH!r})\n"
    )


def _checkpointed(tmp_path: Path, writes: str) -> tuple[MemoryEventStore, StepResult]:
    work = tmp_path / "work"
    work.mkdir()
    store = MemoryEventStore()
    result = run_step(
        launch(
            _program(writes),
            workdir=work,
            checkpoint_dir=tmp_path / "ckpt",
            self_checkpoint=SelfCheckpoint(files=("state.bin",), resume=("--resume",)),
            retries=5,
        ),
        store,
    )
    return store, result


def test_an_attempt_that_left_a_newer_checkpoint_is_retried_from_it(tmp_path: Path) -> None:
    attempt = "pathlib.Path('state.bin').write_text(os.environ['M27_ATTEMPT'])"
    store, result = _checkpointed(tmp_path, attempt)
    assert result.ok and result.attempts == 3
    failed = [e for e in events(store) if isinstance(e, StepFailed)]
    assert len(failed) == 2
    assert all(e.reason.endswith("`m27 run --resume r1` continues it") for e in failed)
    assert sum(isinstance(e, CheckpointWritten) for e in events(store)) == 3
    started = [e for e in events(store) if isinstance(e, StepStarted)]
    assert [e.resume_from is not None for e in started] == [False, True, True]


def test_an_attempt_that_left_no_newer_checkpoint_is_not_retried(tmp_path: Path) -> None:
    """The first attempt writes a checkpoint; the second starts from it and writes none
    (a WALLTIME shorter than the steps between restart files)."""
    first_only = (
        "if os.environ['M27_ATTEMPT'] == '1':\n    pathlib.Path('state.bin').write_text('1')"
    )
    store, result = _checkpointed(tmp_path, first_only)
    assert not result.ok and result.attempts == 2
    failed = [e for e in events(store) if isinstance(e, StepFailed)]
    assert failed[-1].reason == (
        "mdrun stopped at -maxh, its run time limit, at step 15325, before its last step; "
        "another attempt would stop the same way: it wrote no checkpoint since this one began"
    )
    assert not failed[-1].will_retry


def test_a_step_without_checkpoint_that_stopped_early_is_not_retried() -> None:
    store = MemoryEventStore()
    result = run_step(launch(_program("pass"), retries=5), store)
    assert not result.ok and result.attempts == 1
    assert result.reason.endswith(
        "another attempt would start over and stop the same way: the step has no `checkpoint:`"
    )
