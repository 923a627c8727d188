"""One handler per event kind: how each event changes a :class:`NodeState`.

``@_on(Kind)`` registers a handler in ``_HANDLERS``, which :func:`m27.events.state.apply`
dispatches on; a unit test checks that every kind has one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from m27 import events as ev
from m27.events import Event
from m27.events._projection import AgentInfo, NodeState, RunState, StepState, StepStatus

_E = TypeVar("_E", bound=Event)
_Handler = Callable[[NodeState, Any], None]
_HANDLERS: dict[type[Event], _Handler] = {}


def _on(cls: type[_E]) -> Callable[[Callable[[NodeState, _E], None]], Callable[..., None]]:
    def register(fn: Callable[[NodeState, _E], None]) -> Callable[..., None]:
        _HANDLERS[cls] = fn
        return fn

    return register


def _run(state: NodeState, run_id: str) -> RunState | None:
    run = state.runs.get(run_id)
    if run is None:
        state.unknown_run_events += 1
    return run


def _step(state: NodeState, run_id: str, step: str) -> StepState | None:
    run = _run(state, run_id)
    return None if run is None else run.step(step)


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
        flow_run_id=e.flow_run_id,
        prefect_url=e.prefect_url,
        pid=e.pid,
        host=e.host,
        pid_started=e.pid_started,
    )
    for name in e.steps:
        run.step(name)
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
    if run := _run(state, e.run_id):
        run.cancel_requested, run.cancel_requested_by = True, e.by


# --- steps --------------------------------------------------------------------------------


@_on(ev.StepQueued)
def _step_queued(state: NodeState, e: ev.StepQueued) -> None:
    if step := _step(state, e.run_id, e.step):
        step.status, step.type, step.priority = "queued", e.type, e.priority
        step.gpus_wanted, step.gpu_memory, step.depends_on = e.gpus, e.gpu_memory, e.depends_on
        step.queued_at = e.at


@_on(ev.StepStarted)
def _step_started(state: NodeState, e: ev.StepStarted) -> None:
    if step := _step(state, e.run_id, e.step):
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


@_on(ev.GuestPaused)
def _guest_paused(state: NodeState, e: ev.GuestPaused) -> None:
    if step := _step(state, e.run_id, e.step):
        step.paused = True


@_on(ev.GuestResumed)
def _guest_resumed(state: NodeState, e: ev.GuestResumed) -> None:
    if step := _step(state, e.run_id, e.step):
        step.paused = False


@_on(ev.Promoted)
def _promoted(state: NodeState, e: ev.Promoted) -> None:
    key = (e.run_id, e.step)
    state.guests.pop(key, None)
    if key in state.lease_tiers:
        state.lease_tiers[key] = "immediate"
    if step := _step(state, e.run_id, e.step):
        step.tier, step.guest_gpu, step.paused = "immediate", None, False


@_on(ev.PriorityBumped)
def _priority_bumped(state: NodeState, e: ev.PriorityBumped) -> None:
    if step := _step(state, e.run_id, e.step):
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


@_on(ev.StepEnergyMeasured)
def _energy_measured(state: NodeState, e: ev.StepEnergyMeasured) -> None:
    # Each measurement is the energy of one interval, so they add up.
    if step := _step(state, e.run_id, e.step):
        step.energy_j += e.joules


@_on(ev.StepMemoryMeasured)
def _memory_measured(state: NodeState, e: ev.StepMemoryMeasured) -> None:
    if step := _step(state, e.run_id, e.step):
        step.gpu_memory_peak = max(step.gpu_memory_peak, e.peak_bytes)


# --- checkpoints ----------------------------------------------------------------------------


@_on(ev.CheckpointWritten)
def _checkpoint_written(state: NodeState, e: ev.CheckpointWritten) -> None:
    if step := _step(state, e.run_id, e.step):
        step.last_checkpoint, step.checkpoint_step = e.path, e.sim_step
        step.checkpoints += 1


@_on(ev.CheckpointRestored)
def _checkpoint_restored(state: NodeState, e: ev.CheckpointRestored) -> None:
    if step := _step(state, e.run_id, e.step):
        step.restored_from = e.path


# --- scale: the m27 worker and crash truth ----------------------------------------------------


@_on(ev.RunAdmitted)
def _run_admitted(state: NodeState, e: ev.RunAdmitted) -> None:
    # Comes before the run's own RunSubmitted, so it names a run not yet known: not counted
    # as an unknown-run event.
    state.admitted[e.run_id] = e


@_on(ev.RunCrashed)
def _run_crashed(state: NodeState, e: ev.RunCrashed) -> None:
    state.admitted.pop(e.run_id, None)
    run = state.runs.get(e.run_id)
    if run is None or run.status != "running":
        return  # admitted but never started, or already ended: nothing more to say
    run.status, run.ended_at, run.reason = "failed", e.at, f"crashed: {e.reason}"
    run.failed_steps = tuple(n for n, s in run.steps.items() if s.status in ("running", "failed"))


# --- slurm: steps run as Slurm jobs ---------------------------------------------------------


@_on(ev.SlurmJobSubmitted)
def _slurm_job_submitted(state: NodeState, e: ev.SlurmJobSubmitted) -> None:
    if step := _step(state, e.run_id, e.step):
        step.slurm_job_id, step.slurm_state = e.job_id, "SUBMITTED"


@_on(ev.SlurmJobStateChanged)
def _slurm_job_state_changed(state: NodeState, e: ev.SlurmJobStateChanged) -> None:
    if step := _step(state, e.run_id, e.step):
        step.slurm_job_id, step.slurm_state = e.job_id, e.state


@_on(ev.StepFlopsReported)
def _flops_reported(state: NodeState, e: ev.StepFlopsReported) -> None:
    step = _step(state, e.run_id, e.step)
    if step is not None:
        step.flops += e.flops
