"""A flow run's parameters as Prefect's UI lets a person edit them ("Custom run" of a
deployment): a number among the overrides runs with its text; anything the run cannot use
ends it Failed with one line that names the parameter, records no run, and leaves no
traceback in the run's log (a list among the overrides raised a TypeError from deep in
validation; a `run_id` another run has mixed both runs' events)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from m27.events import RunFailed, RunSubmitted
from m27.store.sqlite import open_store
from tests.e2e._helpers import prefect_log_messages
from tests.waiting import wait_until

PIPELINE = """\
name: params
steps:
  - name: say
    type: cpu
    shell: true
    command: echo {{MSG}} > said.txt
"""


def _flow(**params: Any) -> Any:
    """The flow in this process, against the session's Prefect server. Its settings are
    given here, not only through the environment: Prefect keeps the settings of its first
    import, and a full test session imports it while collecting, before any test's
    PREFECT_API_URL (the flow then started an ephemeral server of its own, and timed out)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.pipeline import pipeline_flow

    with temporary_settings(updates={PREFECT_API_URL: os.environ["PREFECT_API_URL"]}):
        return pipeline_flow(**params, return_state=True)


@pytest.fixture
def spec(tmp_path: Path, m27_home: Path, prefect_env: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(PIPELINE)
    return path


def _submitted(home: Path) -> list[RunSubmitted]:
    store = open_store(home)
    try:
        return [r.event for r in store.read() if isinstance(r.event, RunSubmitted)]
    finally:
        store.close()


def test_a_number_among_the_overrides_runs_as_its_text(spec: Path, m27_home: Path) -> None:
    state = _flow(spec_path=str(spec), overrides={"MSG": 5})
    assert state.is_completed(), state.message
    assert (spec.parent / "said.txt").read_text() == "5\n"
    [submitted] = _submitted(m27_home)
    assert submitted.vars == {"MSG": "5"}


@pytest.mark.parametrize(
    ("params", "line"),
    [
        ({"overrides": {"MSG": [1, 2]}}, "flow parameters: overrides.MSG: must be text or a number, got list"),
        ({"overrides": "MSG=x"}, "flow parameters: overrides: must be a mapping of NAME to value, got str"),
        ({"overrides": {"MSG": "x"}, "resume_of": "nope"}, "flow parameters: resume_of: no run matches 'nope'"),
        ({"overrides": {"MSG": "x"}, "run_id": "../x"}, "flow parameters: run_id: '../x' is not a run id"),
        ({"overrides": {}}, "steps[0].command: undefined variable 'MSG'"),
    ],
    ids=["list", "not-a-mapping", "unknown-resume", "bad-run-id", "bad-pipeline"],
)  # fmt: skip
def test_a_parameter_the_run_cannot_use_fails_it_in_one_line(
    spec: Path, m27_home: Path, prefect_env: str, params: dict[str, Any], line: str
) -> None:
    state = _flow(spec_path=str(spec), **params)
    assert state.is_failed()
    assert line in state.message
    assert _submitted(m27_home) == []  # nothing recorded: no run to close or to mix with
    flow_run_id = str(state.state_details.flow_run_id)

    def logged() -> list[str] | None:
        messages = prefect_log_messages(prefect_env, flow_run_id)
        return messages if any(line in m for m in messages) else None

    messages = wait_until(logged, timeout=60, interval=0.3, what="the problem in the run's log")
    assert not any("Traceback" in m or "Encountered exception" in m for m in messages), messages


def test_a_run_id_another_run_has_is_refused(spec: Path, m27_home: Path) -> None:
    first = _flow(spec_path=str(spec), overrides={"MSG": "one"}, run_id="r-1")
    assert first.is_completed(), first.message
    second = _flow(spec_path=str(spec), overrides={"MSG": "two"}, run_id="r-1")
    assert second.is_failed()
    assert "run_id: run r-1 is already in the event log" in second.message
    assert [s.run_id for s in _submitted(m27_home)] == ["r-1"]
    assert (spec.parent / "said.txt").read_text() == "one\n"


def test_a_run_whose_steps_fail_names_every_one_in_file_order(
    tmp_path: Path, m27_home: Path, prefect_env: str
) -> None:
    """It said `step b failed` when a had failed too (the first to finish, not the list)."""
    path = tmp_path / "two.yaml"
    path.write_text(
        "name: two\nsteps:\n"
        "  - {name: a, type: cpu, command: 'sh -c \"sleep 0.3; exit 1\"'}\n"
        "  - {name: b, type: cpu, command: 'false'}\n"
        "  - {name: c, type: cpu, command: 'true'}\n"
    )
    state = _flow(spec_path=str(path))
    assert state.is_failed()
    store = open_store(m27_home)
    try:
        [failed] = [r.event for r in store.read() if isinstance(r.event, RunFailed)]
    finally:
        store.close()
    assert (failed.failed_steps, failed.reason) == (("a", "b"), "steps a, b failed")


def test_resume_of_a_run_of_another_pipeline_is_refused(
    spec: Path, m27_home: Path, tmp_path: Path
) -> None:
    """Its succeeded `say` would have been skipped in a pipeline with a step `say` too."""
    first = _flow(spec_path=str(spec), overrides={"MSG": "one"}, run_id="r-a")
    assert first.is_completed(), first.message
    other = tmp_path / "other.yaml"
    other.write_text(PIPELINE.replace("name: params", "name: other"))
    state = _flow(spec_path=str(other), overrides={"MSG": "two"}, resume_of="r-a")
    assert state.is_failed()
    assert "resume_of: run r-a is of pipeline 'params', not 'other'" in state.message
    assert [s.run_id for s in _submitted(m27_home)] == ["r-a"]


def test_resume_of_a_run_that_still_runs_is_refused_and_of_a_dead_one_goes_on(
    spec: Path, m27_home: Path
) -> None:
    """`m27 run --resume` refused it; a deployment's "Custom run" went on, and ran the
    steps the live run was running a second time, beside it."""
    import socket
    import subprocess

    from m27 import liveness

    dead = subprocess.Popen(["sleep", "60"])
    started = {
        os.getpid(): liveness.start_time(os.getpid()),
        dead.pid: liveness.start_time(dead.pid),
    }
    dead.kill()  # its start time is recorded: a process that reuses its pid is not it
    dead.wait()
    store = open_store(m27_home)
    try:
        for run_id, pid in (("r-live", os.getpid()), ("r-dead", dead.pid)):
            store.append(
                [
                    RunSubmitted(
                        at=1.0,
                        run_id=run_id,
                        pipeline="params",
                        spec_path=str(spec),
                        steps=("say",),
                        pid=pid,
                        host=socket.gethostname(),
                        pid_started=started[pid],
                    )
                ]
            )
    finally:
        store.close()
    state = _flow(spec_path=str(spec), overrides={"MSG": "x"}, resume_of="r-live")
    assert state.is_failed()
    assert (
        f"resume_of: run r-live is still running (pid {os.getpid()} on {socket.gethostname()}); "
        "resuming it now would run its steps twice"
    ) in state.message
    assert [s.run_id for s in _submitted(m27_home)] == ["r-live", "r-dead"]
    resumed = _flow(spec_path=str(spec), overrides={"MSG": "x"}, resume_of="r-dead")
    assert resumed.is_completed(), resumed.message


def test_a_deployment_s_run_makes_the_matrix_steps_from_its_own_overrides(
    tmp_path: Path, m27_home: Path, prefect_env: str
) -> None:
    """`vars: {SEEDS:}` left to each run (`m27 deploy`): a Custom run with SEEDS "4 5"
    runs the steps md.4 and md.5, each with its value."""
    path = tmp_path / "replicas.yaml"
    path.write_text(
        "vars:\n  SEEDS:\nsteps:\n  - name: md\n    type: cpu\n"
        '    matrix: {SEED: "{{SEEDS}}"}\n    shell: true\n    command: echo {{SEED}} > seed{{SEED}}.txt\n'
    )
    state = _flow(spec_path=str(path), overrides={"SEEDS": "4 5"})
    assert state.is_completed(), state.message
    (submitted,) = _submitted(m27_home)
    assert submitted.steps == ("md.4", "md.5")
    assert (tmp_path / "seed5.txt").read_text() == "5\n"
