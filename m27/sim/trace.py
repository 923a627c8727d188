"""The trace model: jobs made of compute and I/O phases, and its JSON Lines file form.

A trace file is JSON Lines: a first line ``{"trace": {...}}`` with the node (GPUs, GPU
memory, CPU slots, window) and then one job per line. Every loader (lab generator,
Alibaba, event log) produces a :class:`Trace`, so every policy replays the same jobs.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, NoReturn

from m27._exceptions import SpecError
from m27.policy import PRIORITY_LIMIT, StepKey, StepType
from m27.units import quoted

PhaseKind = Literal["compute", "io"]
GIB = 2**30
#: The longest time a trace may name (~31 years): a phase of 1e308 s made busy % a NaN
#: and the makespan a 300-digit number.
MAX_SECONDS = 1e9
#: The largest node m27 simulates (`m27 simulate --gpus`).
MAX_GPUS = 1024


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
    """Read a JSON Lines trace; a malformed line fails with its line number, and so does a
    job the simulator could only replay as nonsense (a negative phase, an unknown phase kind
    or step type, an id used twice). A dependency on an id that is not in the trace is
    ignored, as the simulator does: a trace from an event log leaves out unfinished steps."""
    head: dict[str, Any] = {}
    jobs: list[Job] = []
    lines: dict[str, int] = {}
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            data = _decode(path, n, raw)
            if data is None:
                continue
            if "trace" in data:
                head = _head(path, n, data["trace"])
                continue
            job = _job(path, n, data)
            if job.id in lines:
                _bad(path, n, f"job id {job.id!r} is already used on line {lines[job.id]}")
            lines[job.id] = n
            jobs.append(job)
    if (cycle := _cycle(jobs)) is not None:
        # no policy could start any job of it: "0/2 done", and no word why
        _bad(path, lines[cycle[0]], f"jobs depend on each other in a cycle: {' -> '.join(cycle)}")
    return Trace(jobs=tuple(jobs), **head)


def _cycle(jobs: list[Job]) -> list[str] | None:
    """One dependency cycle among `jobs` (a job on itself included), as ids from the
    first back to it; None when there is none. Iterative: a chain of 100,000 jobs."""
    deps = {j.id: list(j.depends_on) for j in jobs}
    done: set[str] = set()
    for root in deps:
        if root in done:
            continue
        path, on_path = [root], {root}
        stack = [iter(deps[root])]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
                stack.pop()
                continue
            if nxt not in deps or nxt in done:
                continue
            if nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            path.append(nxt)
            on_path.add(nxt)
            stack.append(iter(deps[nxt]))
    return None


def job_problem(job: Job) -> str | None:
    """Why `job` cannot be replayed as written, or None."""
    if not isinstance(job.id, str) or not job.id:
        return "id must be a non-empty string"
    if job.type not in ("cpu", "gpu", "gpu_light"):
        return f"unknown type {job.type!r} (cpu, gpu or gpu_light)"
    if not _number(job.arrival) or not 0 <= job.arrival <= MAX_SECONDS:
        return f"arrival must be a number of seconds from 0 to {MAX_SECONDS:g}, not {job.arrival!r}"
    if not job.phases:
        return "phases is empty (give at least one [compute|io, seconds])"
    for kind, seconds in job.phases:
        if kind not in ("compute", "io"):
            return f"unknown phase kind {kind!r} (compute or io)"
        if not _number(seconds) or not 0 <= seconds <= MAX_SECONDS:
            return f"a phase lasts from 0 to {MAX_SECONDS:g} seconds, not {seconds!r}"
    if not all(isinstance(d, str) for d in job.depends_on):
        return "depends_on is a list of job ids"
    if isinstance(job.priority, bool) or not isinstance(job.priority, int):
        return f"priority must be a whole number, not {job.priority!r}"
    if abs(job.priority) > PRIORITY_LIMIT:
        return f"priority must be within ±{PRIORITY_LIMIT:,}, not {job.priority}"
    if isinstance(job.gpus, bool) or not isinstance(job.gpus, int) or job.gpus < 0:
        return f"gpus must be a whole number >= 0, not {job.gpus!r}"
    if job.gpus > MAX_GPUS:
        return f"gpus must be at most {MAX_GPUS} (the largest node m27 simulates), not {job.gpus}"
    if job.type != "cpu" and job.gpus < 1:
        return f"a {job.type} job needs at least 1 GPU"
    if isinstance(job.gpu_memory, bool) or not isinstance(job.gpu_memory, int):
        return f"gpu_memory must be a whole number of bytes, not {job.gpu_memory!r}"
    if job.gpu_memory < 0:
        return f"gpu_memory cannot be negative: {job.gpu_memory}"
    if job.time_limit is not None and (not _number(job.time_limit) or job.time_limit <= 0):
        return f"time_limit must be a number of seconds > 0, not {job.time_limit!r}"
    return None


def _decode(path: Path, n: int, raw: bytes) -> dict[str, Any] | None:
    """The object on line `n` (a job, or the ``{"trace": ...}`` head); None when blank."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        _bad(path, n, f"not UTF-8 text ({exc.reason} at byte {exc.start + 1} of the line)")
    if not line.strip():
        return None
    try:
        data = json.loads(line)
    except ValueError as exc:
        _bad(path, n, f"not JSON: {exc}")
    if not isinstance(data, dict):
        _bad(path, n, f"a job is a JSON object, not {type(data).__name__}")
    if "trace" in data and not isinstance(data["trace"], dict):
        _bad(path, n, 'the trace head is an object: {"trace": {"gpus": 4, ...}}')
    return data


_HEAD = {"gpus": 1, "gpu_memory": 0, "cpu_slots": 1}  # whole-number fields and their least


def _head(path: Path, n: int, head: dict[str, Any]) -> dict[str, Any]:
    """The node of a ``{"trace": {...}}`` line, checked field by field."""
    head = {k: v for k, v in head.items() if k != "jobs"}
    known = {"gpus", "gpu_memory", "cpu_slots", "window", "name", "meta"}
    for key, value in head.items():
        if key not in known:
            _bad(path, n, f"unknown trace field {key!r} ({', '.join(sorted(known))})")
        least = _HEAD.get(key)
        if least is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < least
        ):
            _bad(path, n, f"trace {key} must be a whole number >= {least}, not {value!r}")
    window = head.get("window")
    if window is not None and (not _number(window) or window <= 0):
        _bad(path, n, f"trace window must be a number of seconds > 0, not {window!r}")
    if not isinstance(head.get("name", ""), str) or not isinstance(head.get("meta", {}), dict):
        _bad(path, n, "trace name is a string and meta an object")
    return head


def _job(path: Path, n: int, data: dict[str, Any]) -> Job:
    phases = data.get("phases")
    well_formed = isinstance(phases, list) and all(
        isinstance(p, list) and len(p) == 2 for p in phases
    )
    if "phases" in data and not well_formed:
        # `"phases": "abc"` said "not enough values to unpack (expected 2, got 1)"
        _bad(path, n, f'phases is a list of ["compute"|"io", seconds], not {quoted(phases)}')
    try:
        data["phases"] = tuple((str(k), float(s)) for k, s in data["phases"])
        if isinstance(deps := data.get("depends_on", ()), str):
            _bad(path, n, f"depends_on is a list of job ids: [{deps!r}], not {deps!r}")
        data["depends_on"] = tuple(deps)
        job = Job(**data)
    except (ValueError, TypeError, KeyError) as exc:
        _bad(path, n, f"missing field {exc}" if isinstance(exc, KeyError) else str(exc))
    if (problem := job_problem(job)) is not None:
        _bad(path, n, f"job {job.id!r}: {problem}" if isinstance(job.id, str) else problem)
    return job


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _bad(path: Path, n: int, what: str) -> NoReturn:
    raise SpecError(f"{path}:{n}: bad trace line: {what}", file=str(path), line=n)


def klass_of(priority: int) -> str:
    """Default priority class names for reports."""
    if priority >= 20:
        return "high"
    if priority < 0:
        return "low"
    return "normal"
