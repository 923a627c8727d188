"""Crash truth: a run whose process died is recorded as crashed, here and in Prefect.

Prefect 3.9 (OSS) has no zombie detection: a flow run whose process is killed -9 outside a
worker stays Running forever. m27 knows better from its own log: every ``RunSubmitted``
carries the flow process's pid and host. A run that is still ``running`` in the log while
that pid is gone has crashed. :func:`sweep` finds such runs on this host and
:func:`finalize` closes each one:

1. stops the steps it left behind (their own process groups survive the flow process, and
   a GPU job nobody supervises would hold a GPU the lease already handed on): SIGTERM to the
   group, SIGKILL after `grace_s`;
2. appends ``StepFailed`` for those steps, ``StepCancelled`` for steps still asking for a
   lease, ``LeaseReleased`` for leases the run held, then ``RunCrashed``;
3. sets the Prefect flow run to ``Crashed`` (forced) unless it already reached a final state.

Who calls it: the m27 worker on every poll, and when a flow-run process it started exits
without an end event; the node agent may call :func:`sweep` on its own ticks too (it is
idempotent: a run already ended is left alone, so two callers at once append at most a
duplicate ``RunCrashed`` that the projection ignores).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeVar

from m27 import liveness
from m27.clock import Clock, SystemClock
from m27.events import (
    Event,
    LeaseReleased,
    RunCancelled,
    RunCrashed,
    StepCancelled,
    StepFailed,
)
from m27.events.state import NodeState, StepState, fold
from m27.store import EventStore

if TYPE_CHECKING:
    from prefect.client.orchestration import PrefectClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Finding:
    """A run found dead: its id, its Prefect flow run (if any) and why."""

    run_id: str
    flow_run_id: str | None
    reason: str


def dead_runs(
    state: NodeState,
    host: str | None = None,
    is_alive: Callable[[int, float | None], bool] = liveness.alive,
    is_busy: Callable[[str], bool] = lambda _run_id: False,
) -> list[Finding]:
    """Runs of this host that the log says are running (or admitted) but whose process is gone.

    `is_alive(pid, started)` gets the recorded start time too (None in older logs), so a
    stranger that reuses a dead flow process's pid does not keep its run "running".
    `is_busy(run_id)` lets a worker exclude runs it is still starting or finishing itself.
    """
    host = host or socket.gethostname()
    found: list[Finding] = []
    for run in state.runs.values():
        if run.status != "running" or run.host != host or not run.pid or is_busy(run.run_id):
            continue
        if not is_alive(run.pid, run.pid_started):
            why = f"flow run process {run.pid} on {host} died without recording an end"
            found.append(Finding(run.run_id, run.flow_run_id, why))
    for run_id, adm in state.admitted.items():
        if run_id in state.runs or adm.host != host or not adm.worker_pid or is_busy(run_id):
            continue
        if not is_alive(adm.worker_pid, adm.worker_pid_started):
            why = f"worker {adm.worker_pid} died before flow run {adm.flow_run_id} started"
            found.append(Finding(run_id, adm.flow_run_id, why))
    return found


def _stop_group(pgid: int, pid: int, grace_s: float, clock: Clock) -> int | None:
    """SIGTERM the group, SIGKILL it after `grace_s`; the last signal sent, or None."""
    sent: int | None = None
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
            sent = sig
        except ProcessLookupError:
            return sent
        except PermissionError:
            return sent
        deadline = clock.monotonic() + grace_s
        while clock.monotonic() < deadline and liveness.alive(pid):
            clock.sleep(0.05)
        if not liveness.alive(pid):
            return sent
    return sent


def finalize(
    store: EventStore,
    run_id: str,
    reason: str,
    *,
    outcome: Literal["crashed", "cancelled"] = "crashed",
    clock: Clock | None = None,
    grace_s: float = 3.0,
    stop: Callable[[int, int, float, Clock], int | None] = _stop_group,
    cancel_job: Callable[[str, str], None] | None = None,
) -> list[Event]:
    """Close a run whose process is gone; returns the events appended (none if it had ended).

    `outcome="cancelled"` is for a run cancelled (from Prefect, or ``m27 cancel``) whose
    flow process died before it could stop its steps: the same cleanup, ending in
    ``RunCancelled``. A step running as a Slurm job is stopped with `cancel_job(job id,
    SLURM_CONF it was submitted with)` (``scancel``; :func:`m27.executors.slurm.cancel_job`
    by default).
    """
    clock = clock or SystemClock()
    state = fold(store.read_runs((run_id,)))  # exact for the run: its own events
    run = state.runs.get(run_id)
    if run is None:
        if run_id not in state.admitted:
            return []
        out: list[Event] = [RunCrashed(at=clock.now(), run_id=run_id, reason=reason)]
        store.append(out)
        return out
    if run.status != "running":
        return []
    out = []
    for step in run.steps.values():
        if step.status == "running":
            sig = _stop_step(step, grace_s, clock, stop, cancel_job)
            now = clock.now()
            if outcome == "cancelled":
                out.append(StepCancelled(at=now, run_id=run_id, step=step.name, reason=reason))
            else:
                out.append(
                    StepFailed(
                        at=now,
                        run_id=run_id,
                        step=step.name,
                        attempt=max(1, step.attempts),
                        duration_s=max(0.0, now - (step.started_at or now)),
                        reason=f"run crashed: {reason}",
                        signal=sig,
                        log_tail=step.log_tail,
                    )
                )
        elif (run_id, step.name) in state.requests:
            out.append(StepCancelled(at=clock.now(), run_id=run_id, step=step.name, reason=reason))
    for (lease_run, step_name), gpus in state.leases.items():
        if lease_run == run_id:
            out.append(LeaseReleased(at=clock.now(), run_id=run_id, step=step_name, gpus=gpus))
    if outcome == "cancelled":
        out.append(RunCancelled(at=clock.now(), run_id=run_id, reason=reason))
    else:
        out.append(RunCrashed(at=clock.now(), run_id=run_id, reason=reason))
    store.append(out)
    return out


def _stop_step(
    step: StepState,
    grace_s: float,
    clock: Clock,
    stop: Callable[[int, int, float, Clock], int | None],
    cancel_job: Callable[[str, str], None] | None,
) -> int | None:
    """Stop what a dead run left of `step`: its Slurm job, or its process group; the last
    signal sent to the group. A step with neither (pid 0: a Slurm step) is never sent a
    signal: ``killpg(0)`` would hit the caller's own process group."""
    if step.slurm_job_id:
        if cancel_job is None:
            from m27.executors import slurm

            cancel_job = slurm.cancel_job
        try:
            cancel_job(step.slurm_job_id, step.slurm_conf)
        except Exception as exc:  # best effort: the job may have ended on its own
            log.warning("could not cancel Slurm job %s: %s", step.slurm_job_id, exc)
        return None
    target = step.pgid or step.pid
    if not target:
        return None
    return stop(target, step.pid or 0, grace_s, clock)


T = TypeVar("T")


def with_prefect(work: Callable[[PrefectClient], Awaitable[T]]) -> T:
    """Run `work` with a Prefect client of ``PREFECT_API_URL`` and return its result
    (blocking): how the node service and `m27 cancel` reach Prefect."""
    import asyncio

    from prefect.client.orchestration import get_client

    async def main() -> T:
        async with get_client() as client:
            return await work(client)

    return asyncio.run(main())


async def mark_prefect_crashed(client: PrefectClient, flow_run_id: str, message: str) -> bool:
    """Set the flow run to Crashed unless it is already final; True when it was set."""
    from uuid import UUID

    from prefect.exceptions import ObjectNotFound
    from prefect.states import Crashed

    try:
        flow_run = await client.read_flow_run(UUID(flow_run_id))
    except (ObjectNotFound, ValueError):
        return False
    if flow_run.state is not None and flow_run.state.is_final():
        return False
    await client.set_flow_run_state(UUID(flow_run_id), Crashed(message=message), force=True)
    await close_task_runs(client, flow_run_id, "crashed", message)
    return True


async def mark_prefect_cancelled(client: PrefectClient, flow_run_id: str, message: str) -> bool:
    """Set a crashed (or still running) flow run and its unfinished task runs to Cancelled:
    `m27 cancel` of a run that had crashed. A Completed or Failed run is left alone."""
    from uuid import UUID

    from prefect.exceptions import ObjectNotFound
    from prefect.states import Cancelled

    try:
        flow_run = await client.read_flow_run(UUID(flow_run_id))
    except (ObjectNotFound, ValueError):
        return False
    st = flow_run.state
    if st is not None and st.is_final() and not st.is_crashed():
        return False
    await client.set_flow_run_state(UUID(flow_run_id), Cancelled(message=message), force=True)
    await close_task_runs(client, flow_run_id, "cancelled", message)
    return True


async def close_task_runs(
    client: PrefectClient, flow_run_id: str, to: Literal["crashed", "cancelled"], message: str
) -> int:
    """The flow run's task runs that never finished (Running, Pending, or Crashed when
    cancelling) get the run's final state too, so the UI shows no step still running.

    Prefect 3 records task-run states from events a few seconds late, so a caller that
    just closed a run calls this again for a while (the node service does). Returns how
    many task runs it changed."""
    from uuid import UUID

    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.states import Cancelled, Crashed

    task_runs = await client.read_task_runs(
        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)]))
    )
    changed = 0
    for tr in task_runs:
        st = tr.state
        if st is not None and st.is_final() and not (to == "cancelled" and st.is_crashed()):
            continue
        if to == "crashed":
            await client.set_task_run_state(tr.id, Crashed(message=message), force=True)
        else:
            await client.set_task_run_state(tr.id, Cancelled(message=message), force=True)
        changed += 1
    return changed


async def sweep(
    store: EventStore,
    client: PrefectClient | None,
    *,
    host: str | None = None,
    is_alive: Callable[[int, float | None], bool] = liveness.alive,
    is_busy: Callable[[str], bool] = lambda _run_id: False,
    clock: Clock | None = None,
    log: Callable[[str], None] = lambda _line: None,
    stop: Callable[[int, int, float, Clock], int | None] = _stop_group,
    grace_s: float = 3.0,
) -> list[Finding]:
    """Find this host's dead runs, close them in the log and mark them Crashed in Prefect.

    Blocking work (reading the log, stopping process groups) runs in a worker thread so an
    event loop (the worker's) keeps serving. Returns the runs it closed.
    """
    import anyio.to_thread

    # every run as a whole (status, process, admission) is what finds the dead ones; a
    # worker sweeps at each poll, and the whole log grows without end
    state = await anyio.to_thread.run_sync(lambda: fold(store.read_runs((), outline=True)))
    closed: list[Finding] = []
    for finding in dead_runs(state, host, is_alive, is_busy):
        events = await anyio.to_thread.run_sync(
            lambda f=finding: finalize(  # type: ignore[misc]
                store, f.run_id, f.reason, clock=clock, stop=stop, grace_s=grace_s
            )
        )
        if not events:
            continue
        closed.append(finding)
        log(f"run {finding.run_id} crashed: {finding.reason}")
        if client is not None and finding.flow_run_id:
            try:
                await mark_prefect_crashed(client, finding.flow_run_id, finding.reason)
            except Exception as exc:  # the log is the truth; Prefect catches up next sweep
                log(f"could not mark flow run {finding.flow_run_id} Crashed: {exc}")
    return closed
