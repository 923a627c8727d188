"""Events about one step: its demand, its attempts (local or as Slurm jobs), what it
reports, its checkpoints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from m27.events._base import StepEvent, event

# --- steps ----------------------------------------------------------------------------


@dataclass(frozen=True)
class StepDemand(StepEvent):
    """Base of the events that say what a step needs: its type (cpu, gpu, gpu_light), its
    priority, how many GPUs and how much GPU memory (bytes)."""

    type: str
    priority: int = 0
    gpus: int = 0
    gpu_memory: int = 0


@event
@dataclass(frozen=True)
class StepQueued(StepDemand):
    """A step is waiting for its dependencies and a slot (CPU or GPUs)."""

    depends_on: tuple[str, ...] = ()


@event
@dataclass(frozen=True)
class StepStarted(StepEvent):
    """The step's process was started in its own process group."""

    attempt: int
    pid: int
    pgid: int
    command: tuple[str, ...]
    gpus: tuple[int, ...] = ()
    log_path: str = ""
    resume_from: str | None = None
    host: str = ""
    #: the step process's start time (see ``RunSubmitted.pid_started``); None: unknown
    pid_started: float | None = None


@event
@dataclass(frozen=True)
class StepSucceeded(StepEvent):
    attempt: int
    duration_s: float
    outputs: tuple[str, ...] = ()


@event
@dataclass(frozen=True)
class StepFailed(StepEvent):
    """An attempt failed; ``will_retry`` says whether another attempt follows."""

    attempt: int
    duration_s: float
    reason: str
    exit_code: int | None = None
    signal: int | None = None
    log_tail: str = ""
    will_retry: bool = False
    #: seconds before the next attempt asks for its lease (`retry_delay:`), when it retries
    retry_delay: float = 0.0


@event
@dataclass(frozen=True)
class StepSkipped(StepEvent):
    """A step did not run: an upstream step failed, or it already succeeded (resume)."""

    reason: str

    #: The reason of a step skipped because it succeeded in the run this one resumes, as
    #: logs before the run was named kept it (now: :meth:`done_in`).
    DONE_BEFORE: ClassVar[str] = "succeeded in the resumed run"
    #: The start of :meth:`done_in`'s reason.
    DONE_IN: ClassVar[str] = "succeeded in run "

    @staticmethod
    def done_in(run_id: str) -> str:
        """The reason of a step a resume skips: where it succeeded (the run resumed, or one
        that run resumed in turn)."""
        return StepSkipped.DONE_IN + run_id

    @staticmethod
    def done_before(reason: str) -> bool:
        """Whether a skip with `reason` means done, not left out (listings count it as
        succeeded)."""
        return reason.startswith((StepSkipped.DONE_IN, StepSkipped.DONE_BEFORE))

    @staticmethod
    def done_where(reason: str) -> str | None:
        """The run a skip with `reason` names as where the step succeeded, if it does."""
        return (
            reason[len(StepSkipped.DONE_IN) :] if reason.startswith(StepSkipped.DONE_IN) else None
        )


@event
@dataclass(frozen=True)
class StepCancelled(StepEvent):
    reason: str = ""


@event
@dataclass(frozen=True)
class StepRequeued(StepEvent):
    """The step was stopped because its lease was lost (`GPU 0 lost`, the agent took it
    back), not cancelled: it asks again and resumes from its last checkpoint. It was
    recorded as ``StepCancelled``, so `m27 run` said `md: cancelled` and `m27 status`
    showed it cancelled while it waited for another GPU."""

    attempt: int
    reason: str

    def line(self) -> str:
        """How `m27 run` and the step's Prefect log say it."""
        return (
            f"stopped: {self.reason}; requeued: it starts again when a GPU is free, from "
            "its last checkpoint if it has one"
        )


# --- exporter: what a step reports about its own work -----------------------------------


@event
@dataclass(frozen=True)
class StepFlopsReported(StepEvent):
    """A step counted `flops` floating-point operations (``report_flops``); reports
    add up, and the Energy board divides them by the step's joules into TFLOPS/W."""

    flops: float


# --- checkpoints ------------------------------------------------------------------------


@event
@dataclass(frozen=True)
class CheckpointWritten(StepEvent):
    """A checkpoint was committed durably (manifest renamed into place)."""

    path: str
    sim_step: int
    bytes_written: int
    bytes_total: int
    duration_s: float
    pipeline: str = ""
    #: "arrays" (m27.Checkpointer) or "files" (a self-checkpointing program's files,
    #: captured by the runner); `files` names them
    source: str = "arrays"
    files: tuple[str, ...] = ()
    #: of a file capture: the step the program's own checkpoint records (GROMACS's MD
    #: step, read from the .cpt header), None when its recipe cannot read one; its
    #: `sim_step` counts the captures
    engine_step: int | None = None


@event
@dataclass(frozen=True)
class CheckpointRestored(StepEvent):
    path: str
    sim_step: int
    #: a capture of the program's own files put back (`sim_step` is then 0), and the step
    #: they record (None: not known)
    files: tuple[str, ...] = ()
    engine_step: int | None = None


@event
@dataclass(frozen=True)
class SlurmJobSubmitted(StepEvent):
    """sbatch accepted a step's attempt as Slurm job `job_id` (kept across requeues).

    `slurm_conf` is the ``SLURM_CONF`` sbatch ran with ("" when unset): the cluster whose
    controller knows the job, so that whoever cancels it later (the crash watcher, in
    the node service's own environment) asks the same one."""

    job_id: str
    attempt: int
    slurm_conf: str = ""


@event
@dataclass(frozen=True)
class SlurmJobStateChanged(StepEvent):
    """The job's Slurm state changed (PENDING, RUNNING, TIMEOUT, ...); `reason` is Slurm's."""

    job_id: str
    state: str
    reason: str = ""
