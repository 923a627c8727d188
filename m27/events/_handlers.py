"""One handler per event kind: how each event changes a :class:`NodeState`.

``@_on(Kind)`` registers a handler in ``_HANDLERS``, which :func:`m27.events.state.apply`
dispatches on; a unit test checks that every kind has one. ``@_on_step(Kind)`` is the same
for the many kinds that change only the step they name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from m27 import events as ev
from m27.events import Event, StepEvent
from m27.events._projection import AgentInfo, NodeState, RunState, StepState, StepStatus

_E = TypeVar("_E", bound=Event)
_S = TypeVar("_S", bound=StepEvent)
_Handler = Callable[[NodeState, Any], None]
_HANDLERS: dict[type[Event], _Handler] = {}


def _on(cls: type[_E]) -> Callable[[Callable[[NodeState, _E], None]], Callable[..., None]]:
    def register(fn: Callable[[NodeState, _E], None]) -> Callable[..., None]:
        _HANDLERS[cls] = fn
        return fn

    return register


def _on_step(cls: type[_S]) -> Callable[[Callable[[StepState, _S], None]], Callable[..., None]]:
    """``@_on`` for a handler that changes only the step the event names: it is given that
    :class:`StepState`, and is not called for a run this log never saw submitted."""

    def register(fn: Callable[[StepState, _S], None]) -> Callable[..., None]:
        def handler(state: NodeState, e: _S) -> None:
            # _step's lookups, inline (a replay calls this for most events)
            run = state.runs.get(e.run_id)
            if run is None:
                state.unknown_run_events += 1
                return
            fn(run.steps.get(e.step) or run.step(e.step), e)

        _HANDLERS[cls] = handler
        return fn

    return register


def _run(state: NodeState, run_id: str) -> RunState | None:
    run = state.runs.get(run_id)
    if run is None:
        state.unknown_run_events += 1
    return run


def _step(state: NodeState, run_id: str, step: str) -> StepState | None:
    run = state.runs.get(run_id)  # _run's lookup, inline: this is on every step event's path
    if run is None:
        state.unknown_run_events += 1
        return None
    return run.step(step)


def _finish(step: StepState, status: StepStatus, at: float, reason: str = "") -> None:
    step.status = status
    step.ended_at = at
    step.reason = reason
    step.paused = False


# --- runs ---------------------------------------------------------------------------------


@_on(ev.RunSubmitted)
def _run_submitted(state: NodeState, e: ev.RunSubmitted) -> None:
    run = RunState(
        run_id=e.run_id,
        pipeline=e.pipeline,
        spec_path=e.spec_path,
        vars=dict(e.vars),
        owner=e.owner,
        submitted_at=e.at,
        priority=e.priority,
        resume_of=e.resume_of,
        rerun=e.rerun,
        on_crash=e.on_crash,
        flow_run_id=e.flow_run_id,
        prefect_url=e.prefect_url,
        pid=e.pid,
        host=e.host,
        pid_started=e.pid_started,
    )
    types = e.step_types if len(e.step_types) == len(e.steps) else ("",) * len(e.steps)
    for name, kind in zip(e.steps, types, strict=True):
        run.step(name).type = kind
    if len(e.step_commands) == len(e.steps):
        for name, command in zip(e.steps, e.step_commands, strict=True):
            run.step(name).command = command
    if len(e.step_groups) == len(e.steps):
        for name, group in zip(e.steps, e.step_groups, strict=True):
            run.step(name).group = group
    state.runs[e.run_id] = run


@_on(ev.RunSucceeded)
def _run_succeeded(state: NodeState, e: ev.RunSucceeded) -> None:
    if run := _run(state, e.run_id):
        run.status, run.ended_at = "succeeded", e.at


@_on(ev.RunFailed)
def _run_failed(state: NodeState, e: ev.RunFailed) -> None:
    if run := _run(state, e.run_id):
        run.status, run.ended_at = "failed", e.at
        run.failed_steps, run.reason = e.failed_steps, e.reason


@_on(ev.RunCancelled)
def _run_cancelled(state: NodeState, e: ev.RunCancelled) -> None:
    if run := _run(state, e.run_id):
        run.status, run.ended_at, run.reason = "cancelled", e.at, e.reason


@_on(ev.CancelRequested)
def _cancel_requested(state: NodeState, e: ev.CancelRequested) -> None:
    if e.step:  # one step's: the run goes on
        if (step := _step(state, e.run_id, e.step)) and not step.done:
            step.cancel_requested_by = step.cancel_requested_by or e.by
        return
    if run := _run(state, e.run_id):
        run.cancel_requested, run.cancel_requested_by = True, e.by


# --- steps --------------------------------------------------------------------------------


@_on_step(ev.StepQueued)
def _step_queued(step: StepState, e: ev.StepQueued) -> None:
    step.status, step.type, step.priority = "queued", e.type, e.priority
    step.gpus_wanted, step.gpu_memory, step.depends_on = e.gpus, e.gpu_memory, e.depends_on
    step.queued_at = e.at


@_on_step(ev.StepStarted)
def _step_started(step: StepState, e: ev.StepStarted) -> None:
    step.status, step.attempts = "running", e.attempt
    step.pid, step.pgid, step.gpus, step.pid_started = e.pid, e.pgid, e.gpus, e.pid_started
    step.started_at, step.ended_at, step.duration_s = e.at, None, None
    step.exit_code, step.signal, step.reason = None, None, ""
    step.log_path, step.resume_from, step.host = e.log_path, e.resume_from, e.host


@_on(ev.StepSucceeded)
def _step_succeeded(state: NodeState, e: ev.StepSucceeded) -> None:
    state.requests.pop((e.run_id, e.step), None)
    if step := _step(state, e.run_id, e.step):
        _finish(step, "succeeded", e.at)
        step.attempts = max(step.attempts, e.attempt)
        step.exit_code, step.duration_s, step.outputs = 0, e.duration_s, e.outputs


@_on(ev.StepFailed)
def _step_failed(state: NodeState, e: ev.StepFailed) -> None:
    if not e.will_retry:
        state.requests.pop((e.run_id, e.step), None)
    if step := _step(state, e.run_id, e.step):
        _finish(step, "queued" if e.will_retry else "failed", e.at, e.reason)
        step.attempts = max(step.attempts, e.attempt)
        step.exit_code, step.signal = e.exit_code, e.signal
        step.log_tail, step.duration_s = e.log_tail, e.duration_s
        step.retry_at = e.at + e.retry_delay if e.will_retry and e.retry_delay > 0 else None


@_on(ev.StepRequeued)
def _step_requeued(state: NodeState, e: ev.StepRequeued) -> None:
    """Stopped to ask again for a lease (its GPU was lost): waiting, not ended."""
    if step := _step(state, e.run_id, e.step):
        _finish(step, "queued", e.at, f"{e.reason}: requeued")
        step.attempts = max(step.attempts, e.attempt)


@_on(ev.StepSkipped)
def _step_skipped(state: NodeState, e: ev.StepSkipped) -> None:
    state.requests.pop((e.run_id, e.step), None)
    if step := _step(state, e.run_id, e.step):
        _finish(step, "skipped", e.at, e.reason)


@_on(ev.StepCancelled)
def _step_cancelled(state: NodeState, e: ev.StepCancelled) -> None:
    state.requests.pop((e.run_id, e.step), None)
    if step := _step(state, e.run_id, e.step):
        _finish(step, "cancelled", e.at, e.reason)


# --- leases and the agent -------------------------------------------------------------------


@_on(ev.StepRequested)
def _step_requested(state: NodeState, e: ev.StepRequested) -> None:
    state.requests[(e.run_id, e.step)] = e
    if step := _step(state, e.run_id, e.step):
        step.type = step.type or e.type
        step.gpus_wanted, step.gpu_memory = e.gpus, e.gpu_memory


@_on(ev.LeaseGranted)
def _lease_granted(state: NodeState, e: ev.LeaseGranted) -> None:
    key = (e.run_id, e.step)
    state.requests.pop(key, None)
    state.leases[key] = e.gpus
    state.lease_tiers[key] = e.tier
    if step := _step(state, e.run_id, e.step):
        step.tier = e.tier
        step.cpus = e.cpus


@_on(ev.LeaseReleased)
def _lease_released(state: NodeState, e: ev.LeaseReleased) -> None:
    key = (e.run_id, e.step)
    state.leases.pop(key, None)
    state.lease_tiers.pop(key, None)
    state.guests.pop(key, None)
    if step := _step(state, e.run_id, e.step):
        step.tier, step.guest_gpu, step.paused = None, None, False


@_on(ev.GuestStarted)
def _guest_started(state: NodeState, e: ev.GuestStarted) -> None:
    state.guests[(e.run_id, e.step)] = e.gpu
    if step := _step(state, e.run_id, e.step):
        step.tier, step.guest_gpu, step.paused = "guest", e.gpu, False


@_on_step(ev.GuestPaused)
def _guest_paused(step: StepState, e: ev.GuestPaused) -> None:
    step.paused = True


@_on_step(ev.GuestResumed)
def _guest_resumed(step: StepState, e: ev.GuestResumed) -> None:
    step.paused = False


@_on(ev.Promoted)
def _promoted(state: NodeState, e: ev.Promoted) -> None:
    key = (e.run_id, e.step)
    state.guests.pop(key, None)
    if key in state.lease_tiers:
        state.lease_tiers[key] = "immediate"
    if step := _step(state, e.run_id, e.step):
        step.tier, step.guest_gpu, step.paused = "immediate", None, False


@_on_step(ev.PriorityBumped)
def _priority_bumped(step: StepState, e: ev.PriorityBumped) -> None:
    step.priority += e.delta


@_on(ev.GpuLost)
def _gpu_lost(state: NodeState, e: ev.GpuLost) -> None:
    state.lost_gpus.add(e.gpu)


@_on(ev.GpuOverheated)
def _gpu_overheated(state: NodeState, e: ev.GpuOverheated) -> None:
    state.overheated[e.gpu] = e.temperature_c


@_on(ev.GpuThrottled)
def _gpu_throttled(state: NodeState, e: ev.GpuThrottled) -> None:
    state.throttled[e.gpu] = e.reasons


@_on(ev.AgentStarted)
def _agent_started(state: NodeState, e: ev.AgentStarted) -> None:
    state.agent = AgentInfo(pid=e.pid, host=e.host, gpus=e.gpus, backend=e.backend, started_at=e.at)


@_on_step(ev.StepEnergyMeasured)
def _energy_measured(step: StepState, e: ev.StepEnergyMeasured) -> None:
    # Each measurement is the energy of one interval, so they add up.
    step.energy_j += e.joules


@_on_step(ev.StepMemoryMeasured)
def _memory_measured(step: StepState, e: ev.StepMemoryMeasured) -> None:
    step.gpu_memory_peak = max(step.gpu_memory_peak, e.peak_bytes)


# --- checkpoints ----------------------------------------------------------------------------


@_on_step(ev.CheckpointWritten)
def _checkpoint_written(step: StepState, e: ev.CheckpointWritten) -> None:
    step.last_checkpoint = e.path
    # a file capture's sim_step counts captures; the program's own step, when read, is it
    step.checkpoint_step = e.engine_step if e.source == "files" else e.sim_step
    step.checkpoints += 1


@_on_step(ev.CheckpointRestored)
def _checkpoint_restored(step: StepState, e: ev.CheckpointRestored) -> None:
    step.restored_from = e.path


# --- scale: the m27 worker and crash truth ----------------------------------------------------


@_on(ev.RunAdmitted)
def _run_admitted(state: NodeState, e: ev.RunAdmitted) -> None:
    # Comes before the run's own RunSubmitted, so it names a run not yet known: not counted
    # as an unknown-run event.
    state.admitted[e.run_id] = e


@_on(ev.AutoResumeStarted)
def _auto_resume_started(state: NodeState, e: ev.AutoResumeStarted) -> None:
    if (run := _run(state, e.run_id)) is not None:
        run.auto_resume = "started"


@_on(ev.AutoResumeSkipped)
def _auto_resume_skipped(state: NodeState, e: ev.AutoResumeSkipped) -> None:
    if (run := _run(state, e.run_id)) is not None:
        run.auto_resume, run.auto_resume_reason = "skipped", e.reason


@_on(ev.RunCrashed)
def _run_crashed(state: NodeState, e: ev.RunCrashed) -> None:
    state.admitted.pop(e.run_id, None)
    run = state.runs.get(e.run_id)
    if run is None or run.status != "running":
        return  # admitted but never started, or already ended: nothing more to say
    run.status, run.ended_at, run.reason = "failed", e.at, f"crashed: {e.reason}"
    run.failed_steps = tuple(n for n, s in run.steps.items() if s.status in ("running", "failed"))


# --- slurm: steps run as Slurm jobs ---------------------------------------------------------


@_on_step(ev.SlurmJobSubmitted)
def _slurm_job_submitted(step: StepState, e: ev.SlurmJobSubmitted) -> None:
    step.slurm_job_id, step.slurm_state, step.slurm_conf = e.job_id, "SUBMITTED", e.slurm_conf


@_on_step(ev.SlurmJobStateChanged)
def _slurm_job_state_changed(step: StepState, e: ev.SlurmJobStateChanged) -> None:
    step.slurm_job_id, step.slurm_state, step.slurm_reason = e.job_id, e.state, e.reason


@_on_step(ev.StepFlopsReported)
def _flops_reported(step: StepState, e: ev.StepFlopsReported) -> None:
    step.flops += e.flops
