"""What the notifier and the bot remember about runs, folded from the event log.

A message about a finished run needs facts spread over many earlier events (how many
steps ran, GPU-seconds, energy, the Prefect URL, the last failure's log tail), and the bot
answers /runs and /queue from the same view. This fold is deliberately small and owned
here so the notifier does not break when the node projection (``m27.events.state``) grows;
``apply`` is the only thing that changes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from m27 import events as ev


@dataclass
class StepFacts:
    name: str
    status: str = "pending"  # pending, queued, running, succeeded, failed, skipped, cancelled
    type: str = ""
    priority: int = 0
    attempt: int = 0
    gpus: tuple[int, ...] = ()
    started_at: float | None = None
    log_path: str = ""


@dataclass
class FailureFacts:
    step: str
    attempt: int
    reason: str
    exit_code: int | None
    signal: int | None
    log_tail: str
    log_path: str


@dataclass
class RunFacts:
    run_id: str
    pipeline: str = ""
    owner: str = ""
    status: str = "running"  # running, succeeded, failed, cancelled, crashed
    submitted_at: float = 0.0
    prefect_url: str | None = None
    steps: dict[str, StepFacts] = field(default_factory=dict)
    gpu_seconds: float = 0.0
    energy_j: float | None = None
    last_failure: FailureFacts | None = None
    cancel_requested_by: str = ""
    #: the pipeline's `on_crash:` ("resume": the node service resumes it after a crash)
    on_crash: str = ""

    def step(self, name: str) -> StepFacts:
        if name not in self.steps:
            self.steps[name] = StepFacts(name)
        return self.steps[name]

    @property
    def steps_done(self) -> int:
        return sum(1 for s in self.steps.values() if s.status == "succeeded")


@dataclass
class NodeFacts:
    """Runs by id (in submission order) plus node-level facts."""

    runs: dict[str, RunFacts] = field(default_factory=dict)
    agent_starts: int = 0
    lost_gpus: set[int] = field(default_factory=set)
    last_seq: int = 0

    def run(self, run_id: str) -> RunFacts:
        if run_id not in self.runs:
            self.runs[run_id] = RunFacts(run_id)
        return self.runs[run_id]

    def apply(self, seq: int, event: ev.Event) -> None:
        self.last_seq = max(self.last_seq, seq)
        _apply(self, event)


def _apply(node: NodeFacts, e: ev.Event) -> None:
    if isinstance(e, ev.RunSubmitted):
        run = node.run(e.run_id)
        run.pipeline, run.owner, run.submitted_at = e.pipeline, e.owner, e.at
        run.prefect_url = e.prefect_url
        run.on_crash = e.on_crash
        for name in e.steps:
            run.step(name)
    elif isinstance(e, ev.RunSucceeded):
        node.run(e.run_id).status = "succeeded"
    elif isinstance(e, ev.RunFailed):
        node.run(e.run_id).status = "failed"
    elif isinstance(e, ev.RunCancelled):
        node.run(e.run_id).status = "cancelled"
    elif isinstance(e, ev.RunCrashed):
        node.run(e.run_id).status = "crashed"
    elif isinstance(e, ev.CancelRequested) and not e.step:
        node.run(e.run_id).cancel_requested_by = e.by
    elif isinstance(e, ev.StepQueued):
        step = node.run(e.run_id).step(e.step)
        step.status, step.type, step.priority = "queued", e.type, e.priority
    elif isinstance(e, ev.PriorityBumped):
        node.run(e.run_id).step(e.step).priority += e.delta
    elif isinstance(e, ev.StepStarted):
        step = node.run(e.run_id).step(e.step)
        step.status, step.attempt, step.gpus, step.started_at = "running", e.attempt, e.gpus, e.at
        step.log_path = e.log_path
    elif isinstance(e, ev.StepSucceeded | ev.StepFailed):
        run = node.run(e.run_id)
        step = run.step(e.step)
        run.gpu_seconds += len(step.gpus) * e.duration_s
        if isinstance(e, ev.StepSucceeded):
            step.status = "succeeded"
        else:
            step.status = "queued" if e.will_retry else "failed"
            run.last_failure = FailureFacts(
                e.step, e.attempt, e.reason, e.exit_code, e.signal, e.log_tail, step.log_path
            )
    elif isinstance(e, ev.StepSkipped):
        # done in the run this one resumes: counted as succeeded (as `m27 runs` does)
        done = ev.StepSkipped.done_before(e.reason)
        node.run(e.run_id).step(e.step).status = "succeeded" if done else "skipped"
    elif isinstance(e, ev.StepCancelled):
        node.run(e.run_id).step(e.step).status = "cancelled"
    elif isinstance(e, ev.StepRequeued):
        node.run(e.run_id).step(e.step).status = "queued"  # its GPU was lost: it asks again
    elif isinstance(e, ev.StepEnergyMeasured):
        run = node.run(e.run_id)
        run.energy_j = (run.energy_j or 0.0) + e.joules
    elif isinstance(e, ev.AgentStarted):
        node.agent_starts += 1
    elif isinstance(e, ev.GpuLost):
        node.lost_gpus.add(e.gpu)
