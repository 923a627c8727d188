"""Prefect shows how a run ended even when it could not be told at the time.

A run's flow process reports its end to Prefect itself. When the Prefect server is down
at that moment (`m27 agent stop` during a run, the server restarting after a crash, a
lab server unreachable), the event log records the end but Prefect keeps showing the
flow run Running, forever. The node service therefore settles such runs: a run that
ended in the log, whose flow process is gone (so nothing else will report it), and that
Prefect still shows open gets the end the log recorded, its unfinished task runs the end
of their steps. The log is the truth; this only brings Prefect's copy in line.

Steps that started while the server was down have no task run there at all (their flow
process could not create one): :func:`add_missing_tasks` creates each, with its step's end,
so the flow run lists every step the log has. The node service calls it a while after the
settle, not with it: a task run the flow process did create reaches Prefect as events,
seconds late, and one made for it meanwhile would show the step twice.

The same goes for a flow run Prefect shows Crashed when the log recorded another end:
Prefect's engine calls a run Crashed when it was interrupted (a second Ctrl-C aborts a run
the first had asked to cancel: the log says cancelled), so it gets the log's end too.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from m27 import liveness
from m27._exceptions import one_line
from m27.events.state import NodeState, RunState

if TYPE_CHECKING:
    from prefect.client.orchestration import PrefectClient

__all__ = ["add_missing_tasks", "ended_runs", "settle", "settle_tasks"]

#: Flow runs asked about per request (their ids go into the filter).
_BATCH = 200


def ended_runs(
    state: NodeState,
    skip: Collection[str],
    host: str | None = None,
    is_alive: Callable[[int, float | None], bool] = liveness.alive,
) -> dict[str, RunState]:
    """This host's runs that ended in the log, whose flow process is gone, by flow run id
    (those in `skip` left out: already settled)."""
    host = host or socket.gethostname()
    return {
        run.flow_run_id: run
        for run in state.runs.values()
        if run.status != "running"
        and run.flow_run_id
        and run.flow_run_id not in skip
        and run.host == host
        and not (run.pid and is_alive(run.pid, run.pid_started))
    }


def _flow_state(run: RunState) -> Any:
    from prefect.states import Cancelled, Completed, Crashed, Failed

    why = "recorded by the m27 node service: Prefect could not be told when the run ended"
    if run.crashed:
        return Crashed(message=run.reason)
    if run.status == "succeeded":
        return Completed(message=why)
    if run.status == "cancelled":
        return Cancelled(message=run.reason or why)
    return Failed(message=run.reason or why)


def _task_state(run: RunState, step_name: str) -> Any:
    """A step's end as a task-run state; a step the run ended without (it never got to
    end itself) shares the run's."""
    from prefect.states import Cancelled, Completed, Failed

    step = run.steps.get(step_name)
    status = step.status if step is not None else ""
    if status == "succeeded":
        return Completed()
    if status == "failed":
        return Failed(message=step.reason if step is not None else "")
    if status in ("cancelled", "skipped"):
        return Cancelled(message=step.reason if step is not None else "")
    return _flow_state(run)


def _open_types() -> tuple[list[Any], list[Any]]:
    """Prefect's state types of a run not ended, and those plus Crashed (wrong unless the
    log says it crashed too)."""
    from prefect.client.schemas.objects import StateType

    final = (StateType.COMPLETED, StateType.FAILED, StateType.CANCELLED, StateType.CRASHED)
    open_types = [t for t in StateType if t not in final]
    return open_types, [*open_types, StateType.CRASHED]


async def settle_tasks(client: PrefectClient, flow_run_id: str, run: RunState) -> int:
    """Give the task runs of `flow_run_id` that Prefect shows open (or Crashed, unless the
    run crashed) their steps' ends in `run`; how many it changed. Prefect 3 records
    task-run states from events, seconds late: one can arrive after :func:`settle` closed
    its flow run, so the node service calls this again for a while."""
    from uuid import UUID

    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        TaskRunFilter,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )

    open_types, wrong_types = _open_types()
    tasks = await client.read_task_runs(
        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)])),
        task_run_filter=TaskRunFilter(
            state=TaskRunFilterState(
                type=TaskRunFilterStateType(any_=open_types if run.crashed else wrong_types)
            )
        ),
    )
    for task_run in tasks:
        await client.set_task_run_state(task_run.id, _task_state(run, task_run.name), force=True)
    return len(tasks)


def _recorded() -> None:
    """The function of the stand-in task a missing task run is created for (never run)."""


async def add_missing_tasks(client: PrefectClient, flow_run_id: str, run: RunState) -> list[str]:
    """Create a task run, with its step's end, for each step of `run` that ended in the
    log and that Prefect has no task run of (it started while the server was down); the
    steps it created them for."""
    from uuid import UUID

    from prefect import Task
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    ours = FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)]))
    have: set[str] = set()
    seen = 0
    while True:  # the server answers at most a page at a time
        page = await client.read_task_runs(flow_run_filter=ours, offset=seen, limit=_BATCH)
        have.update(t.name for t in page)
        seen += len(page)
        if len(page) < _BATCH:
            break
    made = [name for name, step in run.steps.items() if step.done and name not in have]
    for name in made:
        stand_in = Task(fn=_recorded, name=name)
        created = await client.create_task_run(
            stand_in, UUID(flow_run_id), dynamic_key=f"m27-settled-{name}", name=name
        )
        await client.set_task_run_state(created.id, _task_state(run, name), force=True)
    return made


async def settle(
    client: PrefectClient,
    runs: Mapping[str, RunState],
    changed: list[str] | None = None,
    refused: dict[str, str] | None = None,
) -> list[str]:
    """Give each flow run in `runs` that Prefect still shows open the end the log
    recorded, and its open task runs their steps' ends; the flow run ids it changed,
    appended to `changed` as it goes: a pass that fails part way (a timeout from a server
    that has just restarted) still names those it may have changed, whose missing task
    runs are made later; the next pass sees them closed and would not name them.

    With `refused`, a flow run whose change Prefect answers with an error (deleted in its
    UI meanwhile, say) goes there with the error, and the pass goes on with the others:
    before, it ended the pass, every pass while the error lasted, and the runs after it
    stayed open in Prefect. A server that does not answer still ends the pass."""
    from uuid import UUID

    import httpx
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )

    _, wrong_types = _open_types()
    ids: list[UUID] = []
    for flow_run_id in runs:
        try:
            ids.append(UUID(flow_run_id))
        except ValueError:
            continue  # not a Prefect id (an old or hand-written log)
    changed = [] if changed is None else changed
    for first in range(0, len(ids), _BATCH):
        batch = ids[first : first + _BATCH]
        still_open = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=batch),
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=wrong_types)),
            ),
            limit=_BATCH,
        )
        for flow_run in still_open:
            run = runs[str(flow_run.id)]
            if run.crashed and flow_run.state is not None and flow_run.state.is_crashed():
                continue  # both say it crashed
            changed.append(str(flow_run.id))  # before: the set may land and its answer not
            try:
                await settle_tasks(client, str(flow_run.id), run)
                await client.set_flow_run_state(flow_run.id, _flow_state(run), force=True)
            except httpx.TransportError:
                raise
            except Exception as exc:
                if refused is None:
                    raise
                changed.remove(str(flow_run.id))  # Prefect answered: nothing was set
                refused[str(flow_run.id)] = f"{type(exc).__name__}: {one_line(exc)}"
    return changed
