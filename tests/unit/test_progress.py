"""The run's progress view: plain lines off a terminal, a live table on one."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from m27 import events as ev
from m27.cli.commands._progress import Progress
from m27.events.state import fold
from m27.spec import parse_pipeline
from m27.store.memory import MemoryEventStore

SPEC = """\
name: demo
pipeline:
  - name: prep
    type: cpu
    command: echo prep
  - name: sim
    type: gpu
    depends_on: [prep]
    command: echo sim
    output: traj.xyz
"""


def _events() -> list[ev.Event]:
    return [
        ev.RunSubmitted(1.0, "r1", "demo", "/x/demo.yaml", ("prep", "sim")),
        ev.StepQueued(1.1, "r1", "prep", "cpu"),
        ev.StepStarted(1.2, "r1", "prep", 1, 100, 100, ("echo", "prep")),
        ev.StepSucceeded(1.5, "r1", "prep", 1, 0.3),
        ev.StepStarted(2.0, "r1", "sim", 1, 101, 101, ("echo", "sim"), (1,)),
        ev.CheckpointWritten(3.0, "r1", "sim", "/c/m", 400, 2048, 4096, 0.01),
        ev.StepFailed(4.0, "r1", "sim", 1, 2.0, "exit code 3", exit_code=3),
        ev.RunFailed(4.1, "r1", 3.1, ("sim",), "step sim failed"),
        ev.StepStarted(4.2, "other-run", "x", 1, 5, 5, ("true",)),
    ]


def _progress(tmp_path: Path, *, live: bool = False) -> tuple[MemoryEventStore, Progress]:
    store = MemoryEventStore()
    return store, Progress(store, "r1", parse_pipeline(SPEC, tmp_path / "demo.yaml"), live=live)


def _shown(tmp_path: Path, capsys: pytest.CaptureFixture[str], events: list[ev.Event]) -> str:
    """What plain mode prints for `events` of run r1."""
    store, progress = _progress(tmp_path)
    progress.start()
    store.append(events)
    progress.stop()
    return capsys.readouterr().out


def _guest_started(held_first: bool = False) -> list[ev.Event]:
    """Step sim becomes a guest on GPU 0 and starts (held before it starts, or not)."""
    held = [ev.GuestPaused(1.0, "r1", "sim", 0)] if held_first else []
    return [
        ev.GuestStarted(1.0, "r1", "sim", 0),
        *held,
        ev.StepStarted(1.1, "r1", "sim", 1, 101, 101, ("echo", "sim"), (0,)),
    ]


def test_plain_mode_prints_one_line_per_event_of_this_run_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, progress = _progress(tmp_path)
    progress.start()
    store.append(_events())
    progress.on_lines("sim", "stdout", ["step 400/2000"])
    progress.stop()
    out = capsys.readouterr().out
    assert "prep: succeeded in 300ms" in out
    assert "sim: started (attempt 1, pid 101, GPU 1)" in out
    assert "[sim] step 400/2000" in out
    assert "sim: checkpoint at step 400 (2.0KiB written, state 4.0KiB)" in out
    assert "sim: failed (attempt 1): exit code 3" in out
    assert "run r1 failed: step sim failed" in out
    assert "other-run" not in out and " x:" not in out


def test_a_capture_of_a_programs_checkpoint_shows_the_step_it_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started = ev.StepStarted(2.0, "r1", "sim", 1, 101, 101, ("gmx", "mdrun"), (0,))
    capture = ev.CheckpointWritten(
        3.0, "r1", "sim", "/c/m", 2, 2048, 4096, 0.01, source="files", files=("sim.cpt",)
    )
    out = _shown(tmp_path, capsys, [started, capture, replace(capture, engine_step=7500)])
    assert "sim: captured sim.cpt (#2) (2.0KiB written" in out  # the engine's step unknown
    assert "sim: captured sim.cpt at step 7500 (#2) (2.0KiB written" in out


def test_a_step_stopped_on_a_lost_gpu_says_it_is_requeued_not_cancelled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _shown(
        tmp_path,
        capsys,
        [
            ev.StepStarted(2.0, "r1", "sim", 1, 101, 101, ("echo", "sim"), (0,)),
            ev.StepRequeued(2.5, "r1", "sim", 1, "GPU 0 lost"),
            ev.StepStarted(3.0, "r1", "sim", 1, 102, 102, ("echo", "sim"), (1,)),
        ],
    )
    assert "sim: cancelled" not in out
    assert (
        "sim: stopped: GPU 0 lost; requeued: it starts again when a GPU is free, from its "
        "last checkpoint if it has one"
    ) in out
    assert "sim: started (attempt 1, pid 102, GPU 1)" in out


def test_a_steps_first_output_line_comes_after_its_started_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The follower is not started: only the output line can bring "started" out first.
    store, progress = _progress(tmp_path)
    store.append([*_events()[:2], ev.StepStarted(1.2, "r1", "prep", 1, 100, 100, ("x",))])
    progress.on_lines("prep", "stderr", ["cannot create out/x: Directory nonexistent"])
    progress.on_lines("prep", "stderr", ["second line"])
    store.append([ev.StepSucceeded(1.5, "r1", "prep", 1, 0.3)])
    progress._drain()
    lines = [line.split(" ", 1)[1] for line in capsys.readouterr().out.splitlines()]
    assert lines == [
        "prep: started (attempt 1, pid 100, CPU)",
        "[prep] cannot create out/x: Directory nonexistent",
        "[prep] second line",
        "prep: succeeded in 300ms",
    ]


def test_a_slurm_step_shows_its_job_its_wait_in_the_queue_and_its_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, progress = _progress(tmp_path)
    store.append(
        [
            *_events()[:4],
            ev.SlurmJobSubmitted(1.6, "r1", "sim", "42", 1),
            ev.SlurmJobStateChanged(1.7, "r1", "sim", "42", "PENDING"),
            ev.SlurmJobStateChanged(1.8, "r1", "sim", "42", "PENDING", "Resources"),
            ev.SlurmJobStateChanged(2.0, "r1", "sim", "42", "RUNNING"),
            ev.StepStarted(2.0, "r1", "sim", 1, 0, 0, ("x",), (0,), host="node7"),
            ev.SlurmJobStateChanged(2.5, "r1", "sim", "42", "COMPLETED"),
        ]
    )
    progress._drain()
    lines = [line.split(" ", 1)[1] for line in capsys.readouterr().out.splitlines()]
    assert lines[-3:] == [
        "sim: submitted as Slurm job 42 (attempt 1)",
        "sim: Slurm job 42 pending: Resources",
        "sim: started (attempt 1, Slurm job 42 on node7, GPU 0)",
    ]


def test_live_mode_renders_a_table_of_steps_with_their_state(tmp_path: Path) -> None:
    store, progress = _progress(tmp_path, live=True)
    progress.console = Console(file=io.StringIO(), width=120, force_terminal=True)
    progress.start()
    store.append(_events()[:5])
    progress.on_lines("sim", "stdout", ["step 400/2000"])
    progress.stop()
    screen = Console(file=io.StringIO(), width=120)
    screen.print(progress._table())
    text = screen.file.getvalue()  # type: ignore[attr-defined]
    assert "demo / r1" in text
    prep = next(line for line in text.splitlines() if " prep " in line)
    sim = next(line for line in text.splitlines() if " sim " in line)
    assert "succeeded" in prep and "300ms" in prep
    assert "running" in sim and "step 400/2000" in sim


def test_summary_names_failed_steps_their_exit_and_how_to_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = MemoryEventStore()
    pipeline = parse_pipeline(SPEC, tmp_path / "demo.yaml")
    store.append(_events())
    run = fold(store.read()).runs["r1"]
    Progress(store, "r1", pipeline, live=False).summary(run)
    out = capsys.readouterr().out
    assert "failed     sim  exit code 3" in out
    assert "succeeded  prep" in out
    assert "resume: m27 run --resume r1" in out
    assert "outputs:" not in out  # the step that declares traj.xyz did not succeed


def test_summary_shows_the_energy_each_step_used_when_it_was_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = MemoryEventStore()
    pipeline = parse_pipeline(SPEC, tmp_path / "demo.yaml")
    store.append(_events()[:5])
    store.append(
        [
            ev.StepEnergyMeasured(5.0, "r1", "sim", 1, 12_300.0),
            ev.StepSucceeded(6.0, "r1", "sim", 1, 4.0),
            ev.RunSucceeded(6.1, "r1", 5.1),
        ]
    )
    run = fold(store.read()).runs["r1"]
    Progress(store, "r1", pipeline, live=False).summary(run)
    out = capsys.readouterr().out
    sim = next(line for line in out.splitlines() if line.strip().endswith("kJ"))
    assert "sim" in sim and "12.3 kJ" in sim
    assert "energy: 12.3 kJ on GPUs" in out


def test_a_resumed_run_shows_every_step_done_naming_the_earlier_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = MemoryEventStore()
    pipeline = parse_pipeline(SPEC, tmp_path / "demo.yaml")
    store.append(
        [
            ev.RunSubmitted(1.0, "r2", "demo", "/x/demo.yaml", ("prep", "sim"), resume_of="r1"),
            ev.StepSkipped(1.1, "r2", "prep", "succeeded in the resumed run"),
            ev.StepStarted(2.0, "r2", "sim", 1, 101, 101, ("echo", "sim"), (1,)),
            ev.StepSucceeded(3.0, "r2", "sim", 1, 1.0),
            ev.RunSucceeded(3.1, "r2", 2.1),
        ]
    )
    run = fold(store.read()).runs["r2"]
    Progress(store, "r2", pipeline, live=False).summary(run)
    out = capsys.readouterr().out
    assert "succeeded  prep  (in the earlier run r1)" in out
    assert "succeeded  sim" in out and "skipped" not in out


def test_a_resume_of_a_resume_names_the_run_where_the_step_succeeded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """r3 resumes r2, which skipped prep (done in r1): `in the earlier run r2` named a run
    where prep never ran."""
    store = MemoryEventStore()
    pipeline = parse_pipeline(SPEC, tmp_path / "demo.yaml")
    store.append(
        [
            ev.RunSubmitted(1.0, "r3", "demo", "/x/demo.yaml", ("prep", "sim"), resume_of="r2"),
            ev.StepSkipped(1.1, "r3", "prep", ev.StepSkipped.done_in("r1")),
            ev.StepSkipped(1.1, "r3", "sim", ev.StepSkipped.done_in("r2")),
            ev.RunSucceeded(1.2, "r3", 0.2),
        ]
    )
    Progress(store, "r3", pipeline, live=False).summary(fold(store.read()).runs["r3"])
    out = capsys.readouterr().out
    assert "succeeded  prep  (in the earlier run r1)" in out
    assert "succeeded  sim  (in the earlier run r2)" in out


@pytest.mark.parametrize("width", [80, 100])
def test_the_live_table_is_readable_at_80_and_100_columns(tmp_path: Path, width: int) -> None:
    spec = SPEC.replace("name: prep", "name: preprocessing").replace("[prep]", "[preprocessing]")
    spec = spec.replace("name: sim", "name: md_simulation")
    store = MemoryEventStore()
    pipeline = parse_pipeline(spec, tmp_path / "demo.yaml")
    progress = Progress(store, "20261201-131210-f68a", pipeline, live=True)
    progress.console = Console(file=io.StringIO(), width=width, force_terminal=True)
    progress.start()
    run = "20261201-131210-f68a"
    store.append(
        [
            ev.RunSubmitted(1.0, run, "demo", "/x/demo.yaml", ("preprocessing", "md_simulation")),
            ev.StepStarted(1.2, run, "preprocessing", 1, 100, 100, ("echo",)),
            ev.StepSucceeded(1.5, run, "preprocessing", 1, 0.3),
        ]
    )
    progress.on_lines("md_simulation", "stdout", ["step 1400/2000 E=-2043.7371 T=0.7294 ok ok"])
    progress.stop()
    screen = Console(file=io.StringIO(), width=width)
    screen.print(progress._table())
    lines = screen.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert all(len(line) <= width for line in lines)
    header = next(line for line in lines if "step" in line and "status" in line)
    for col in ("type", "where", "time", "last output"):
        assert col in header
    prep = next(line for line in lines if "preprocessing" in line)
    assert "succeeded" in prep and "300ms" in prep  # nothing but the output is cut
    sim = next(line for line in lines if "md_simulation" in line)
    assert "step 1400/2000" in sim and "…" in sim


def test_a_guest_says_when_it_is_held_and_promoted_and_how_long_it_waited(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 2 s gpu_light step beside a computing primary reported only `succeeded in 6.0s`:
    nothing said it had been held for 4 s, nor that it became the GPU's primary."""
    out = _shown(
        tmp_path,
        capsys,
        [
            ev.RunSubmitted(1.0, "r1", "demo", "/x/demo.yaml", ("prep", "sim")),
            *_guest_started(held_first=True),
            ev.GuestPaused(1.2, "r1", "sim", 0, how="signal"),
            ev.GuestResumed(2.0, "r1", "sim", 0),
            ev.GuestPaused(3.0, "r1", "sim", 0, how="signal"),
            ev.Promoted(5.0, "r1", "sim", 0),
            ev.StepSucceeded(7.0, "r1", "sim", 1, 5.9),
        ],
    )
    assert (
        "sim: started (attempt 1, pid 101, GPU 0, as a guest beside the GPU's primary, "
        "held while it computes)" in out
    )
    assert "held on GPU 0" not in out  # said once, on the started line, not per hold
    assert "sim: promoted to primary on GPU 0 (its primary is done)" in out
    assert "sim: succeeded in 5.9s (held 3.0s as a guest)" in out  # 1.0-2.0 and 3.0-5.0


def test_a_promotion_after_the_guests_own_end_is_not_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The agent may promote a guest whose end it has not read yet (same tick)."""
    out = _shown(
        tmp_path,
        capsys,
        [
            *_guest_started(),
            ev.StepSucceeded(2.0, "r1", "sim", 1, 0.9),
            ev.Promoted(2.0, "r1", "sim", 0),
        ],
    )
    assert "sim: succeeded in 900ms" in out and "promoted" not in out


def test_a_guest_held_after_it_started_gets_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _shown(
        tmp_path,
        capsys,
        [
            *_guest_started(),
            ev.GuestPaused(1.2, "r1", "sim", 0, how="signal"),
            ev.GuestResumed(2.0, "r1", "sim", 0),
            ev.GuestPaused(3.0, "r1", "sim", 0, how="signal"),
            ev.StepFailed(4.0, "r1", "sim", 1, 2.9, "exit code 1", exit_code=1),
        ],
    )
    assert "sim: started (attempt 1, pid 101, GPU 0, as a guest beside the GPU's primary)" in out
    assert out.count("sim: held on GPU 0 while the GPU's primary computes") == 1


def test_the_live_table_shows_a_held_guest_as_paused(tmp_path: Path) -> None:
    _, progress = _progress(tmp_path, live=True)
    progress._apply(ev.GuestStarted(1.0, "r1", "sim", 0))
    progress._apply(ev.StepStarted(1.1, "r1", "sim", 1, 101, 101, ("echo", "sim"), (0,)))
    progress._apply(ev.GuestPaused(1.2, "r1", "sim", 0, how="signal"))
    console = Console(file=io.StringIO(), width=100)
    console.print(progress._table())
    assert "paused" in console.file.getvalue()
    progress._apply(ev.GuestResumed(2.0, "r1", "sim", 0))
    console = Console(file=io.StringIO(), width=100)
    console.print(progress._table())
    text = console.file.getvalue()
    assert "paused" not in text and "running" in text


@pytest.mark.parametrize(
    ("reason", "exit_code", "sig", "shown"),
    [
        # It read `exit 0 declared output missing: a.pdb`.
        ("declared output missing: a.pdb", 0, None, "exited 0, but declared output missing: a.pdb"),
        # It read `exit 3 exited with code 3` and `signal 9 timed out after 2.0s`.
        ("exited with code 3", 3, None, "exited with code 3"),
        ("timed out after 2.0s", None, 9, "timed out after 2.0s"),
        ("command not found: gmx", 127, None, "command not found: gmx (exit 127)"),
        ("", 4, None, "exit 4"),
    ],
)
def test_summary_says_once_how_a_step_failed(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    reason: str,
    exit_code: int | None,
    sig: int | None,
    shown: str,
) -> None:
    store = MemoryEventStore()
    store.append(
        [
            ev.RunSubmitted(1.0, "r1", "demo", "/x/demo.yaml", ("prep", "sim")),
            ev.StepStarted(1.2, "r1", "prep", 1, 100, 100, ("echo", "prep")),
            ev.StepFailed(1.5, "r1", "prep", 1, 0.3, reason, exit_code=exit_code, signal=sig),
            ev.RunFailed(1.6, "r1", 0.6, ("prep",), "step prep failed"),
        ]
    )
    run = fold(store.read()).runs["r1"]
    Progress(store, "r1", parse_pipeline(SPEC, tmp_path / "demo.yaml"), live=False).summary(run)
    lines = capsys.readouterr().out.splitlines()
    assert f"  failed     prep  {shown}" in lines


def test_a_step_waiting_for_its_lease_is_said_once_with_where_the_reason_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A step waiting 20 s for a GPU another run held printed nothing until it started."""
    from m27.node.lease import WAIT_TOLD_S

    store, progress = _progress(tmp_path)
    store.append(
        [
            ev.RunSubmitted(100.0, "r1", "demo", "/x/demo.yaml", ("prep", "sim")),
            ev.StepRequested(100.0, "r1", "prep", "cpu"),
            ev.LeaseGranted(100.1, "r1", "prep", ()),
            ev.StepRequested(101.0, "r1", "sim", "gpu", gpus=2),
        ]
    )
    progress._drain()
    capsys.readouterr()
    progress.tell_waits(101.0 + WAIT_TOLD_S - 0.1)
    assert capsys.readouterr().out == ""  # not yet: most grants take milliseconds
    progress.tell_waits(101.0 + WAIT_TOLD_S)
    progress.tell_waits(101.0 + 10 * WAIT_TOLD_S)  # once
    lines = [line.split(" ", 1)[1] for line in capsys.readouterr().out.splitlines()]
    assert lines == ["sim: waiting for 2 GPUs (`m27 queue --why sim` says why)"]
    store.append([ev.LeaseGranted(130.0, "r1", "sim", (0, 1))])
    store.append([ev.StepRequested(140.0, "r1", "sim", "gpu", gpus=1)])  # its retry, later
    progress._drain()
    capsys.readouterr()
    progress.tell_waits(140.0 + WAIT_TOLD_S)
    lines = [line.split(" ", 1)[1] for line in capsys.readouterr().out.splitlines()]
    assert lines == ["sim: waiting for a GPU (`m27 queue --why sim` says why)"]
