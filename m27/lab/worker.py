"""The Prefect worker type ``m27``: a ProcessWorker that pulls only what its node has room for.

One worker stands for one node (a GPU server, or a simulated one: ``M27_HOME`` and
``M27_GPUS`` say which). On each poll it:

1. closes the node's crashed runs (:mod:`m27.node.crash`): a flow run whose process died is
   Crashed in Prefect within one poll, and ``RunCrashed`` is in the log;
2. asks its node how many seats each tier has free (:func:`m27.lab.capacity.node_capacity`,
   from the node's event log and GPU count) and takes the waiting flow runs that fit,
   highest tier first (:func:`m27.lab.capacity.plan_admissions`); the rest stay in Prefect's
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

What Prefect offers no public hook for (which runs to take, the Pending answer, the cancel
hook) comes from :class:`m27.lab._prefect.HookedProcessWorker`, the one place m27 touches
Prefect internals.

Registered for ``prefect worker start --type m27`` through the ``prefect.collections``
entry point (``m27 = "m27.lab.worker"``); ``m27 worker`` starts the same class.
"""

from __future__ import annotations

import functools
import json
import os
import re
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
from prefect.workers.process import ProcessJobConfiguration

from m27 import liveness, runids
from m27.config import load_settings, m27_home
from m27.events import CancelRequested, RunAdmitted
from m27.events.state import NodeState, fold
from m27.lab._prefect import HookedProcessWorker
from m27.lab.capacity import Candidate, node_capacity, plan_admissions, queue_tier
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


def flow_root() -> Path:
    """The folder that holds ``flows/pipeline.py`` (the repository, or site-packages)."""
    import flows

    return Path(next(iter(flows.__path__))).resolve().parent


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


class M27Worker(HookedProcessWorker):
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
        #: due run ids this worker said it leaves waiting (told once per run, not per poll).
        self._told_waiting: set[str] = set()

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

    async def take(self, offered: list[WorkerFlowRunResponse]) -> list[WorkerFlowRunResponse]:
        """Close crashed runs, then plan which offered runs fit the node's free seats."""
        await crash.sweep(
            self.store,
            self.client,
            host=self.host,
            is_busy=lambda run_id: run_id in self._busy or run_id in self._starting,
            log=self.logger.warning,
        )
        await anyio.to_thread.run_sync(self._refresh)
        now = time.time()
        by_run: dict[str, WorkerFlowRunResponse] = {}
        candidates: list[Candidate] = []
        for resp in offered:
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
        self._tell_waiting(candidates, {c.run_id for c in plan})
        await self._publish()
        return [by_run[c.run_id] for c in plan]

    def _tell_waiting(self, candidates: list[Candidate], planned: set[str]) -> None:
        """Log once per run that a due run stays in Prefect's queue (no free seat of its
        tier here): why a run does not start is then in the worker's log, and tests wait
        for this line instead of sleeping through polls."""
        due = {c.run_id for c in candidates}
        self._told_waiting &= due
        for cand in candidates:
            if cand.run_id not in planned and cand.run_id not in self._told_waiting:
                self._told_waiting.add(cand.run_id)
                self.logger.info(
                    "m27: run %s (%s) waits: no free %s seat on node %s",
                    cand.run_id,
                    cand.tier,
                    cand.tier,
                    self.node,
                )

    async def refused(self, flow_run: FlowRun) -> None:
        self._starting.pop(runids.from_flow_run(str(flow_run.id)), None)

    async def admitted(self, flow_run: FlowRun) -> None:
        """Prefect let this node have the run: record ``RunAdmitted`` (it now holds a seat)."""
        run_id = runids.from_flow_run(str(flow_run.id))
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
            self.logger.warning("could not publish capacity: %s", exc)

    # --- running one flow run -------------------------------------------------------------

    async def starting(self, flow_run: FlowRun, configuration: ProcessJobConfiguration) -> None:
        self._busy.add(runids.from_flow_run(str(flow_run.id)))
        configuration.env.update(self.m27_env(flow_run))

    async def exited(self, flow_run: FlowRun) -> None:
        run_id = runids.from_flow_run(str(flow_run.id))
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

    async def before_cancel(self, flow_run_id: UUID) -> None:
        """Ask the run to stop through the node's log and wait for it to record its end."""
        run_id = runids.from_flow_run(str(flow_run_id))
        store = self.store
        await anyio.to_thread.run_sync(
            store.append, [CancelRequested(at=time.time(), run_id=run_id, by="prefect")]
        )
        deadline = time.monotonic() + CANCEL_GRACE_S
        while time.monotonic() < deadline:
            # The log's end first, then the run's own events (its status, without folding
            # the node's whole history): whatever comes after is waited for below.
            after = await anyio.to_thread.run_sync(store.last_seq)
            state = await anyio.to_thread.run_sync(lambda: fold(store.read_runs((run_id,))))
            run = state.runs.get(run_id)
            if run is None or run.status != "running":
                return
            await anyio.to_thread.run_sync(functools.partial(store.follow, after, timeout=0.25))

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
