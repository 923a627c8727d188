"""A fault of m27's own while a step runs (a bug in the runner, say) fails that step in
the event log too: the flow's step task recorded an end only for an event-log error, so
the run ended failed while `m27 run`'s table and `m27 status` went on showing the step
running, with no reason anywhere but a traceback in Prefect's log."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NoReturn

import pytest

from m27.events.state import fold
from m27.store.sqlite import open_store
from tests.e2e._helpers import prefect_log_messages
from tests.waiting import wait_until

PIPELINE = """\
name: fault
steps:
  - name: first
    type: cpu
    command: "true"
  - name: after
    type: cpu
    command: "true"
    depends_on: [first]
"""


def _flow(**params: Any) -> Any:
    """The flow in this process (see test_flow_parameters.py for why settings are given)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.pipeline import pipeline_flow

    with temporary_settings(updates={PREFECT_API_URL: os.environ["PREFECT_API_URL"]}):
        return pipeline_flow(**params, return_state=True)


def test_an_error_inside_the_runner_fails_the_step_in_the_log_not_only_in_prefect(
    tmp_path: Path, m27_home: Path, prefect_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import m27.executors.local as local

    def broken(*args: object) -> NoReturn:
        raise RuntimeError("judging went wrong\nsecond line")

    monkeypatch.setattr(local, "_judge", broken)
    spec = tmp_path / "p.yaml"
    spec.write_text(PIPELINE)
    state = _flow(spec_path=str(spec), run_id="fault-1")
    assert state.is_failed()
    store = open_store(m27_home)
    try:
        run = fold(store.read_runs(("fault-1",))).runs["fault-1"]
    finally:
        store.close()
    assert run.status == "failed"
    assert run.failed_steps == ("first",)
    first = run.steps["first"]
    assert first.status == "failed"
    assert first.reason == "m27 error: RuntimeError: judging went wrong"
    assert first.attempts == 1 and first.duration_s is not None
    assert run.steps["after"].status == "skipped"
    flow_run_id = str(state.state_details.flow_run_id)

    def logged() -> list[str] | None:
        messages = prefect_log_messages(prefect_env, flow_run_id)
        return messages if any(m.startswith(first.reason) for m in messages) else None

    wait_until(logged, timeout=60, interval=0.3, what="the step's error in the run's log")
