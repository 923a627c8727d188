"""The Prefect worker type ``m27``: a ProcessWorker that pulls only what its node has room for.

One worker stands for one node (a GPU server, or a simulated one: ``M27_HOME`` and
``M27_GPUS`` say which). On each poll it:

1. closes the node's crashed runs (:mod:`m27.node.crash`): a flow run whose process died is
   Crashed in Prefect within one poll, and ``RunCrashed`` is in the log;
2. asks its node how many seats each tier has free (:func:`m27.lab.deploy.node_capacity`,
   from the node's event log and GPU count) and takes the waiting flow runs that fit,
   highest tier first (:func:`m27.lab.deploy.plan_admissions`); the rest stay in Prefect's
   queues for another node;
3. publishes the node's free seats as the Prefect variable ``m27-capacity-<node>`` and in
   ``$M27_HOME/capacity.json``.

A taken run is recorded as ``RunAdmitted`` once Prefect lets this worker have it (two
workers may see the same run; only the one whose Pending transition wins admits it), and
started like the ProcessWorker does, with the ``M27_*`` variables of its node and tier.

Cancelling from Prefect first asks the run through the node's log (``CancelRequested``),
so the flow stops its step processes and records ``RunCancelled``; only then does the
ProcessWorker's own cancellation kill what is left. When the flow-run process exits without
an end event (kill -9, OOM), the worker stops the orphaned steps and records the crash.

Registered for ``prefect worker start --type m27`` through the ``prefect.collections``
entry point (``m27 = "m27.lab.worker"``); ``m27 worker`` starts the same class.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import socket
import tempfile
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.to_thread
from prefect.flows import load_flow_from_flow_run
from prefect.runner._flow_run_executor import FlowRunExecutionResult, FlowRunExecutorContext
from prefect.runner._process_manager import ProcessHandle
from prefect.runner._starter_engine import EngineCommandStarter
from prefect.runner._workspace_starter import WorkspaceResolvingEngineCommandStarter
from prefect.workers.process import (
    ProcessJobConfiguration,
    ProcessWorker,
    ProcessWorkerResult,
)

from m27 import liveness, runids
from m27.config import load_settings, m27_home
from m27.events import CancelRequested, RunAdmitted
from m27.events.state import NodeState, fold
from m27.lab.deploy import Candidate, flow_root, node_capacity, plan_admissions, queue_tier
from m27.node import crash
from m27.store.sqlite import SqliteEventStore, open_store

if TYPE_CHECKING:
    from uuid import UUID

    from prefect.client.schemas.objects import FlowRun
    from prefect.client.schemas.responses import WorkerFlowRunResponse

#: How long a Prefect cancel waits for the flow to stop its steps before the process is killed.
CANCEL_GRACE_S = 20.0
#: A planned admission not confirmed within this long is forgotten (another node won it).
STARTING_TTL_S = 60.0


def node_name() -> str:
    return os.environ.get("M27_NODE") or socket.gethostname()


def capacity_variable(node: str) -> str:
    """The Prefect variable a node's free seats are published under."""
    return "m27-capacity-" + (re.sub(r"[^a-z0-9_-]+", "-", node.lower()).strip("-") or "node")


def gpu_count() -> int:
    from m27.gpu import detect

    backend = detect()
    try:
        return len(backend.devices())
    finally:
        backend.close()


class M27Worker(ProcessWorker):
    """ProcessWorker + node seats + M27 variables + crash truth (see the module docstring)."""

    type = "m27"
    _description = (
        "Runs m27 pipeline flow runs as subprocesses on a GPU node, taking a run only when "
        "the node has a free seat of the run's tier (immediate, ready, background)."
    )
    _display_name = "m27"
    _documentation_url = "https://github.com/m27/m27/blob/main/docs/scale.md"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.node = node_name()
        self.host = socket.gethostname()
        self.home = m27_home()
        self._store: SqliteEventStore | None = None
        self._state = NodeState()
        self._gpus: int | None = None
        self._cpu_slots = load_settings().cpu_slots
        #: run id -> (tier, planned at): planned this poll, not yet in the log as admitted.
        self._starting: dict[str, tuple[str, float]] = {}
        #: run ids whose flow-run process this worker is running (their end is ours to check).
        self._busy: set[str] = set()
        self._published: dict[str, Any] | None = None
        self._start_lock: anyio.Lock | None = None

    # --- the node -----------------------------------------------------------------------

    @property
    def store(self) -> SqliteEventStore:
        if self._store is None:
            self._store = open_store(self.home)
        return self._store

    def _refresh(self) -> NodeState:
        self._state = fold(self.store.read(after=self._state.last_seq), self._state)
        if self._gpus is None:
            self._gpus = gpu_count()
        return self._state

    def capacity(self) -> dict[str, int]:
        state = self._refresh()
        return node_capacity(state, self._gpus or 0, self._cpu_slots, self._starting_tiers())

    def _starting_tiers(self) -> dict[str, str]:
        now = time.monotonic()
        for run_id, (_tier, at) in list(self._starting.items()):
            if now - at > STARTING_TTL_S or run_id in self._state.admitted:
                self._starting.pop(run_id, None)
        return {run_id: tier for run_id, (tier, _at) in self._starting.items()}

    def m27_env(self, flow_run: FlowRun) -> dict[str, str]:
        """The M27 variables a flow run gets on this node."""
        env = {
            "M27_HOME": str(self.home),
            "M27_NODE": self.node,
            "M27_TIER": queue_tier(flow_run.work_queue_name, flow_run.tags),
            "M27_FLOW_RUN_ID": str(flow_run.id),
            "M27_RUN_ID": runids.from_flow_run(str(flow_run.id)),
            "M27_WORKER": self.name,
            "M27_FLOWS_DIR": str(flow_root()),
        }
        if os.environ.get("M27_GPUS"):
            env["M27_GPUS"] = os.environ["M27_GPUS"]
        return env

    # --- taking flow runs -----------------------------------------------------------------

    async def _get_scheduled_flow_runs(self) -> list[WorkerFlowRunResponse]:
        responses = await super()._get_scheduled_flow_runs()
        await crash.sweep(
            self.store,
            self.client,
            host=self.host,
            is_busy=lambda run_id: run_id in self._busy or run_id in self._starting,
            log=self._logger.warning,
        )
        await anyio.to_thread.run_sync(self._refresh)
        now = time.time()
        by_run: dict[str, WorkerFlowRunResponse] = {}
        candidates: list[Candidate] = []
        for resp in responses:
            fr = resp.flow_run
            start = fr.expected_start_time or fr.next_scheduled_start_time
            when = start.timestamp() if start is not None else now
            run_id = runids.from_flow_run(str(fr.id))
            if when > now + 0.5 or run_id in self._starting or run_id in self._busy:
                continue  # not due yet, or already ours
            by_run[run_id] = resp
            tier = queue_tier(fr.work_queue_name, fr.tags)
            candidates.append(Candidate(run_id, tier, when))
        starting = self._starting_tiers()
        plan = plan_admissions(candidates, self._state, self._gpus or 0, self._cpu_slots, starting)
        for cand in plan:
            self._starting[cand.run_id] = (cand.tier, time.monotonic())
        await self._publish()
        return [by_run[c.run_id] for c in plan]

    async def _submit_run(self, flow_run: FlowRun) -> None:
        # The base submits each taken run in its own task; one at a time, in the order they
        # were planned (tasks start FIFO, the lock is fair), the runs start in tier order.
        if self._start_lock is None:
            self._start_lock = anyio.Lock()
        async with self._start_lock:
            await super()._submit_run(flow_run)

    async def _propose_pending_state(self, flow_run: FlowRun) -> bool:
        ok = await super()._propose_pending_state(flow_run)
        run_id = runids.from_flow_run(str(flow_run.id))
        if not ok:
            self._starting.pop(run_id, None)
            return ok
        tier = queue_tier(flow_run.work_queue_name, flow_run.tags)
        admitted = RunAdmitted(
            at=time.time(),
            run_id=run_id,
            flow_run_id=str(flow_run.id),
            tier=tier,
            node=self.node,
            host=self.host,
            worker_pid=os.getpid(),
            worker_pid_started=liveness.own_start_time(),
        )
        await anyio.to_thread.run_sync(self.store.append, [admitted])
        self.get_flow_run_logger(flow_run).info(
            "m27: node %s admitted run %s on a %s seat", self.node, run_id, tier
        )
        return ok

    async def _publish(self) -> None:
        """Publish the node's free seats (only when they changed: one API call, not one a poll)."""
        room = node_capacity(self._state, self._gpus or 0, self._cpu_slots, self._starting_tiers())
        if self._published == room:
            return
        self._published = room
        value = {
            "node": self.node,
            "host": self.host,
            "gpus": self._gpus or 0,
            "cpu_slots": self._cpu_slots,
            "free": room,
            "at": time.time(),
        }
        await anyio.to_thread.run_sync(_write_json, self.home / "capacity.json", value)
        try:
            from prefect.variables import Variable

            await Variable.aset(capacity_variable(self.node), value, overwrite=True)
        except Exception as exc:  # publishing is advisory; taking runs must go on
            self._logger.warning("could not publish capacity: %s", exc)

    # --- running one flow run -------------------------------------------------------------

    async def run(
        self,
        flow_run: FlowRun,
        configuration: ProcessJobConfiguration,
        task_status: anyio.abc.TaskStatus[int] | None = None,
    ) -> ProcessWorkerResult:
        run_id = runids.from_flow_run(str(flow_run.id))
        self._busy.add(run_id)
        configuration.env.update(self.m27_env(flow_run))
        try:
            return await self._run_process(flow_run, configuration, task_status)
        finally:
            with anyio.CancelScope(shield=True):
                await self._after_exit(flow_run, run_id)
                self._busy.discard(run_id)

    async def _after_exit(self, flow_run: FlowRun, run_id: str) -> None:
        """The flow-run process is gone: if the log has no end for its run, close it."""
        state = await self.client.read_flow_run(flow_run.id)
        name = state.state.type.value if state.state is not None else ""
        cancelled = name in ("CANCELLING", "CANCELLED")
        reason = (
            "cancelled from Prefect"
            if cancelled
            else f"flow run process of {flow_run.id} exited without recording an end"
        )
        events = await anyio.to_thread.run_sync(
            lambda: crash.finalize(
                self.store, run_id, reason, outcome="cancelled" if cancelled else "crashed"
            )
        )
        if not events:
            return
        logger = self.get_flow_run_logger(flow_run)
        logger.error("m27: run %s %s: %s", run_id, "cancelled" if cancelled else "crashed", reason)
        if not cancelled:
            await crash.mark_prefect_crashed(self.client, str(flow_run.id), reason)

    async def _cancel_in_log(self, flow_run_id: UUID) -> None:
        """Ask the run to stop through the node's log and wait for it to record its end."""
        run_id = runids.from_flow_run(str(flow_run_id))
        store = self.store
        after = await anyio.to_thread.run_sync(store.last_seq)
        await anyio.to_thread.run_sync(
            store.append, [CancelRequested(at=time.time(), run_id=run_id, by="prefect")]
        )
        deadline = time.monotonic() + CANCEL_GRACE_S
        while time.monotonic() < deadline:
            state = await anyio.to_thread.run_sync(lambda: fold(store.read()))
            run = state.runs.get(run_id)
            if run is None or run.status != "running":
                return
            await anyio.to_thread.run_sync(functools.partial(store.follow, after, timeout=0.25))
            after = state.last_seq

    async def _run_process(
        self,
        flow_run: FlowRun,
        configuration: ProcessJobConfiguration,
        task_status: anyio.abc.TaskStatus[int] | None,
    ) -> ProcessWorkerResult:
        """ProcessWorker.run (Prefect 3.9.1), with the cancel hook of :meth:`_cancel_in_log`."""
        if task_status is None:
            task_status = anyio.TASK_STATUS_IGNORED
        working_dir_ctx = (
            tempfile.TemporaryDirectory(suffix="prefect")
            if not configuration.working_dir
            else contextlib.nullcontext(configuration.working_dir)
        )
        with working_dir_ctx as working_dir, warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            async with FlowRunExecutorContext() as ctx:
                self._hook_cancel(ctx)
                root = Path(working_dir).resolve()
                if configuration._command_configured:
                    starter: Any = EngineCommandStarter(
                        command=configuration.command,
                        cwd=root,
                        env=configuration.env,
                        stream_output=configuration.stream_output,
                        control_channel=ctx.control_channel,
                    )
                    executor = ctx.create_executor(
                        flow_run,
                        starter,
                        resolve_flow=load_flow_from_flow_run,
                        propose_submitting=False,
                    )
                else:
                    starter = WorkspaceResolvingEngineCommandStarter(
                        workspace_root=root,
                        command=None,
                        stream_output=configuration.stream_output,
                        control_channel=ctx.control_channel,
                        source_cwd=root,
                        environment=configuration.env,
                    )
                    ctx.call_after_exit(starter.close)
                    executor = ctx.create_executor(
                        flow_run,
                        starter,
                        propose_submitting=False,
                        hook_runner=starter.hook_runner,
                    )
                execution: FlowRunExecutionResult | None = None

                async def execute(
                    *, task_status: anyio.abc.TaskStatus[ProcessHandle] = anyio.TASK_STATUS_IGNORED
                ) -> None:
                    nonlocal execution
                    execution = await executor.submit(task_status=task_status)

                async with anyio.create_task_group() as group:
                    handle = await group.start(execute)
                    if handle.pid is None:
                        raise RuntimeError("Flow run process has no PID")
                    task_status.started(handle.pid)
        if execution is None or execution.status_code is None:
            raise RuntimeError("Failed to start flow run process.")
        return ProcessWorkerResult(
            status_code=execution.status_code, identifier=str(execution.handle.pid)
        )

    def _hook_cancel(self, ctx: FlowRunExecutorContext) -> None:
        manager = ctx._cancellation_manager
        prefect_cancel = manager.cancel_by_id

        async def cancel_by_id(flow_run_id: UUID) -> None:
            try:
                await self._cancel_in_log(flow_run_id)
            except Exception as exc:  # never block Prefect's own cancellation
                self._logger.warning("m27 cancel of %s failed: %s", flow_run_id, exc)
            await prefect_cancel(flow_run_id)

        manager.cancel_by_id = cancel_by_id  # type: ignore[method-assign]

    async def teardown(self, *exc_info: Any) -> None:
        await super().teardown(*exc_info)
        if self._store is not None:
            self._store.close()
            self._store = None


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=2))
    os.replace(tmp, path)
