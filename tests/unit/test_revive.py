"""`on_crash: resume`: which crashed runs the node service resumes (m27.node.revive), a
pure function of the log's state, and `on_crash:` in a pipeline file."""

from __future__ import annotations

from pathlib import Path

import pytest

from m27 import events as ev
from m27.cli.main import main
from m27.events.state import NodeState, fold
from m27.node.revive import Revival, to_resume
from m27.spec import SpecError, load_pipeline

HOST, USER = "gpu1", "ana"


def _run(
    run_id: str,
    at: float,
    *,
    on_crash: str = "resume",
    resume_of: str | None = None,
    host: str = HOST,
    owner: str = USER,
    saved: bool = False,
    ended: type[ev.Event] = ev.RunCrashed,
) -> list[ev.Event]:
    """A run of one step `md` that ends at `at + 10` as `ended` says; `saved`: its step
    saved a checkpoint first."""
    out: list[ev.Event] = [
        ev.RunSubmitted(
            at,
            run_id,
            "p",
            "p.yaml",
            ("md",),
            resume_of=resume_of,
            pid=1,
            host=host,
            owner=owner,
            on_crash=on_crash,
        ),
        ev.StepStarted(at + 1, run_id, "md", 1, 2, 2, ("md",)),
    ]
    if saved:
        out.append(ev.CheckpointWritten(at + 2, run_id, "md", "/ck/1", 1, 100, 100, 0.1))
    if ended is ev.RunCrashed:
        out.append(ev.RunCrashed(at + 10, run_id, "its process is gone"))
    else:
        out.append(ev.RunCancelled(at + 10, run_id, "SIGINT received"))
    return out


def _state(*runs: list[ev.Event]) -> NodeState:
    return fold([e for run in runs for e in run])


def test_a_crashed_run_that_asks_for_it_is_resumed_once() -> None:
    state = _state(_run("r1", 100.0))
    assert to_resume(state, HOST, USER, since=0.0) == [Revival("r1", True)]
    # decided once: recorded (by the service, before it starts the resume) and so not again
    assert to_resume(fold([ev.AutoResumeStarted(120.0, "r1")], state), HOST, USER, 0.0) == []
    # resumed already (by hand, from Telegram, or by the service before it restarted)
    state = _state(_run("r1", 100.0), _run("r2", 200.0, resume_of="r1", saved=True)[:2])
    assert to_resume(state, HOST, USER, since=0.0) == []


@pytest.mark.parametrize(
    ("why", "run"),
    [
        ("the pipeline leaves it to a person", _run("r1", 100.0, on_crash="stop")),
        ("a log from before on_crash", _run("r1", 100.0, on_crash="")),
        ("another host's run", _run("r1", 100.0, host="gpu2")),
        ("cancelled, not crashed", _run("r1", 100.0, ended=ev.RunCancelled)),
    ],
)
def test_runs_that_are_not_resumed(why: str, run: list[ev.Event]) -> None:
    assert to_resume(_state(run), HOST, USER, since=50.0) == [], why


def test_an_old_crash_is_not_resumed_because_the_service_started_and_that_is_recorded() -> None:
    state = _state(_run("r1", 10.0))
    (revival,) = to_resume(state, HOST, USER, since=50.0)
    assert not revival.resume and "crashed before this node service started" in revival.why
    fold([ev.AutoResumeSkipped(60.0, "r1", revival.why)], state)
    assert state.runs["r1"].auto_resume == "skipped"
    assert state.runs["r1"].auto_resume_reason == revival.why
    assert to_resume(state, HOST, USER, since=50.0) == []  # said once


def test_a_resume_that_crashed_again_is_resumed_only_if_it_got_further() -> None:
    first = _run("r1", 100.0)
    progressed = _state(first, _run("r2", 200.0, resume_of="r1", saved=True))
    assert to_resume(progressed, HOST, USER, since=0.0) == [Revival("r2", True)]
    stuck = _state(first, _run("r2", 200.0, resume_of="r1"))
    (revival,) = to_resume(stuck, HOST, USER, since=0.0)
    assert revival.run_id == "r2" and not revival.resume
    assert "crashed again before any step of it saved a checkpoint or succeeded" in revival.why
    # a first run is resumed even without a checkpoint: its steps start over once
    assert to_resume(_state(first), HOST, USER, since=0.0) == [Revival("r1", True)]


def test_another_user_s_run_is_left_to_that_user() -> None:
    """A shared $M27_HOME under systemd's `m27` user: the resume would run ana's steps as
    m27, in ana's folders."""
    (revival,) = to_resume(_state(_run("r1", 100.0)), HOST, "m27", since=0.0)
    assert not revival.resume
    assert revival.why == (
        "it is ana's run and this service runs as m27: its steps would run as m27; ana "
        "resumes it (m27 run --resume r1)"
    )
    # a log from before owners were recorded names none: the service's user resumes it
    ownerless = _state(_run("r1", 100.0, owner=""))
    assert to_resume(ownerless, HOST, "m27", since=0.0) == [Revival("r1", True)]


def test_on_crash_in_a_pipeline_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    step = '  - {name: a, type: cpu, command: "true"}\n'
    path.write_text("pipeline:\n" + step)
    assert load_pipeline(path).on_crash == "stop"
    path.write_text("on_crash: resume\npipeline:\n" + step)
    assert load_pipeline(path).on_crash == "resume"
    assert main(["validate", str(path)]) == 0
    assert "on crash: the node service resumes a run whose process died" in (
        capsys.readouterr().out
    )
    path.write_text("on_crash: restart\npipeline:\n" + step)
    with pytest.raises(SpecError) as err:
        load_pipeline(path)
    (problem,) = err.value.problems
    assert (problem.line, problem.column, problem.field) == (1, 11, "on_crash")
    assert "unknown value 'restart'" in problem.message and "resume" in problem.message
