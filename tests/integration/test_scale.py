"""A lab on one machine: Prefect on PostgreSQL, the m27 pool, two m27 workers for two nodes.

The two nodes have one simulated GPU and one CPU slot each. The module starts with both
nodes busy (a by-hand run holding the GPU as primary, a guest and the CPU slot, recorded in
each node's log), so what the workers take, and in which order, is decided by the seats.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from m27 import runids
from m27.cli.commands import deploy as deploy_cmd
from m27.cli.commands import pool as pool_cmd
from m27.events import (
    CancelRequested,
    Event,
    LeaseGranted,
    LeaseReleased,
    RunAdmitted,
    RunCancelled,
    RunCrashed,
    RunSubmitted,
    RunSucceeded,
    StepStarted,
)
from m27.events.state import fold
from m27.liveness import alive as pid_alive
from m27.store.sqlite import open_store
from tests.commands import cli
from tests.integration.conftest_scale import (
    SLEEPER,
    Lab,
    postgres_prefect,  # noqa: F401  (fixture)
    start_worker,
    stop_worker,
    sync_client,
    tail,
)
from tests.waiting import wait_until

pytestmark = [pytest.mark.service, pytest.mark.slow]


class Node:
    def __init__(self, name: str, home: Path) -> None:
        self.name, self.home = name, home
        self.blocker: subprocess.Popen[bytes] | None = None

    def append(self, *events: Event) -> None:
        store = open_store(self.home)
        try:
            store.append(list(events))
        finally:
            store.close()

    def state(self) -> Any:
        store = open_store(self.home)
        try:
            return fold(store.read())
        finally:
            store.close()

    def admitted(self) -> list[str]:
        store = open_store(self.home)
        try:
            return [r.event.run_id for r in store.read() if isinstance(r.event, RunAdmitted)]
        finally:
            store.close()

    def occupy(self) -> None:
        """A run started by hand holds the GPU (primary), a guest seat and the CPU slot."""
        self.blocker = subprocess.Popen(["sleep", "600"])
        now = time.time()
        self.append(
            RunSubmitted(
                at=now,
                run_id="blocker",
                pipeline="blocker",
                spec_path="",
                steps=("gpu", "guest", "cpu"),
                pid=self.blocker.pid,
                host=socket.gethostname(),
            ),
            LeaseGranted(at=now, run_id="blocker", step="gpu", gpus=(0,), tier="immediate"),
            LeaseGranted(at=now, run_id="blocker", step="guest", gpus=(0,), tier="guest"),
            LeaseGranted(at=now, run_id="blocker", step="cpu", gpus=(), tier="background"),
        )

    def release(self) -> None:
        now = time.time()
        self.append(
            *(LeaseReleased(at=now, run_id="blocker", step=s) for s in ("gpu", "guest", "cpu")),
            RunSucceeded(at=now, run_id="blocker", duration_s=1.0),
        )
        if self.blocker is not None:
            self.blocker.kill()
            self.blocker.wait()


@pytest.fixture(scope="module")
def lab(
    postgres_prefect: Lab,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("scale")
    spec = base / "sleeper.yaml"
    spec.write_text(SLEEPER)
    nodes = {n: Node(n, base / f"node-{n}") for n in ("a", "b")}
    for node in nodes.values():
        node.home.mkdir()
        node.occupy()
    with temporary_settings({PREFECT_API_URL: postgres_prefect.api_url}):
        assert cli(pool_cmd, ["pool", "init"]) == 0
        # Deployed first so its minute boundary passes while the other tests run.
        _deploy(
            {"spec": spec},
            "every-minute",
            "background",
            "--cron",
            "* * * * *",
            "--set",
            "SECONDS=0",
        )
        workers = [
            start_worker(postgres_prefect, "a", nodes["a"].home),
            start_worker(postgres_prefect, "b", nodes["b"].home, via_prefect_cli=True),
        ]
        try:
            yield {"lab": postgres_prefect, "spec": spec, "nodes": nodes, "base": base}
        finally:
            for w in workers:
                stop_worker(w)
            for node in nodes.values():
                if node.blocker is not None and node.blocker.poll() is None:
                    node.blocker.kill()
                    node.blocker.wait()


def _deploy(lab: dict[str, Any], name: str, tier: str, *extra: str) -> None:
    argv = ["deploy", str(lab["spec"]), "--name", name, "--tier", tier, *extra]
    assert cli(deploy_cmd, argv) == 0


def _run(client: Any, name: str) -> UUID:
    dep = client.read_deployment_by_name(f"m27-pipeline/{name}")
    return UUID(str(client.create_flow_run_from_deployment(dep.id).id))


def _state(client: Any, flow_run_id: UUID) -> str:
    fr = client.read_flow_run(flow_run_id)
    return fr.state.type.value if fr.state else ""


def _where(lab: dict[str, Any], flow_run_id: UUID) -> Node | None:
    run_id = runids.from_flow_run(str(flow_run_id))
    for node in lab["nodes"].values():
        if run_id in node.admitted():
            return node
    return None


def _free(lab: dict[str, Any]) -> None:
    """Release the nodes' blockers (the busy-nodes test releases them on its way), so a
    test that needs a free node passes alone (`-k`) as it does after that test."""
    for node in lab["nodes"].values():
        if node.blocker is not None and node.blocker.poll() is None:
            node.release()


def _debug(lab: dict[str, Any]) -> str:
    return "\n".join(
        f"--- worker {n.name}:\n{tail(n.home / 'worker.log')}" for n in lab["nodes"].values()
    )


def test_pool_init_makes_tier_queues_and_is_idempotent(lab: dict[str, Any]) -> None:
    assert cli(pool_cmd, ["pool", "init"]) == 0  # second time: nothing changes
    with sync_client(lab["lab"]) as client:
        pool = client.read_work_pool("m27")
        queues = {q.name: q.priority for q in client.read_work_queues(work_pool_name="m27")}
    assert pool.type == "m27"
    assert {k: v for k, v in queues.items() if k != "default"} == {
        "immediate": 1,
        "ready": 2,
        "background": 3,
    }


def test_busy_nodes_take_nothing_then_start_waiting_runs_in_tier_order(
    lab: dict[str, Any],
) -> None:
    for tier in ("background", "ready", "immediate"):
        _deploy(lab, f"t-{tier}", tier, "--set", "SECONDS=0.2")
    with sync_client(lab["lab"]) as client:
        # Queued lowest tier first, while both nodes are busy.
        runs = {tier: _run(client, f"t-{tier}") for tier in ("background", "ready", "immediate")}
        # Ordered, not timed: both workers saw every run due and left it waiting.
        for node in lab["nodes"].values():
            for tier, fr in runs.items():
                line = f"m27: run {runids.from_flow_run(str(fr))} ({tier}) waits"
                wait_until(
                    lambda node=node, line=line: line in tail(node.home / "worker.log", 10**6),
                    timeout=60,
                    interval=0.3,
                    what=f"worker {node.name} to leave the {tier} run waiting\n{_debug(lab)}",
                )
        assert {t: _state(client, r) for t, r in runs.items()} == dict.fromkeys(runs, "SCHEDULED")
        a, b = lab["nodes"]["a"], lab["nodes"]["b"]
        a.release()
        for tier, fr in runs.items():
            wait_until(
                lambda fr=fr: _state(client, fr) == "COMPLETED",
                timeout=120,
                interval=0.3,
                what=f"{tier} run to complete\n{_debug(lab)}",
            )
    ids = {runids.from_flow_run(str(fr)): tier for tier, fr in runs.items()}
    order = [ids[r] for r in a.admitted() if r in ids]
    assert order == ["immediate", "ready", "background"]
    assert not set(ids) & set(b.admitted())
    assert all(a.state().runs[r].status == "succeeded" for r in ids)
    b.release()


def test_a_variable_without_a_value_is_asked_of_each_run_by_name(
    lab: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`vars: {SECONDS:}` declares a variable each run must give: the deployment's run form
    asks for it by name (required), shows the others with the value a run gets, and a run
    that gives it in its overrides runs with it."""
    spec = tmp_path / "each.yaml"
    spec.write_text(
        "name: each-run\nvars:\n  SECONDS:\n  LABEL: plain\n"
        "pipeline:\n  - name: work\n    type: cpu\n"
        "    command: sh -c 'sleep {{SECONDS}}; echo {{LABEL}}'\n"
    )
    _free(lab)
    assert (
        cli(
            deploy_cmd,
            ["deploy", str(spec), "--name", "each", "--tier", "immediate", "--set", "LABEL=given"],
        )
        == 0
    )
    said = capsys.readouterr().out
    assert "each run gives SECONDS in its overrides" in said
    assert """--params '{"overrides": {"LABEL": "given", "SECONDS": "..."}}'""" in said
    with sync_client(lab["lab"]) as client:
        dep = client.read_deployment_by_name("m27-pipeline/each")
        overrides = dep.parameter_openapi_schema["properties"]["overrides"]
        assert overrides["required"] == ["SECONDS"]
        assert overrides["properties"]["LABEL"]["default"] == "given"
        assert "default" not in overrides["properties"]["SECONDS"]
        assert dep.parameters["overrides"] == {"LABEL": "given"}
        fr = client.create_flow_run_from_deployment(
            dep.id, parameters={"overrides": {"SECONDS": "0", "LABEL": "given"}}
        ).id
        wait_until(
            lambda: _state(client, fr) == "COMPLETED",
            timeout=120,
            interval=0.3,
            what=f"the run that gave SECONDS to complete\n{_debug(lab)}",
        )
        client.delete_deployment(dep.id)
    node = _where(lab, fr)
    assert node is not None
    run_id = runids.from_flow_run(str(fr))
    assert node.state().runs[run_id].status == "succeeded"
    (started,) = [e for e in _events(node) if isinstance(e, StepStarted) and e.run_id == run_id]
    assert started.command[-1] == "sleep 0; echo given"


def test_worker_publishes_its_node_capacity(lab: dict[str, Any]) -> None:
    from prefect.variables import Variable

    value = wait_until(
        lambda: Variable.get("m27-capacity-a"), timeout=120, interval=0.3, what="capacity of node a"
    )
    assert value["node"] == "a" and value["gpus"] == 1 and value["cpu_slots"] == 1
    assert set(value["free"]) == {"immediate", "ready", "background"}
    local = (lab["nodes"]["a"].home / "capacity.json").read_text()
    assert '"free"' in local


def _started_step(lab: dict[str, Any], fr: UUID) -> tuple[Node, int, int]:
    run_id = runids.from_flow_run(str(fr))

    def probe() -> tuple[Node, int, int] | None:
        node = _where(lab, fr)
        if node is None:
            return None
        run = node.state().runs.get(run_id)
        if run is None or run.steps["work"].status != "running":
            return None
        return node, run.pid, int(run.steps["work"].pid or 0)

    return wait_until(
        probe, timeout=90, interval=0.3, what=f"step of {run_id} to start\n{_debug(lab)}"
    )


def test_kill_9_of_a_flow_run_process_ends_crashed_in_prefect_and_the_log(
    lab: dict[str, Any],
) -> None:
    _free(lab)
    _deploy(lab, "long-crash", "immediate", "--set", "SECONDS=300")
    with sync_client(lab["lab"]) as client:
        fr = _run(client, "long-crash")
        node, flow_pid, step_pid = _started_step(lab, fr)
        os.kill(flow_pid, signal.SIGKILL)
        wait_until(
            lambda: _state(client, fr) == "CRASHED",
            timeout=120,
            interval=0.3,
            what="Crashed in Prefect",
        )
    run_id = runids.from_flow_run(str(fr))
    wait_until(
        lambda: any(isinstance(r, RunCrashed) and r.run_id == run_id for r in _events(node)),
        timeout=60,  # recorded once the runner's context has closed: seconds on a busy box
        interval=0.3,
        what="RunCrashed in the node's log",
    )
    wait_until(
        lambda: not pid_alive(step_pid), timeout=15, interval=0.3, what="the orphaned step to stop"
    )
    assert node.state().runs[run_id].status == "failed"


def test_a_failed_deployed_run_logs_no_engine_traceback(lab: dict[str, Any]) -> None:
    """A run whose step fails ends Failed; Prefect's engine then logged `Engine execution
    exited with unexpected exception` and a 40-line FailedRun traceback, in the worker's
    output and in the UI's log of the run, after the line that already said why."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    _free(lab)
    _deploy(lab, "fails", "immediate", "--set", "SECONDS=nope")  # `sleep nope` exits 1
    with sync_client(lab["lab"]) as client:
        fr = _run(client, "fails")
        wait_until(
            lambda: _state(client, fr) == "FAILED",
            timeout=90,
            interval=0.3,
            what=f"the run to fail\n{_debug(lab)}",
        )

        def logs() -> list[str] | None:
            found = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[fr])))
            texts = [log.message for log in found]
            return texts if any("Finished in state Failed" in t for t in texts) else None

        texts = wait_until(logs, timeout=120, interval=0.5, what="the run's end in its logs")
    assert not any("Engine execution exited" in t or "Traceback" in t for t in texts), texts
    # where the step ran is in its task run's log, not only in m27's own log
    assert any(t.startswith("started (attempt 1, pid ") and ", CPU)" in t for t in texts), texts
    node = _where(lab, fr)
    assert node is not None
    assert "Engine execution exited" not in (node.home / "worker.log").read_text(errors="replace")


def test_cancelling_from_prefect_stops_the_step_processes(lab: dict[str, Any]) -> None:
    from prefect.states import Cancelling

    _free(lab)
    _deploy(lab, "long-cancel", "immediate", "--set", "SECONDS=300")
    with sync_client(lab["lab"]) as client:
        fr = _run(client, "long-cancel")
        node, _flow_pid, step_pid = _started_step(lab, fr)
        client.set_flow_run_state(fr, Cancelling(), force=True)
        wait_until(
            lambda: _state(client, fr) == "CANCELLED",
            timeout=60,
            interval=0.3,
            what=f"Cancelled in Prefect\n{_debug(lab)}",
        )
    wait_until(
        lambda: not pid_alive(step_pid), timeout=15, interval=0.3, what="the step process to stop"
    )
    run_id = runids.from_flow_run(str(fr))
    events = [e for e in _events(node) if getattr(e, "run_id", None) == run_id]
    # The cancel hook's path, not the fallback's: only the hook (M27Worker.before_cancel)
    # asks through the log, as "prefect", and the flow so asked records its own end; had
    # Prefect killed the flow first, the worker's crash.finalize would have ended the run
    # "cancelled from Prefect" with no request before it.
    asked = [
        i for i, e in enumerate(events) if isinstance(e, CancelRequested) and e.by == "prefect"
    ]
    ended = [(i, e.reason) for i, e in enumerate(events) if isinstance(e, RunCancelled)]
    assert asked, f"no CancelRequested by prefect: the cancel hook did not run\n{events}"
    assert [reason for _i, reason in ended] == ["cancel requested"], ended
    assert asked[0] < ended[0][0]
    assert node.state().runs[run_id].steps["work"].status == "cancelled"


def test_a_cron_schedule_fires_and_a_worker_runs_it(lab: dict[str, Any]) -> None:
    _free(lab)
    with sync_client(lab["lab"]) as client:
        dep = client.read_deployment_by_name("m27-pipeline/every-minute")
        from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

        def completed() -> bool:
            runs = client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id]))
            )
            return any(r.auto_scheduled and r.state and r.state.is_completed() for r in runs)

        try:
            wait_until(
                completed,
                timeout=150,
                interval=1.0,
                what=f"a scheduled run to complete\n{_debug(lab)}",
            )
        finally:
            client.delete_deployment(dep.id)


def _events(node: Node) -> list[Event]:
    store = open_store(node.home)
    try:
        return [r.event for r in store.read()]
    finally:
        store.close()
