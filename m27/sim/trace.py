"""The trace model: jobs made of compute and I/O phases, and its JSON Lines file form.

A trace file is JSON Lines: a first line ``{"trace": {...}}`` with the node (GPUs, GPU
memory, CPU slots, window) and then one job per line. Every loader (lab generator,
Alibaba, event log) produces a :class:`Trace`, so every policy replays the same jobs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from m27._exceptions import SpecError
from m27.policy import StepKey, StepType

PhaseKind = Literal["compute", "io"]
GIB = 2**30


@dataclass(frozen=True)
class Job:
    """One step to replay.

    ``phases`` alternate GPU compute and I/O (seconds, at full speed); ``time_limit`` is
    what the user declared (backfill trusts it; m27 only uses it to pick reservations);
    ``io_hint`` says whether the step marks its I/O waits itself (otherwise m27 infers them
    after ``io_timeout``); ``klass`` is the priority class that JCT is reported by.
    """

    id: str
    arrival: float
    phases: tuple[tuple[PhaseKind, float], ...]
    type: StepType = "gpu"
    priority: int = 0
    owner: str = ""
    gpus: int = 1
    gpu_memory: int = 0
    time_limit: float | None = None
    depends_on: tuple[str, ...] = ()
    io_hint: bool = True
    klass: str = "normal"

    @property
    def key(self) -> StepKey:
        run, _, step = self.id.partition("/")
        return (run, step or "main")

    @property
    def compute_s(self) -> float:
        return sum(s for k, s in self.phases if k == "compute")

    @property
    def duration_s(self) -> float:
        return sum(s for _, s in self.phases)


@dataclass(frozen=True)
class Trace:
    """Jobs and the node they were recorded on (or are meant for)."""

    jobs: tuple[Job, ...]
    gpus: int = 4
    gpu_memory: int = 32 * GIB
    cpu_slots: int = 4
    window: float | None = None
    name: str = "trace"
    meta: dict[str, Any] = field(default_factory=dict)

    def with_gpus(self, gpus: int) -> Trace:
        return replace(self, gpus=gpus)


def save_trace(trace: Trace, path: Path) -> None:
    head = {k: v for k, v in asdict(trace).items() if k != "jobs"}
    with path.open("w") as f:
        f.write(json.dumps({"trace": head}) + "\n")
        for job in trace.jobs:
            f.write(json.dumps(asdict(job), separators=(",", ":")) + "\n")


def load_trace(path: Path) -> Trace:
    """Read a JSON Lines trace; a malformed line fails with its line number."""
    head: dict[str, Any] = {}
    jobs: list[Job] = []
    with path.open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                if "trace" in data:
                    head = dict(data["trace"])
                    continue
                data["phases"] = tuple((str(k), float(s)) for k, s in data["phases"])
                data["depends_on"] = tuple(data.get("depends_on", ()))
                jobs.append(Job(**data))
            except (ValueError, TypeError, KeyError) as exc:
                what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
                raise SpecError(
                    f"{path}:{n}: bad trace line: {what}", file=str(path), line=n
                ) from exc
    head.pop("jobs", None)
    return Trace(jobs=tuple(jobs), **head)


def klass_of(priority: int) -> str:
    """Default priority class names for reports."""
    if priority >= 20:
        return "high"
    if priority < 0:
        return "low"
    return "normal"
