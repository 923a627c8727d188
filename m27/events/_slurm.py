"""Events of steps run as Slurm jobs (m27.executors.slurm)."""

from __future__ import annotations

from dataclasses import dataclass

from m27.events._base import StepEvent, event

# --- slurm: steps run as Slurm jobs (m27.executors.slurm) ----------------------------------------


@event
@dataclass(frozen=True)
class SlurmJobSubmitted(StepEvent):
    """sbatch accepted a step's attempt as Slurm job `job_id` (kept across requeues)."""

    job_id: str
    attempt: int


@event
@dataclass(frozen=True)
class SlurmJobStateChanged(StepEvent):
    """The job's Slurm state changed (PENDING, RUNNING, TIMEOUT, ...); `reason` is Slurm's."""

    job_id: str
    state: str
    reason: str = ""
