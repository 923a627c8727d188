"""A task run whose state reaches Prefect after the node service settled its flow run
(Prefect 3 records task-run states from events, seconds late) gets its step's end too: the
service checks a settled flow run's task runs again for a while. Before, it stayed
Running in Prefect's UI under a flow run that had Failed."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from m27 import events as ev
from m27.node.serve import _Watcher
from m27.store.sqlite import open_store

pytestmark = pytest.mark.service


def _prefect(url: str, work: Any) -> Any:
    """`work(client)` against the session's server (Prefect keeps the settings of its first
    import, so they are given here, not only through the environment)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    async def main() -> Any:
        async with get_client() as client:
            return await work(client)

    with temporary_settings(updates={PREFECT_API_URL: url}):
        return asyncio.run(main())


def _in_prefect(url: str, call: Any) -> Any:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: url}):
        return call()


async def _open_flow_run(client: Any) -> str:
    from prefect import flow
    from prefect.states import Running

    @flow(name="m27-settle-late")
    def stand_in() -> None:
        """Only its name: the flow run is made here, not run."""

    flow_run = await client.create_flow_run(stand_in, state=Running())
    return str(flow_run.id)


def _running_task(flow_run_id: str, name: str) -> Any:
    async def create(client: Any) -> None:
        from uuid import UUID

        from prefect import task
        from prefect.states import Running

        @task(name=name)
        def stand_in() -> None:
            """Only its name."""

        await client.create_task_run(
            stand_in, UUID(flow_run_id), dynamic_key=name, name=name, state=Running()
        )

    return create


def _task_states(flow_run_id: str) -> Any:
    async def read(client: Any) -> dict[str, tuple[str, str]]:
        from uuid import UUID

        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

        runs = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)]))
        )
        return {r.name: (r.state.type.value, r.state.message or "") for r in runs}

    return read


def _task_names(flow_run_id: str) -> Any:
    async def read(client: Any) -> list[str]:
        from uuid import UUID

        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

        runs = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)]))
        )
        return [r.name for r in runs]

    return read


def test_a_task_run_that_reaches_prefect_after_the_settle_gets_its_step_s_end(
    prefect_env: str, m27_home: Path
) -> None:
    url = prefect_env
    flow_run_id = _prefect(url, _open_flow_run)
    _prefect(url, _running_task(flow_run_id, "md"))
    store = open_store(m27_home)
    store.append(
        [  # ended while Prefect could not be told; its process (none recorded) is gone
            ev.RunSubmitted(1.0, "r1", "p", "p.yaml", ("md", "em", "gone"),
                            flow_run_id=flow_run_id, host=socket.gethostname()),
            ev.StepSucceeded(1.1, "r1", "md", 1, 0.1),
            ev.StepFailed(1.2, "r1", "em", 1, 0.1, "exited with code 3", exit_code=3),
            # started while Prefect was down: it never gets a task run of its own
            ev.StepCancelled(1.25, "r1", "gone", "step cancelled before the step started"),
            ev.RunFailed(1.3, "r1", 0.3, ("em",), "step em failed"),
        ]
    )  # fmt: skip
    store.close()
    lines: list[str] = []
    watcher = _Watcher(m27_home, lines.append, threading.Event())
    _in_prefect(url, watcher.step)  # settles: the flow run Failed, md Completed
    assert any("flow run of r1 was open or Crashed in Prefect" in line for line in lines)
    assert _prefect(url, _task_states(flow_run_id)) == {"md": ("COMPLETED", "")}
    _prefect(url, _running_task(flow_run_id, "em"))  # em's state arrives late
    watcher.recheck_at = 0.0  # the next recheck is due (not waited for)
    _in_prefect(url, watcher.step)
    assert _prefect(url, _task_states(flow_run_id)) == {
        "md": ("COMPLETED", ""),
        "em": ("FAILED", "exited with code 3"),
    }
    # a while after the settle, the step Prefect never heard of gets a task run with its
    # end; those that did reach it (late or not) are not made twice
    ((due, _),) = watcher.missing.values()
    assert due > time.time()
    watcher.missing[flow_run_id] = (0.0, watcher.missing[flow_run_id][1])
    watcher.recheck_at = 0.0
    _in_prefect(url, watcher.step)
    assert sorted(_prefect(url, _task_names(flow_run_id))) == ["em", "gone", "md"]
    assert _prefect(url, _task_states(flow_run_id))["gone"] == (
        "CANCELLED",
        "step cancelled before the step started",
    )
    assert any("Prefect had no task run of gone" in line for line in lines), lines
    assert not watcher.missing
    watcher.store.close()


def _delete_flow_run(flow_run_id: str) -> Any:
    async def delete(client: Any) -> None:
        from uuid import UUID

        await client.delete_flow_run(UUID(flow_run_id))

    return delete


def test_a_flow_run_deleted_from_prefect_does_not_hold_up_the_others(
    prefect_env: str, m27_home: Path
) -> None:
    """A user deleted a settled run's flow run in Prefect's UI: its missing task runs can
    never be made. Before, the failure ended every pass before the runs after it, and
    their steps never got task runs (nor a crashed run its task runs' ends)."""
    url = prefect_env
    gone, kept = _prefect(url, _open_flow_run), _prefect(url, _open_flow_run)
    store = open_store(m27_home)
    for run_id, flow_run_id in (("r-gone", gone), ("r-kept", kept)):
        store.append(
            [  # both ended while Prefect could not be told; `late` started then
                ev.RunSubmitted(1.0, run_id, "p", "p.yaml", ("late",),
                                flow_run_id=flow_run_id, host=socket.gethostname()),
                ev.StepSucceeded(1.1, run_id, "late", 1, 0.1),
                ev.RunSucceeded(1.2, run_id, 0.2),
            ]
        )  # fmt: skip
    store.close()
    lines: list[str] = []
    watcher = _Watcher(m27_home, lines.append, threading.Event())
    _in_prefect(url, watcher.step)  # settles both
    assert set(watcher.missing) == {gone, kept}
    _prefect(url, _delete_flow_run(gone))
    for flow_run_id in (gone, kept):  # in the order they were settled; both due now
        watcher.missing[flow_run_id] = (0.0, watcher.missing[flow_run_id][1])
    watcher.recheck_at = 0.0
    _in_prefect(url, watcher.step)
    assert _prefect(url, _task_states(kept)) == {"late": ("COMPLETED", "")}
    assert any(f"flow run {gone} of r-gone is gone from Prefect" in line for line in lines), lines
    assert not watcher.missing  # the deleted one is not retried for ever
    watcher.store.close()


def _flow_state(flow_run_id: str) -> Any:
    async def read(client: Any) -> str:
        from uuid import UUID

        flow_run = await client.read_flow_run(UUID(flow_run_id))
        return str(flow_run.state.type.value)

    return read


def test_a_crashed_run_is_marked_beside_one_whose_id_prefect_cannot_take(
    prefect_env: str, m27_home: Path
) -> None:
    """A run of a hand-written (or very old) log whose flow run id is not a Prefect id
    failed every pass for a minute: other crashed runs were not marked meanwhile."""
    url = prefect_env
    real = _prefect(url, _open_flow_run)
    _prefect(url, _running_task(real, "md"))
    lines: list[str] = []
    watcher = _Watcher(m27_home, lines.append, threading.Event())
    watcher.unmarked = {"flow-7": "crashed: its process is gone", real: "crashed: gone too"}
    _in_prefect(url, watcher.step)
    assert _prefect(url, _flow_state(real)) == "CRASHED"
    assert _prefect(url, _task_states(real)) == {"md": ("CRASHED", "crashed: gone too")}
    assert list(watcher.recheck) == [real]  # the other is not asked about again
    assert not watcher.unmarked
    watcher.store.close()


class _DeletesFirst:
    """The real client, but the first flow run the settle pass reads as still open is
    deleted right after the read, as a user deleting it in Prefect's UI meanwhile:
    Prefect then answers its change with ObjectNotFound."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.deleted: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    async def read_flow_runs(self, **kw: Any) -> Any:
        found = await self.client.read_flow_runs(**kw)
        if found and not self.deleted:
            await self.client.delete_flow_run(found[0].id)
            self.deleted.append(str(found[0].id))
        return found


def test_a_flow_run_prefect_refuses_mid_pass_does_not_keep_the_others_open(
    prefect_env: str, m27_home: Path
) -> None:
    """Before, the refusal ended the pass: the runs after it stayed Running in Prefect
    until a later pass, or for ever while the refusal lasted."""
    from m27.events.state import fold
    from m27.node.settle import settle

    url = prefect_env
    ids = [_prefect(url, _open_flow_run) for _ in range(3)]
    state = fold(
        [
            e
            for n, flow_run_id in enumerate(ids)
            for e in (
                ev.RunSubmitted(1.0, f"r{n}", "p", "p.yaml", ("a",), flow_run_id=flow_run_id),
                ev.StepSucceeded(1.1, f"r{n}", "a", 1, 0.1),
                ev.RunSucceeded(1.2, f"r{n}", 0.2),
            )
        ]
    )
    runs = {r.flow_run_id: r for r in state.runs.values() if r.flow_run_id}
    changed: list[str] = []
    refused: dict[str, str] = {}

    async def pass_(client: Any) -> list[str]:
        wrapped: Any = _DeletesFirst(client)  # a PrefectClient, to settle()
        done = await settle(wrapped, runs, changed, refused)
        assert len(wrapped.deleted) == 1
        return done

    _prefect(url, pass_)
    (gone,) = refused
    assert refused[gone].startswith("ObjectNotFound"), refused
    kept = [i for i in ids if i != gone]
    assert sorted(changed) == sorted(kept)
    assert [_prefect(url, _flow_state(i)) for i in kept] == ["COMPLETED", "COMPLETED"]


def test_the_service_says_a_refused_flow_run_and_asks_again_next_pass(
    prefect_env: str, m27_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node service's pass: the refusal is said on its log, the other runs count as
    settled, and the refused one is asked about again next pass (gone then: settled)."""
    import m27.node.serve as serve
    from m27.node.settle import settle

    url = prefect_env
    ids = [_prefect(url, _open_flow_run) for _ in range(2)]
    store = open_store(m27_home)
    for n, flow_run_id in enumerate(ids):
        store.append(
            [
                ev.RunSubmitted(1.0, f"r{n}", "p", "p.yaml", ("a",),
                                flow_run_id=flow_run_id, host=socket.gethostname()),
                ev.StepSucceeded(1.1, f"r{n}", "a", 1, 0.1),
                ev.RunSucceeded(1.2, f"r{n}", 0.2),
            ]
        )  # fmt: skip
    store.close()
    deleted: list[str] = []

    async def deleting_settle(client: Any, *args: Any) -> list[str]:
        wrapped = _DeletesFirst(client)
        wrapped.deleted = deleted  # once in the test, not once a pass
        return await settle(wrapped, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(serve, "settle", deleting_settle)
    lines: list[str] = []
    watcher = _Watcher(m27_home, lines.append, threading.Event())
    _in_prefect(url, watcher.step)
    (gone,) = deleted
    (kept,) = [i for i in ids if i != gone]
    assert any(f"Prefect refused flow run {gone}: ObjectNotFound" in line for line in lines), lines
    assert watcher.settled == {kept}
    assert _prefect(url, _flow_state(kept)) == "COMPLETED"
    watcher.settle_at = 0.0
    _in_prefect(url, watcher.step)
    assert watcher.settled == {kept, gone}  # asked again: deleted, nothing left to change
    watcher.store.close()
