"""Events about a run as a whole: submitted, admitted by a worker, ended, crashed, cancelled."""

from __future__ import annotations

from dataclasses import dataclass, field

from m27.events._base import RunEvent, event

# --- runs -----------------------------------------------------------------------------


@event
@dataclass(frozen=True)
class RunSubmitted(RunEvent):
    """A pipeline run was accepted: the spec validated and its steps are known."""

    pipeline: str
    spec_path: str
    steps: tuple[str, ...]
    vars: dict[str, str] = field(default_factory=dict)
    owner: str = ""
    priority: int = 0
    resume_of: str | None = None
    flow_run_id: str | None = None
    prefect_url: str | None = None
    pid: int = 0
    host: str = ""
    #: the flow process's start time (:func:`m27.liveness.start_time`), so a reused pid is
    #: not taken for it; None in logs written before it was recorded
    pid_started: float | None = None
    #: each step's type (cpu, gpu, gpu_light), in the order of `steps`, so a step that
    #: never queued shows its type; empty in logs written before it was recorded
    step_types: tuple[str, ...] = ()
    #: each step's command as the file rendered it (shell-quoted, before a recipe's own
    #: options), in the order of `steps`, so `m27 run --resume` can say that a step which
    #: succeeded here has another command now; empty in logs written before it was recorded
    step_commands: tuple[str, ...] = ()
    #: each step's `matrix:` entry (`md` for `md.1`; "" for a step no matrix made), in the
    #: order of `steps`; empty in logs written before it was recorded
    step_groups: tuple[str, ...] = ()
    #: the steps `m27 run --resume R --rerun STEP` named: they and the steps waiting on
    #: them ran again from the start, though they had succeeded
    rerun: tuple[str, ...] = ()
    #: the pipeline's `on_crash:` ("resume": the node service resumes the run if its
    #: process dies; "stop", or "" in logs written before it was recorded: a person does)
    on_crash: str = ""


@event
@dataclass(frozen=True)
class RunSucceeded(RunEvent):
    duration_s: float


@event
@dataclass(frozen=True)
class RunFailed(RunEvent):
    duration_s: float
    failed_steps: tuple[str, ...] = ()
    reason: str = ""


@event
@dataclass(frozen=True)
class RunCancelled(RunEvent):
    reason: str = ""


@event
@dataclass(frozen=True)
class CancelRequested(RunEvent):
    """Someone (`m27 cancel`, Ctrl-C, the bot, Prefect) asked a run to stop; with `step`,
    only that step (`m27 cancel RUN STEP`: the run goes on without it)."""

    by: str = ""
    step: str = ""


# --- scale: the m27 worker and crash truth ---------------------------------------------


@event
@dataclass(frozen=True)
class RunAdmitted(RunEvent):
    """An m27 worker took a Prefect flow run for this node, on a seat of `tier`; the run
    holds that seat until it ends (RunSubmitted follows from the flow's own process)."""

    flow_run_id: str
    tier: str
    node: str = ""
    host: str = ""
    worker_pid: int = 0
    #: the worker's start time (see ``RunSubmitted.pid_started``); None: unknown
    worker_pid_started: float | None = None


@event
@dataclass(frozen=True)
class RunCrashed(RunEvent):
    """The run's process died without recording an end (kill -9, OOM, power cut); the
    watchdog stopped its orphaned steps and set the Prefect flow run to Crashed."""

    reason: str


@event
@dataclass(frozen=True)
class AutoResumeStarted(RunEvent):
    """The node service started ``m27 run --resume RUN --detach`` for this crashed run, as
    its pipeline's ``on_crash: resume`` asks; the new run's RunSubmitted names this one in
    `resume_of` once it is in the log."""

    #: who started it: `node-service:PID`
    by: str = ""


@event
@dataclass(frozen=True)
class AutoResumeSkipped(RunEvent):
    """The node service did not resume this crashed run although its pipeline says
    ``on_crash: resume`` (a resume that got no further, another user's run, a crash from
    before the service started), or the resume it started did not start a run."""

    reason: str
