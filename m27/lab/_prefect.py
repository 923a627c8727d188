"""Every Prefect internal m27 relies on, in one place, for the one Prefect it is pinned to.

The m27 worker is Prefect's ``ProcessWorker`` plus four things Prefect 3.9 offers no public
hook for. :class:`HookedProcessWorker` turns each into a plainly named method that
:class:`m27.lab.worker.M27Worker` overrides, so the rest of m27 never touches a ``_`` name
of Prefect's:

- :meth:`~HookedProcessWorker.take`: which of the offered scheduled flow runs to take
  (over ``BaseWorker._get_scheduled_flow_runs``, whose result
  ``get_and_submit_flow_runs`` submits);
- :meth:`~HookedProcessWorker.admitted` / :meth:`~HookedProcessWorker.refused`: whether
  Prefect let this worker have a run (over ``BaseWorker._propose_pending_state``, which
  ``_submit_run`` calls before it starts the process);
- taken runs start one at a time, in the order :meth:`take` returned them (over
  ``BaseWorker._submit_run``; ``_submit_scheduled_flow_runs`` starts one task per run, in
  order, and anyio's lock is fair);
- :meth:`~HookedProcessWorker.before_cancel`: m27 asks a run to stop through its node's
  log before Prefect's own cancellation kills the flow-run process. Prefect's runner
  cancels through ``FlowRunExecutorContext._cancellation_manager.cancel_by_id``, looked up
  when a run turns Cancelling. ``ProcessWorker.run`` builds that context itself, so the
  worker runs upstream's own ``run`` (its code object, not a copy of its text) with the
  name ``FlowRunExecutorContext`` bound to :class:`HookedContext`, which wraps the
  manager's ``cancel_by_id`` of the run it starts.

Around that ``run`` (public, but its body is upstream's), :meth:`~HookedProcessWorker.starting`
and :meth:`~HookedProcessWorker.exited` are where a subclass does its part of each run.

:data:`UPSTREAM` names each upstream function whose behaviour this depends on, with the
SHA-256 of its source in :data:`PREFECT_VERSION`; ``tests/unit/test_prefect_internals.py``
fails, naming what changed, when an upgrade touches one. pyproject.toml pins that version.
"""

from __future__ import annotations

import abc
import types
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, cast

import anyio
import anyio.abc
from prefect.runner._flow_run_executor import FlowRunExecutorContext
from prefect.workers.process import ProcessJobConfiguration, ProcessWorker, ProcessWorkerResult

from m27._exceptions import M27Error

if TYPE_CHECKING:
    import logging
    from uuid import UUID

    from prefect.client.schemas.objects import FlowRun
    from prefect.client.schemas.responses import WorkerFlowRunResponse

__all__ = [
    "PREFECT_VERSION",
    "UPSTREAM",
    "HookedContext",
    "HookedProcessWorker",
    "hooked_process_run",
]

PREFECT_VERSION = "3.9.1"

#: "module:qualified name" -> SHA-256 of ``inspect.getsource`` in PREFECT_VERSION.
UPSTREAM: dict[str, str] = {
    # runs with FlowRunExecutorContext rebound; must build the context by that global name
    "prefect.workers.process:ProcessWorker.run": (
        "05306468a6b3266bf8eb7d679a792737d0decee4d43b23e382ca07508463ace3"
    ),
    # its `_on_cancelling` reads self._cancellation_manager.cancel_by_id at call time
    "prefect.runner._flow_run_executor:FlowRunExecutorContext.__aenter__": (
        "5607a391d6508aaa574ab7c82edbef1425d131320d1a80df42dfea563259eb24"
    ),
    # what the hook hands over to once the run had its chance to stop
    "prefect.runner._cancellation_manager:CancellationManager.cancel_by_id": (
        "3a7ecca2f665df0e77e8ecf31593b453ba1884f7ed74c3c04fab289501c666c5"
    ),
    # take(): the poll's offer, and the caller that submits exactly what it returns
    "prefect.workers.base:BaseWorker._get_scheduled_flow_runs": (
        "1789a9c7ede4564cba3af0d536b7922e196b7b84cf5e42228ffd4b006698cae1"
    ),
    "prefect.workers.base:BaseWorker.get_and_submit_flow_runs": (
        "fcb6c4c67be096f4187905f3a560fd7f7ea10f6e44e7e7ca6f45ea4e3454c46a"
    ),
    # one task per taken run, started in order (the start lock keeps that order)
    "prefect.workers.base:BaseWorker._submit_scheduled_flow_runs": (
        "e027756fcfad3da3d5ec76e1d9855a5efb22ea77ceb717ecadd5da9879c5c8de"
    ),
    # admitted()/refused(): the Pending proposal, made by _submit_run before the start
    "prefect.workers.base:BaseWorker._submit_run": (
        "835f0493209733ae52afa6d85fe9d65f367f6755c48dab9d3e862509968fff4d"
    ),
    # a class with abc.ABC among its own bases is not registered as a worker type
    "prefect.utilities.dispatch:_register_subclass_of_base_type": (
        "97a74ea9bd8935b0817c5639450367fe20ef2e3e72a9c5ee389020379efb6cb9"
    ),
    "prefect.workers.base:BaseWorker._propose_pending_state": (
        "8d1630c3bc207549b2162cadebab2162965c2c6f2ddd50150e9315dc976af1e6"
    ),
}

#: The worker whose run() is starting a flow run in this task (HookedContext reads it).
_STARTING: ContextVar[HookedProcessWorker | None] = ContextVar("m27_starting", default=None)


class HookedContext(FlowRunExecutorContext):
    """Prefect's executor context, with the starting worker's cancel hook in front."""

    async def __aenter__(self) -> FlowRunExecutorContext:
        ctx = await super().__aenter__()
        worker = _STARTING.get()
        if worker is not None:
            _hook_cancel(ctx, worker)
        return ctx


def _hook_cancel(ctx: FlowRunExecutorContext, worker: HookedProcessWorker) -> None:
    manager = ctx._cancellation_manager
    prefect_cancel = manager.cancel_by_id

    async def cancel_by_id(flow_run_id: UUID) -> None:
        try:
            await worker.before_cancel(flow_run_id)
        except Exception as exc:  # never block Prefect's own cancellation
            worker.logger.warning("m27 cancel of %s failed: %s", flow_run_id, exc)
        await prefect_cancel(flow_run_id)

    manager.cancel_by_id = cancel_by_id  # type: ignore[method-assign]


_ProcessRun = Callable[
    [ProcessWorker, "FlowRun", ProcessJobConfiguration, "anyio.abc.TaskStatus[int] | None"],
    Awaitable[ProcessWorkerResult],
]


def _rebind(upstream: Any, **names: Any) -> Any:
    """`upstream` itself (same code object) resolving the given global names to others."""
    code = upstream.__code__
    missing = [n for n in names if n not in code.co_names]
    if missing or upstream.__closure__ is not None:
        raise M27Error(
            f"m27's worker needs prefect=={PREFECT_VERSION}: {upstream.__qualname__} no longer "
            f"looks up {', '.join(missing) or 'its globals only'}",
            function=upstream.__qualname__,
        )
    fn = types.FunctionType(code, {**upstream.__globals__, **names}, upstream.__name__)
    fn.__defaults__ = upstream.__defaults__
    fn.__kwdefaults__ = upstream.__kwdefaults__
    fn.__qualname__ = upstream.__qualname__
    fn.__module__ = upstream.__module__
    return fn


#: ProcessWorker.run (Prefect's code, unchanged) building a HookedContext.
hooked_process_run = cast(
    _ProcessRun, _rebind(ProcessWorker.run, FlowRunExecutorContext=HookedContext)
)


class HookedProcessWorker(ProcessWorker, abc.ABC):
    """ProcessWorker with public hooks for what m27 decides (see the module docstring).

    ``abc.ABC`` among its bases keeps Prefect's type registry from taking it for a worker
    type of its own (it would replace ``process``); its subclass registers as ``m27``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._start_lock: anyio.Lock | None = None

    @property
    def logger(self) -> logging.Logger:
        """The worker's own logger (not a flow run's)."""
        return cast("logging.Logger", self._logger)

    # --- the hooks (defaults: what ProcessWorker does) ------------------------------------

    async def take(self, offered: list[WorkerFlowRunResponse]) -> list[WorkerFlowRunResponse]:
        """The scheduled flow runs to submit this poll, in the order to start them."""
        return offered

    async def admitted(self, flow_run: FlowRun) -> None:
        """Prefect set `flow_run` Pending for this worker: it is ours to start."""

    async def refused(self, flow_run: FlowRun) -> None:
        """Prefect did not let this worker have `flow_run` (another worker won it)."""

    async def before_cancel(self, flow_run_id: UUID) -> None:
        """`flow_run_id` turned Cancelling; Prefect kills its process once this returns."""

    async def starting(self, flow_run: FlowRun, configuration: ProcessJobConfiguration) -> None:
        """`flow_run`'s process starts next, with `configuration` (its ``env`` may grow)."""

    async def exited(self, flow_run: FlowRun) -> None:
        """:meth:`run` of `flow_run` is over, however it ended (shielded from cancellation)."""

    # --- the wiring -----------------------------------------------------------------------

    async def run(
        self,
        flow_run: FlowRun,
        configuration: ProcessJobConfiguration,
        task_status: anyio.abc.TaskStatus[int] | None = None,
    ) -> ProcessWorkerResult:
        await self.starting(flow_run, configuration)
        token = _STARTING.set(self)
        try:
            return await hooked_process_run(self, flow_run, configuration, task_status)
        finally:
            _STARTING.reset(token)
            with anyio.CancelScope(shield=True):
                await self.exited(flow_run)

    async def _get_scheduled_flow_runs(self) -> list[WorkerFlowRunResponse]:
        return await self.take(await super()._get_scheduled_flow_runs())

    async def _submit_run(self, flow_run: FlowRun) -> None:
        if self._start_lock is None:
            self._start_lock = anyio.Lock()
        async with self._start_lock:
            await super()._submit_run(flow_run)

    async def _propose_pending_state(self, flow_run: FlowRun) -> bool:
        ok = await super()._propose_pending_state(flow_run)
        await (self.admitted(flow_run) if ok else self.refused(flow_run))
        return ok
