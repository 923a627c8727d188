"""Load the Alibaba GPU cluster trace v2023 (``openb_pod_list_*.csv``) as an m27 trace.

Source: alibaba/clusterdata, cluster-trace-gpu-v2023 ("Beware of Fragmentation:
Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC '23).

Mapping (stated, so results can be judged):

- only pods with ``num_gpu >= 1`` (CPU-only pods do not compete for GPUs);
- duration = ``deletion_time - scheduled_time`` (``creation_time`` when never scheduled),
  capped at ``max_duration`` (pods still running at the trace's end have no real end);
- qos ``LS`` -> class high (priority 20), ``Burstable``/``Guaranteed`` -> normal (10),
  ``BE`` -> low (-5, background under m27);
- ``gpu_milli`` < 1000 (one GPU shared): the pod computes that share of the time and leaves
  the rest idle, modelled as I/O-like gaps in at most ~20 cycles, with no I/O hint; it
  declares that share of the GPU's memory; a whole-GPU pod declares all of it;
- declared time limit = 2 x the real duration rounded up to the hour (backfill needs one);
- ``scale_to_node``: the first ``jobs`` GPU pods by creation time, arrivals compressed so
  the offered GPU work is ``load`` x what ``gpus`` GPUs can do over the arrival span.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Literal

from m27._exceptions import SpecError
from m27.sim.trace import GIB, Job, PhaseKind, Trace

QOS = {"LS": (20, "high"), "Burstable": (10, "normal"), "Guaranteed": (10, "normal")}
BE = (-5, "low")
HOUR = 3600.0


def _phases(duration: float, share: float) -> tuple[tuple[PhaseKind, float], ...]:
    if share >= 1.0:
        return (("compute", duration),)
    period = max(60.0, duration / 20.0)
    cycles = max(1, math.ceil(duration / period))
    c, i = duration / cycles * share, duration / cycles * (1.0 - share)
    out: list[tuple[PhaseKind, float]] = []
    for n in range(cycles):
        out.append(("compute", c))
        if n < cycles - 1:
            out.append(("io", i))
    return tuple(out)


def load_alibaba(
    path: Path,
    *,
    gpu_memory: int = 32 * GIB,
    max_duration: float = 24 * HOUR,
    limit: int | None = None,
) -> list[Job]:
    """GPU pods of the CSV as jobs (arrival = creation_time), in creation order."""
    jobs: list[Job] = []
    rows = _rows(path)
    for n, row in rows:
        gpus = int(_value(path, n, row, "num_gpu", int))
        if gpus < 1:
            continue
        created = _value(path, n, row, "creation_time", float)
        start = _value(path, n, row, "scheduled_time", float, default=created)
        duration = min(max_duration, _value(path, n, row, "deletion_time", float) - start)
        milli = int(_value(path, n, row, "gpu_milli", int, default=1000))
        if duration <= 0:
            continue
        share = min(1.0, milli / 1000.0) if gpus == 1 else 1.0
        priority, klass = QOS.get(row.get("qos", ""), BE)
        limit_s = HOUR * math.ceil(2 * duration / HOUR)
        jobs.append(
            Job(
                id=f"{row['name']}/pod",
                arrival=created,
                phases=_phases(duration, share),
                priority=priority,
                owner=row.get("qos", ""),
                gpus=gpus,
                gpu_memory=max(GIB, int(gpu_memory * share)),
                time_limit=limit_s,
                io_hint=False,
                klass=klass,
            )
        )
        if limit is not None and len(jobs) >= limit:
            break
    return jobs


#: the columns `load_alibaba` reads (``qos`` may be missing: every pod is then best effort)
COLUMNS = ("name", "num_gpu", "gpu_milli", "creation_time", "scheduled_time", "deletion_time")


def _value(
    path: Path,
    n: int,
    row: dict[str, str],
    column: str,
    parse: type[int] | type[float],
    default: float | None = None,
) -> float:
    """`column` of the row on line `n` as a finite number (`default` when empty)."""
    text = (row.get(column) or "").strip()
    if not text and default is not None:
        return default
    try:
        value = parse(text)
        if math.isfinite(value):
            return value
    except ValueError:
        pass
    kind = "a whole number" if parse is int else "a number"
    raise SpecError(
        f"{path}:{n}: bad Alibaba trace row: {column} {text!r} is not {kind}",
        file=str(path),
        line=n,
    )


def _rows(path: Path) -> list[tuple[int, dict[str, str]]]:
    """The CSV's rows with the line each starts on, in creation order (then name)."""
    rows: list[tuple[int, dict[str, str]]] = []
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f, restval="")
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
            if missing:
                raise SpecError(
                    f"{path}: not an Alibaba openb_pod_list CSV: no column "
                    f"{', '.join(missing)} (its header: {','.join(reader.fieldnames or ())})",
                    file=str(path),
                    line=1,
                )
            line = reader.line_num + 1
            for row in reader:
                rows.append((line, row))
                line = reader.line_num + 1
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror or exc}", file=str(path)) from exc
    except (UnicodeDecodeError, csv.Error) as exc:
        what = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else str(exc)
        raise SpecError(f"{path}: bad Alibaba trace: {what}", file=str(path)) from exc
    created: dict[int, int] = {}
    for n, row in rows:
        try:
            created[n] = int(row["creation_time"] or 0)
        except ValueError as exc:
            raise SpecError(
                f"{path}:{n}: bad Alibaba trace row: creation_time {row['creation_time']!r} "
                "is not a whole number of seconds",
                file=str(path),
                line=n,
            ) from exc
    rows.sort(key=lambda r: (created[r[0]], r[1]["name"]))
    return rows


def scale_to_node(
    jobs: list[Job], *, gpus: int = 8, load: float = 0.9, gpu_memory: int = 32 * GIB
) -> Trace:
    """Jobs of a large cluster, arrivals compressed so one `gpus`-GPU node sees `load`."""
    fitting = [j for j in jobs if j.gpus <= gpus]
    if not fitting:
        return Trace(jobs=(), gpus=gpus, gpu_memory=gpu_memory, name="alibaba-empty")
    t0 = min(j.arrival for j in fitting)
    span = max(j.arrival for j in fitting) - t0
    work = sum(j.duration_s * j.gpus for j in fitting)
    factor = work / (gpus * load * span) if span > 0 else 1.0
    scaled = tuple(
        Job(**{**j.__dict__, "arrival": round((j.arrival - t0) * factor, 3)}) for j in fitting
    )
    return Trace(
        jobs=scaled,
        gpus=gpus,
        gpu_memory=gpu_memory,
        cpu_slots=8,
        name=f"alibaba-v2023({len(scaled)} pods, {gpus} GPUs, load {load:g})",
        meta={"source": "alibaba/clusterdata cluster-trace-gpu-v2023", "time_factor": factor},
    )


Kind = Literal["alibaba", "jsonl", "events", "lab"]


def sniff(path: str) -> Kind:
    """What a TRACE argument names."""
    if path == "lab" or path.startswith("lab:"):
        return "lab"
    name = Path(path).name
    if name.endswith(".csv"):
        return "alibaba"
    if name.endswith(".db"):
        return "events"
    return "jsonl"
