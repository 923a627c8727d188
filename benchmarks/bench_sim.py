"""Simulator benchmarks: the lab week and the Alibaba sample under every policy, and the
speed of the simulator on 10,000 jobs.

    python benchmarks/bench_sim.py [--alibaba ../shared/traces/openb_pod_list_default.csv]
        [--only lab|alibaba|speed ...] [--speed-jobs N] [--speed-policies backfill,m27]

Prints Markdown tables (pasted into benchmarks/README.md, section Simulator), with the CPU
seconds each policy's simulation took (process time: on a shared machine wall time adds
the wait for a core) and m27's ratio to EASY backfill's, measured in the same run.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path

from m27.sim import POLICIES, SimResult, compare, compute_metrics, simulate
from m27.sim.alibaba import load_alibaba, scale_to_node
from m27.sim.lab import lab_week
from m27.sim.metrics import Metrics
from m27.sim.schedulers import make_scheduler
from m27.sim.trace import GIB, Job, Trace

DEFAULT_ALIBABA = Path(__file__).resolve().parents[2] / "shared/traces/openb_pod_list_default.csv"
#: the 204-pod slice kept in the repository (with its attribution), when the full file is absent
SAMPLE_ALIBABA = Path(__file__).resolve().parents[1] / "tests/unit/data/openb_pod_list_sample.csv"


def _h(s: float) -> str:
    return f"{s / 3600:.1f} h"


def lab_table(seeds: range) -> str:
    rows = ["| seed | policy | GPU busy % | idle while queued % | jobs done in 72 h (gpu steps) |"]
    rows.append("|---|---|---|---|---|")
    for seed in seeds:
        trace = lab_week(seed=seed)
        for result, m in compare(trace):
            gpu_done = sum(
                1
                for lv in result.jobs
                if lv.job.type == "gpu"
                and lv.finished_at is not None
                and lv.finished_at <= 72 * 3600
            )
            rows.append(
                f"| {seed} | {m.policy} | {m.busy_pct:.1f} | {m.idle_queued_pct:.1f} | "
                f"{m.jobs_done}/{m.jobs_total} ({gpu_done}) |"
            )
    return "\n".join(rows)


def jct_table(results: list[Metrics]) -> str:
    classes = sorted({k for m in results for k in m.jct})
    head = "| policy | busy % | idle-q % | makespan | " + " | ".join(
        f"JCT {k} mean / p95" for k in classes
    )
    rows = [head + " |", "|---" * (4 + len(classes)) + "|"]
    for m in results:
        cells = [
            f"{_h(m.jct[k]['mean_s'])} / {_h(m.jct[k]['p95_s'])}" if k in m.jct else "-"
            for k in classes
        ]
        rows.append(
            f"| {m.policy} | {m.busy_pct:.1f} | {m.idle_queued_pct:.1f} | {_h(m.makespan_s)} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(rows)


def poisson_trace(n: int, gpus: int = 8, load: float = 0.85, seed: int = 0) -> Trace:
    """n single- and multi-GPU jobs with I/O phases, Poisson arrivals at `load`."""
    rng = random.Random(seed)
    jobs = []
    t = 0.0
    mean_work = 0.0
    specs = []
    for i in range(n):
        k = 2 if rng.random() < 0.05 else 1
        compute = rng.expovariate(1 / 1800)
        phases = []
        left = compute
        while left > 0:
            c = min(left, rng.uniform(300, 900))
            phases.append(("compute", c))
            left -= c
            if left > 0:
                phases.append(("io", rng.uniform(30, 120)))
        specs.append((i, k, tuple(phases)))
        mean_work += k * sum(s for _, s in phases)
    mean_work /= n
    rate = gpus * load / mean_work
    for i, k, job_phases in specs:
        t += rng.expovariate(rate)
        prio = rng.choice([30, 10, 10, 10, -5])
        jobs.append(
            Job(
                id=f"j{i}/main",
                arrival=t,
                phases=job_phases,  # type: ignore[arg-type]
                priority=prio,
                owner=rng.choice("abcd"),
                gpus=k,
                gpu_memory=int(rng.uniform(2, 14) * GIB),
                time_limit=2 * sum(s for _, s in job_phases) + 600,
                io_hint=rng.random() < 0.5,
                klass="high" if prio >= 20 else "low" if prio < 0 else "normal",
            )
        )
    return Trace(jobs=tuple(jobs), gpus=gpus, name=f"poisson({n})")


def schedule_id(result: SimResult) -> str:
    """The schedule's fingerprint: sha1 of every job's finish time (a speed change of the
    simulator or the policy must leave it as it was)."""
    ends = sorted((lv.job.id, lv.finished_at) for lv in result.jobs)
    return hashlib.sha1(repr(ends).encode()).hexdigest()[:12]


def timed(trace: Trace, name: str) -> tuple[SimResult, float, float]:
    """One policy's simulation, with its CPU and wall seconds."""
    c0, t0 = time.process_time(), time.perf_counter()
    result = simulate(trace, make_scheduler(name))
    return result, time.process_time() - c0, time.perf_counter() - t0


def cpu_line(cpu: dict[str, float]) -> str:
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in cpu.items())
    ratio = (
        f"; m27 / backfill = {cpu['m27'] / cpu['backfill']:.2f}x"
        if "m27" in cpu and cpu.get("backfill")
        else ""
    )
    return f"Simulation CPU time: {parts}{ratio} (load average {os.getloadavg()[0]:.1f})."


def speed(n: int, policies: Sequence[str] = ("fifo", "backfill", "m27")) -> str:
    trace = poisson_trace(n)
    rows = [
        "| policy | jobs | decisions | CPU s | wall s | schedule |",
        "|---|---|---|---|---|---|",
    ]
    cpu = {}
    for name in policies:
        result, cpu[name], wall = timed(trace, name)
        done = sum(1 for lv in result.jobs if lv.finished_at is not None)
        rows.append(
            f"| {name} | {done}/{n} | {result.decisions} | {cpu[name]:.1f} | {wall:.1f} "
            f"| `{schedule_id(result)}` |"
        )
    return "\n".join(rows) + "\n\n" + cpu_line(cpu)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--alibaba", type=Path, default=DEFAULT_ALIBABA)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--speed-jobs", type=int, default=10_000)
    ap.add_argument("--speed-policies", default="fifo,backfill,m27")
    ap.add_argument("--only", action="append", choices=["lab", "alibaba", "speed"])
    args = ap.parse_args()
    parts = set(args.only or ["lab", "alibaba", "speed"])
    if "lab" in parts:
        print("## Lab week (4 GPUs, 72 h)\n")
        print(lab_table(range(args.seeds)))
    source = args.alibaba if args.alibaba.exists() else SAMPLE_ALIBABA
    if "alibaba" in parts and source != args.alibaba:
        print(f"\n({args.alibaba} not found: using the repository's sample {source.name})")
    if "alibaba" in parts and source.exists():
        trace = scale_to_node(load_alibaba(source, limit=args.jobs), gpus=8, load=0.9)
        print(f"\n## {trace.name}\n")
        cpu: dict[str, float] = {}
        results = []
        ids = []
        for name in POLICIES:
            result, cpu[name], _ = timed(trace, name)
            results.append(compute_metrics(result))
            ids.append(f"{name} `{schedule_id(result)}`")
        print(jct_table(results))
        print("\n" + cpu_line(cpu))
        print(f"Schedules (sha1 of every job's finish time): {', '.join(ids)}.")
    if "speed" in parts:
        print(f"\n## Speed ({args.speed_jobs} jobs, 8 GPUs)\n")
        print(speed(args.speed_jobs, args.speed_policies.split(",")))


if __name__ == "__main__":
    main()
