"""Capturing a program's own checkpoint files, and restoring the newest good capture."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from m27.checkpoint import artifact_for, scan
from m27.checkpoint.files import FileGuard, restore_files
from m27.cli.main import main
from m27.clock import FakeClock, SystemClock
from m27.events import CheckpointRestored, CheckpointWritten
from m27.executors._guard import SelfCheckpoint, open_guard
from m27.executors.engines.gromacs import Gromacs
from m27.executors.engines.lammps import Lammps
from m27.store.memory import MemoryEventStore
from tests.unit.engine_files import cpt_file, lammps_restart

HEAD, FOOT = (171817).to_bytes(4, "big"), (171819).to_bytes(4, "big")


def _cpt(path: Path, fill: bytes, size: int = 300_000) -> bytes:
    """A fake .cpt of which only the first KiB depends on `fill`."""
    body = HEAD + fill * 1024 + bytes(size) + FOOT
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(body)
    os.replace(tmp, path)  # as GROMACS does: write, then rename
    return body


@dataclass(frozen=True)
class _Launch:
    """The parts of a step launch open_guard reads."""

    workdir: Path
    checkpoint_dir: Path
    self_checkpoint: SelfCheckpoint
    run_id: str = "r1"
    step: str = "md"
    checkpoint_interval: float | None = None


def _guard(tmp_path: Path, store: MemoryEventStore) -> FileGuard:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return FileGuard(
        tmp_path / "ckpt",
        work,
        ["*.cpt"],
        store=store,
        run_id="r1",
        step="md",
        pipeline="p",
        validate=Gromacs().valid_file,
    )


def test_a_complete_file_is_captured_at_first_sight_and_a_torn_one_never(
    tmp_path: Path,
) -> None:
    store = MemoryEventStore()
    guard = _guard(tmp_path, store)
    work = guard.workdir
    _cpt(work / "sim.cpt", b"a")
    assert guard.poll()  # the engine's check says complete: no second look needed
    assert not guard.poll()  # unchanged: nothing new
    (work / "sim.cpt").write_bytes(HEAD + b"b" * 100)  # torn: no footer
    assert not guard.poll() and not guard.poll()
    _cpt(work / "sim.cpt", b"c")
    assert guard.poll()
    guard.stop()
    written = [r.event for r in store.read() if isinstance(r.event, CheckpointWritten)]
    assert [(e.source, e.files, e.step, e.pipeline) for e in written] == [
        ("files", ("sim.cpt",), "md", "p")
    ] * 2
    assert written[1].bytes_written < written[1].bytes_total  # only changed chunks


def test_files_no_engine_can_check_are_captured_once_stable_on_two_polls(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    guard = FileGuard(tmp_path / "ckpt", work, ["state.bin"], store=None, run_id="", step="s")
    (work / "state.bin").write_bytes(b"x" * 1000)
    assert not guard.poll()  # first sight: it may still be being written
    assert guard.poll()  # same size and mtime twice: captured
    guard.stop()


def test_a_program_rewriting_its_file_at_every_poll_is_captured_once_per_interval(
    tmp_path: Path,
) -> None:
    """LAMMPS writing a small system's restart file every 200 steps rewrote it between
    any two polls: m27 captured nothing until the program exited. Now each complete
    version may be taken, but at most one per checkpoint interval (less one poll)."""
    clock = FakeClock()
    store = MemoryEventStore()
    work = tmp_path / "work"
    work.mkdir()
    guard = FileGuard(
        tmp_path / "ckpt", work, ["m27.restart"], store=store, run_id="r1", step="melt",
        validate=Lammps().valid_file, read_step=Lammps().recorded_step, clock=clock, every=10.0,
    )  # fmt: skip
    guard._poll_every = 1.0  # as start(1.0) sets it, without its thread
    taken = []
    for second in range(25):  # a new restart file before every poll
        (work / "m27.restart").write_bytes(lammps_restart(step=100 * second))
        if guard.poll():
            taken.append(100 * second)
        clock.advance(1.0)
    (work / "m27.restart").write_bytes(lammps_restart(step=2500))
    guard.stop()  # the program exited: its last file is always taken
    written = [r.event for r in store.read() if isinstance(r.event, CheckpointWritten)]
    assert taken == [0, 900, 1800]
    assert [e.engine_step for e in written] == [0, 900, 1800, 2500]


def test_restore_skips_a_damaged_capture_and_uses_the_previous_one(tmp_path: Path) -> None:
    store = MemoryEventStore()
    guard = _guard(tmp_path, store)
    work = guard.workdir
    first = _cpt(work / "sim.cpt", b"1")
    guard.poll(final=True)
    _cpt(work / "sim.cpt", b"2")
    guard.poll(final=True)
    guard.stop()
    newest = scan(tmp_path / "ckpt")[-1]
    pack = newest.path.with_suffix(".pack")
    data = pack.read_bytes()
    pack.write_bytes(data[: len(data) // 2])  # torn after capture
    (work / "sim.cpt").write_bytes(b"junk")
    notes: list[str] = []
    restored = restore_files(
        [tmp_path / "ckpt"], work, validate=Gromacs().valid_file, note=notes.append,
        store=store, run_id="r2", step="md",
    )  # fmt: skip
    assert restored is not None and restored.path != newest.path
    assert (work / "sim.cpt").read_bytes() == first
    assert any("damaged" in n for n in notes)
    assert any(isinstance(r.event, CheckpointRestored) for r in store.read())


def test_restore_with_no_capture_leaves_the_workdir_alone(tmp_path: Path) -> None:
    (tmp_path / "x.cpt").write_bytes(b"keep")
    assert restore_files([tmp_path / "none"], tmp_path) is None
    assert (tmp_path / "x.cpt").read_bytes() == b"keep"


def test_a_complete_newer_file_in_the_workdir_is_captured_and_used(tmp_path: Path) -> None:
    """kill -9 of m27 run, then mdrun wrote its checkpoint on SIGTERM: that one is newest."""
    store = MemoryEventStore()
    guard = _guard(tmp_path, store)
    work = guard.workdir
    _cpt(work / "sim.cpt", b"1")
    guard.poll(final=True)
    guard.stop()
    newer = _cpt(work / "sim.cpt", b"2")
    stamp = (tmp_path / "ckpt").stat().st_mtime_ns + 10**9
    os.utime(work / "sim.cpt", ns=(stamp, stamp))

    spec = SelfCheckpoint(files=("sim.cpt",), resume=("--resume", "sim.cpt"), recipe="gromacs")
    launch = _Launch(work, tmp_path, spec)
    (tmp_path / "files").symlink_to(tmp_path / "ckpt")  # capture_dir(tmp_path)
    notes: list[str] = []
    g = open_guard(launch, ("prog",), store, SystemClock(), notes.append)
    assert g.guard is not None
    g.guard.stop()
    assert g.argv == ("prog", "--resume", "sim.cpt")
    assert (work / "sim.cpt").read_bytes() == newer
    assert "sim.cpt in the workdir: complete and newer than the last capture" in notes
    # a torn newer file is not: the capture wins
    (work / "sim.cpt").write_bytes(HEAD + b"x")
    os.utime(work / "sim.cpt", ns=(stamp * 2, stamp * 2))
    g = open_guard(launch, ("prog",), store, SystemClock(), notes.append)
    assert g.guard is not None
    g.guard.stop()
    assert (work / "sim.cpt").read_bytes() == newer


def test_a_fresh_start_does_not_capture_a_checkpoint_another_run_left(tmp_path: Path) -> None:
    """`gmx mdrun -deffnm simulation` in a folder holding an earlier run's simulation.cpt:
    that file was captured as this run's checkpoint a second after the start, and a resume
    after a crash continued the other run's trajectory."""
    work = tmp_path / "work"
    work.mkdir()
    _cpt(work / "sim.cpt", b"old")  # complete and valid, from another run
    spec = SelfCheckpoint(files=("sim.cpt",), resume=("-cpi", "sim.cpt"), recipe="gromacs")
    launch = _Launch(work, tmp_path / "r2", spec, run_id="r2")
    store = MemoryEventStore()
    g = open_guard(launch, ("prog",), store, SystemClock(), lambda note: None)
    assert g.argv == ("prog",) and g.guard is not None  # nothing to resume from
    assert not g.guard.poll() and not g.guard.poll()  # stable, complete, and still not taken
    new = _cpt(work / "sim.cpt", b"new")  # the program's own first checkpoint
    assert g.guard.poll()
    g.guard.stop()
    written = [r.event for r in store.read() if isinstance(r.event, CheckpointWritten)]
    assert len(written) == 1
    (work / "sim.cpt").unlink()
    assert restore_files([tmp_path / "r2" / "files"], work) is not None
    assert (work / "sim.cpt").read_bytes() == new


def test_a_stale_file_the_program_never_rewrites_is_not_captured_when_it_ends(
    tmp_path: Path,
) -> None:
    store = MemoryEventStore()
    work = tmp_path / "work"
    work.mkdir()
    _cpt(work / "sim.cpt", b"old")
    guard = _guard(tmp_path, store)
    guard.baseline()
    guard.stop()  # the program exited without a checkpoint: the final look takes nothing
    assert not any(isinstance(r.event, CheckpointWritten) for r in store.read())


def test_a_capture_records_the_md_step_its_checkpoint_holds(
    tmp_path: Path, m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """GROMACS's .cpt records its MD step: the capture's event, its manifest, `m27
    checkpoints` and a resume show that step, not the capture count."""
    work = tmp_path / "work"
    work.mkdir()
    step_dir = m27_home / "checkpoints" / "20260101-000000-abcd" / "md"
    spec = SelfCheckpoint(files=("sim.cpt",), resume=("-cpi", "sim.cpt"), recipe="gromacs")
    launch = _Launch(work, step_dir, spec, run_id="20260101-000000-abcd")
    store = MemoryEventStore()
    g = open_guard(launch, ("gmx", "mdrun"), store, SystemClock(), lambda note: None)
    assert g.guard is not None
    for step in (2500, 5000):
        (work / "sim.cpt").write_bytes(cpt_file(step, fill=str(step).encode()))
        assert g.guard.poll(final=True)
    g.guard.stop()
    written = [r.event for r in store.read() if isinstance(r.event, CheckpointWritten)]
    assert [(e.sim_step, e.engine_step) for e in written] == [(1, 2500), (2, 5000)]
    assert "| sim step | 5000 |" in artifact_for(written[-1])[1]

    assert main(["checkpoints", "20260101", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["step"], r["seq"], r["sim_step"]) for r in rows] == [
        ("md/files", 1, 2500),
        ("md/files", 2, 5000),
    ]
    (work / "sim.cpt").write_bytes(b"torn")  # the power cut: resume from the capture
    notes: list[str] = []
    again = open_guard(launch, ("gmx", "mdrun"), store, SystemClock(), notes.append)
    assert again.guard is not None
    again.guard.stop()
    assert again.argv == ("gmx", "mdrun", "-cpi", "sim.cpt")
    assert any(f"from {written[-1].path} (step 5000); resuming" in n for n in notes), notes
    restored = [r.event for r in store.read() if isinstance(r.event, CheckpointRestored)]
    assert [(e.files, e.engine_step) for e in restored] == [(("sim.cpt",), 5000)]
