"""The node service's settle pass names the flow runs it may have closed even when the
pass fails part way: their task runs that Prefect lacks are made later from that list,
and the next pass sees them closed and would not name them (the `after` step that
started while a lab server was down then never got its task run)."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from m27.events import RunFailed, RunSubmitted, StepSucceeded
from m27.events.state import fold
from m27.node.settle import settle


class _Timeout(Exception):
    """What a server that has just restarted answers a slow request with."""


class _Prefect:
    """A Prefect client whose flow run is open, and whose answer to setting its end times
    out after the server took it."""

    def __init__(self, flow_run_id: uuid.UUID) -> None:
        self.open = [SimpleNamespace(id=flow_run_id, state=None)]
        self.set: list[str] = []

    async def read_flow_runs(self, **_: Any) -> list[Any]:
        return self.open

    async def read_task_runs(self, **_: Any) -> list[Any]:
        return []

    async def set_flow_run_state(self, flow_run_id: uuid.UUID, state: Any, force: bool) -> None:
        self.set.append(state.type.value)
        self.open = []
        raise _Timeout("read timed out")


def test_a_flow_run_whose_end_was_set_before_the_pass_failed_is_still_named() -> None:
    flow_run_id = uuid.uuid4()
    state = fold(
        [
            RunSubmitted(1.0, "r1", pipeline="p", spec_path="p.yaml", steps=("wait", "after")),
            StepSucceeded(2.0, "r1", "wait", 1, 1.0),
            RunFailed(3.0, "r1", 2.0, reason="stopped"),
        ]
    )
    run = state.runs["r1"]
    client = _Prefect(flow_run_id)
    changed: list[str] = []
    with pytest.raises(_Timeout):
        asyncio.run(settle(client, {str(flow_run_id): run}, changed))  # type: ignore[arg-type]
    assert client.set == ["FAILED"] and changed == [str(flow_run_id)]
    # the next pass finds it closed: it names nothing, so the first pass had to
    assert asyncio.run(settle(client, {str(flow_run_id): run})) == []  # type: ignore[arg-type]
