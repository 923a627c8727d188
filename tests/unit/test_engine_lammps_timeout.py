"""A LAMMPS run stopped by its input script's `timer timeout` (LAMMPS's own wall-time
limit, a job script's habit) exits 0 with the rest of its run, and every later `run`,
skipped. Such a step counted as succeeded: the steps after it analysed part of a
trajectory. LAMMPS says so on its screen and in its log file; a step run with `-screen
none` has only the log."""

from __future__ import annotations

from pathlib import Path

from m27.executors.engines import stopped_early
from m27.executors.local import run_step
from m27.store.memory import MemoryEventStore
from tests.unit.engine_files import lammps_restart
from tests.unit.runner_helpers import launch

#: The end of a run stopped by `timer timeout 2 every 10` (LAMMPS 20220623, Debian):
#: exit code 0, the restart file written after it at step 7230.
TIMEOUT_TAIL = [
    "Step Temp E_pair E_mol TotEng Press ",
    "    7000     1.586106   -4.7064923            0    -2.330087       6.0542 ",
    "WARNING: Wall time limit reached (src/timer.cpp:238)",
    "Loop time of 0.0622649 on 1 procs for 230 steps with 864 atoms",
    "",
    "System init for write_restart ...",
    "Total wall time: 0:00:02",
]
#: The end of a run that got to its last step
WHOLE_TAIL = [
    "   20000    1.6339429   -4.7609911            0   -2.3129135    5.7808776 ",
    "Loop time of 0.276804 on 1 procs for 1000 steps with 864 atoms",
    "Total wall time: 0:00:30",
]
ARGV = ("lmp", "-in", "melt.in", "-var", "m27_restart", "m27.restart", "-log", "melt.log")


def test_a_timeout_on_the_screen_is_read_with_the_restart_files_step(tmp_path: Path) -> None:
    (tmp_path / "m27.restart").write_bytes(lammps_restart(7230))
    said = stopped_early(TIMEOUT_TAIL, recipe="lammps", argv=ARGV, workdir=tmp_path)
    assert said == (
        "LAMMPS stopped at its `timer timeout`, its wall-time limit (its restart file is at "
        "step 7230), before the end of its input script"
    )
    assert stopped_early(WHOLE_TAIL, recipe="lammps", argv=ARGV, workdir=tmp_path) is None


def test_a_step_without_checkpoint_still_fails_on_the_timeout() -> None:
    """No recipe (no `checkpoint:`): the screen says it all the same."""
    assert stopped_early(TIMEOUT_TAIL) == (
        "LAMMPS stopped at its `timer timeout`, its wall-time limit (no m27 restart file), "
        "before the end of its input script"
    )


def test_with_screen_none_the_log_file_says_it(tmp_path: Path) -> None:
    (tmp_path / "m27.restart").write_bytes(lammps_restart(25100))
    # a long log: the warning is read from its end
    (tmp_path / "melt.log").write_text("thermo line\n" * 100_000 + "\n".join(TIMEOUT_TAIL))
    quiet = (*ARGV, "-screen", "none")
    said = stopped_early([], recipe="lammps", argv=quiet, workdir=tmp_path)
    assert said is not None and "(its restart file is at step 25100)" in said
    # LAMMPS's default log file, when the command names none
    default = tuple(a for a in quiet if a not in ("-log", "melt.log"))
    (tmp_path / "melt.log").rename(tmp_path / "log.lammps")
    assert stopped_early([], recipe="lammps", argv=default, workdir=tmp_path) == said


def test_a_log_without_the_warning_or_no_log_says_nothing(tmp_path: Path) -> None:
    (tmp_path / "melt.log").write_text("\n".join(WHOLE_TAIL))
    assert stopped_early([], recipe="lammps", argv=ARGV, workdir=tmp_path) is None
    (tmp_path / "melt.log").write_text("\n".join(TIMEOUT_TAIL))
    no_log = (*ARGV[:-2], "-log", "none")  # a stale log.lammps is not this run's
    (tmp_path / "log.lammps").write_text("\n".join(TIMEOUT_TAIL))
    assert stopped_early([], recipe="lammps", argv=no_log, workdir=tmp_path) is None
    (tmp_path / "melt.log").unlink()
    assert stopped_early([], recipe="lammps", argv=ARGV, workdir=tmp_path) is None


def test_an_attempt_stopped_by_its_timeout_failed_though_it_exited_0() -> None:
    printed = "; ".join(f"print({line!r})" for line in TIMEOUT_TAIL)
    result = run_step(launch(printed), MemoryEventStore())
    assert not result.ok
    assert result.reason.startswith("LAMMPS stopped at its `timer timeout`")
    assert result.reason.endswith("the step has no `checkpoint:`")
    whole = run_step(launch("; ".join(f"print({x!r})" for x in WHOLE_TAIL)), MemoryEventStore())
    assert whole.ok
