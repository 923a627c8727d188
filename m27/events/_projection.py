"""What the projection holds: the state of each step, each run and the node.

Only :func:`m27.events.state.apply` changes these objects (through the handlers in
``_handlers.py``); everything else reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from m27 import events as ev

StepStatus = Literal["pending", "queued", "running", "succeeded", "failed", "skipped", "cancelled"]
RunStatus = Literal["running", "succeeded", "failed", "cancelled"]

STEP_DONE: frozenset[str] = frozenset({"succeeded", "failed", "skipped", "cancelled"})


def step_ended(run_status: str, step_status: str | None) -> str | None:
    """How a step ended ("succeeded", ..., or the run's status when the run ended first),
    or None while it may still wait or run: a priority or a cancel matters only then."""
    if step_status in STEP_DONE:
        return step_status
    return None if run_status == "running" else run_status


@dataclass
class StepState:
    """One step of one run, as the log tells it."""

    name: str
    run_id: str = ""
    type: str = ""
    #: the command the run's file gave it (RunSubmitted.step_commands), "" when not recorded
    command: str = ""
    #: the `matrix:` entry that made it (RunSubmitted.step_groups), "" for none
    group: str = ""
    status: StepStatus = "pending"
    #: who asked this step alone to stop (`m27 cancel RUN STEP`), "" if no one: a step
    #: still waiting on others showed plain `pending` until the run reached it
    cancel_requested_by: str = ""
    attempts: int = 0
    pid: int | None = None
    #: the step process's start time (StepStarted.pid_started): tells it from a reused pid
    pid_started: float | None = None
    pgid: int | None = None
    gpus: tuple[int, ...] = ()
    #: the cores its last lease gave it (LeaseGranted.cpus: its GPUs' share); () when not
    #: confined (a CPU step, every core)
    cpus: tuple[int, ...] = ()
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    log_path: str = ""
    log_tail: str = ""
    last_checkpoint: str | None = None
    checkpoint_step: int | None = None
    checkpoints: int = 0
    priority: int = 0
    depends_on: tuple[str, ...] = ()
    gpus_wanted: int = 0
    gpu_memory: int = 0
    queued_at: float | None = None
    duration_s: float | None = None
    #: when a failed attempt's `retry_delay` ends and the next asks for its lease
    retry_at: float | None = None
    outputs: tuple[str, ...] = ()
    resume_from: str | None = None
    restored_from: str | None = None
    host: str = ""
    tier: str | None = None
    guest_gpu: int | None = None
    paused: bool = False
    energy_j: float = 0.0
    #: the most GPU memory its processes held on one GPU (StepMemoryMeasured), 0: unknown
    gpu_memory_peak: int = 0
    #: Floating-point operations the step reported (report_flops), for TFLOPS/W.
    flops: float = 0.0
    #: Set for steps run through Slurm (m27.executors.slurm): the job id and its last Slurm state.
    slurm_job_id: str = ""
    slurm_state: str = ""
    #: the SLURM_CONF the job was submitted with ("": Slurm's default configuration)
    slurm_conf: str = ""
    #: Slurm's reason for that state (``Resources``, ``requeued (restart 1)``), or ""
    slurm_reason: str = ""

    @property
    def done(self) -> bool:
        return self.status in STEP_DONE

    @property
    def done_before(self) -> bool:
        """Skipped because it succeeded in the run this one resumes ("succeeded in the
        resumed run"): done, not left out; listings show it as succeeded."""
        return self.status == "skipped" and ev.StepSkipped.done_before(self.reason)


@dataclass
class RunState:
    """One pipeline run; ``steps`` keeps the pipeline's order."""

    run_id: str
    pipeline: str
    spec_path: str = ""
    vars: dict[str, str] = field(default_factory=dict)
    owner: str = ""
    status: RunStatus = "running"
    submitted_at: float = 0.0
    ended_at: float | None = None
    steps: dict[str, StepState] = field(default_factory=dict)
    priority: int = 0
    cancel_requested: bool = False
    cancel_requested_by: str = ""
    resume_of: str | None = None
    #: RunSubmitted.rerun: the steps a resume was asked to run again
    rerun: tuple[str, ...] = ()
    #: RunSubmitted.on_crash: "resume" when the node service resumes it after a crash
    on_crash: str = ""
    #: what the node service did with it once crashed (`on_crash: resume`): "started" (a
    #: resume: the run whose resume_of is this one), "skipped" (`auto_resume_reason` says
    #: why), "" (nothing yet)
    auto_resume: str = ""
    auto_resume_reason: str = ""
    flow_run_id: str | None = None
    prefect_url: str | None = None
    failed_steps: tuple[str, ...] = ()
    reason: str = ""
    pid: int = 0
    host: str = ""
    #: the flow process's start time (RunSubmitted.pid_started): tells it from a reused pid
    pid_started: float | None = None

    @property
    def crashed(self) -> bool:
        """Closed by the crash watcher (``RunCrashed``): its m27 process died mid-run."""
        return self.status == "failed" and self.reason.startswith("crashed")

    @property
    def duration_s(self) -> float | None:
        """Wall time from submission to the run's end; None while it is running."""
        if self.ended_at is None:
            return None
        return max(0.0, self.ended_at - self.submitted_at)

    def ended(self, name: str) -> str | None:
        """How step `name` ended (see `step_ended`)."""
        found = self.steps.get(name)
        return step_ended(self.status, found.status if found is not None else None)

    def step(self, name: str) -> StepState:
        """The step called `name`, created (pending, at the end) if the log adds one."""
        found = self.steps.get(name)
        if found is None:
            # StepState(name=..., ...) with its 40 defaults costs 3x a copy of them, and a
            # fold makes one per step of every run (75k for a node's 15,000 runs)
            found = object.__new__(StepState)
            found.__dict__ = {**_BLANK_STEP, "name": name, "run_id": self.run_id}
            found.priority = self.priority
            self.steps[name] = found
        return found


#: A new step's fields (every default is immutable: one dict serves every copy).
_BLANK_STEP = dict(StepState(name="").__dict__)


@dataclass
class AgentInfo:
    pid: int
    host: str
    gpus: int
    backend: str
    started_at: float


@dataclass
class NodeState:
    """Everything the log says about the node; ``runs`` keeps submission order."""

    runs: dict[str, RunState] = field(default_factory=dict)
    last_seq: int = 0
    last_at: float | None = None
    leases: dict[tuple[str, str], tuple[int, ...]] = field(default_factory=dict)
    lease_tiers: dict[tuple[str, str], str] = field(default_factory=dict)
    requests: dict[tuple[str, str], ev.StepRequested] = field(default_factory=dict)
    guests: dict[tuple[str, str], int] = field(default_factory=dict)
    lost_gpus: set[int] = field(default_factory=set)
    #: Last alert per GPU (temperature reached; throttle reasons). No event clears them
    #: yet, so they read "last alerted", not "currently".
    overheated: dict[int, float] = field(default_factory=dict)
    throttled: dict[int, tuple[str, ...]] = field(default_factory=dict)
    agent: AgentInfo | None = None
    #: Runs an m27 worker took from Prefect for this node, by run id (scale issue); a run
    #: holds its tier's seat while it is admitted and not ended.
    admitted: dict[str, ev.RunAdmitted] = field(default_factory=dict)
    unknown_run_events: int = 0
    unhandled_kinds: set[str] = field(default_factory=set)

    def step(self, run_id: str, step: str) -> StepState | None:
        run = self.runs.get(run_id)
        return None if run is None else run.steps.get(step)
