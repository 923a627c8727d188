"""Simulator benchmarks: the lab week and the Alibaba sample under every policy, and the
speed of the simulator on 10,000 jobs.

    python benchmarks/bench_sim.py [--alibaba ../shared/traces/openb_pod_list_default.csv]
        [--only lab|alibaba|speed ...] [--seeds 3] [--load 1.3] [--speed-jobs N]
        [--speed-policies backfill,m27] [--json]

Prints Markdown tables (pasted into benchmarks/README.md, section Simulator), with the CPU
seconds each policy's simulation took (process time: on a shared machine wall time adds
the wait for a core) and m27's ratio to EASY backfill's, measured in the same run; with
``--json`` the same figures as one JSON object, each part with its ``ratios`` against
the baseline policies of the same run. The lab week runs at ``--load`` 1.3 by default:
issue 16's saturated week (``m27 simulate lab:seed=S,load=1.3``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from m27.sim import POLICIES, SimResult, compare, compute_metrics, simulate
from m27.sim.alibaba import load_alibaba, scale_to_node
from m27.sim.lab import lab_week
from m27.sim.schedulers import make_scheduler
from m27.sim.trace import GIB, Job, Trace

DEFAULT_ALIBABA = Path(__file__).resolve().parents[2] / "shared/traces/openb_pod_list_default.csv"
#: the 204-pod slice kept in the repository (with its attribution), when the full file is absent
SAMPLE_ALIBABA = Path(__file__).resolve().parents[1] / "tests/unit/data/openb_pod_list_sample.csv"


def _h(s: float) -> str:
    return f"{s / 3600:.1f} h"


def lab(seeds: range, load: float) -> dict[str, Any]:
    """Every policy on the lab week of each seed, and m27 against fifo and backfill."""
    out: dict[str, Any] = {}
    for seed in seeds:
        trace = lab_week(seed=seed, load=load)
        per: dict[str, dict[str, Any]] = {}
        for result, m in compare(trace):
            gpu_done = sum(
                1
                for lv in result.jobs
                if lv.job.type == "gpu"
                and lv.finished_at is not None
                and lv.finished_at <= 72 * 3600
            )
            per[m.policy] = {**m.to_json(), "gpu_steps_done_in_window": gpu_done}
        out[str(seed)] = {"policies": per, "ratios": _vs(per, "fifo") | _vs(per, "backfill")}
    return {"load": load, "seeds": out}


def _vs(per: dict[str, dict[str, Any]], base: str) -> dict[str, float]:
    """m27's busy % and makespan as ratios to `base`'s, from the same run."""
    m, b = per.get("m27"), per.get(base)
    out: dict[str, float] = {}
    for key, name in (("busy_pct", "busy"), ("makespan_s", "makespan")):
        if m is not None and b is not None and b[key]:
            out[f"{name}_m27_over_{base}"] = round(m[key] / b[key], 3)
    return out


def lab_table(data: dict[str, Any]) -> str:
    rows = ["| seed | policy | GPU busy % | idle while queued % | jobs done in 72 h (gpu steps) |"]
    rows.append("|---|---|---|---|---|")
    for seed, part in data["seeds"].items():
        for name, m in part["policies"].items():
            rows.append(
                f"| {seed} | {name} | {m['busy_pct']:.1f} | {m['idle_queued_pct']:.1f} | "
                f"{m['jobs_done']}/{m['jobs_total']} ({m['gpu_steps_done_in_window']}) |"
            )
    return "\n".join(rows)


def jct_table(results: list[dict[str, Any]]) -> str:
    classes = sorted({k for m in results for k in m["jct"]})
    head = "| policy | busy % | idle-q % | makespan | " + " | ".join(
        f"JCT {k} mean / p95" for k in classes
    )
    rows = [head + " |", "|---" * (4 + len(classes)) + "|"]
    for m in results:
        jct = m["jct"]
        cells = [
            f"{_h(jct[k]['mean_s'])} / {_h(jct[k]['p95_s'])}" if k in jct else "-" for k in classes
        ]
        rows.append(
            f"| {m['policy']} | {m['busy_pct']:.1f} | {m['idle_queued_pct']:.1f} | "
            f"{_h(m['makespan_s'])} | " + " | ".join(cells) + " |"
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


def cpu_ratio(cpu: dict[str, float]) -> dict[str, float]:
    if "m27" in cpu and cpu.get("backfill"):
        return {"cpu_m27_over_backfill": round(cpu["m27"] / cpu["backfill"], 3)}
    return {}


def cpu_line(cpu: dict[str, float]) -> str:
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in cpu.items())
    ratio = cpu_ratio(cpu)
    tail = f"; m27 / backfill = {ratio['cpu_m27_over_backfill']:.2f}x" if ratio else ""
    return f"Simulation CPU time: {parts}{tail} (load average {os.getloadavg()[0]:.1f})."


def alibaba(source: Path, pods: int) -> dict[str, Any]:
    """Every policy on the Alibaba pods scaled to 8 GPUs; m27 against EASY backfill."""
    trace = scale_to_node(load_alibaba(source, limit=pods), gpus=8, load=0.9)
    per: dict[str, dict[str, Any]] = {}
    cpu: dict[str, float] = {}
    for name in POLICIES:
        result, cpu[name], wall = timed(trace, name)
        per[name] = {
            **compute_metrics(result).to_json(),
            "cpu_s": round(cpu[name], 2),
            "wall_s": round(wall, 2),
            "schedule": schedule_id(result),
        }
    return {
        "trace": trace.name,
        "source": str(source),
        "policies": per,
        "ratios": _vs(per, "backfill") | cpu_ratio(cpu),
        "loadavg": os.getloadavg()[0],
    }


def speed(n: int, policies: Sequence[str] = ("fifo", "backfill", "m27")) -> dict[str, Any]:
    """The simulator's own speed on `n` synthetic jobs, per policy."""
    trace = poisson_trace(n)
    per: dict[str, dict[str, Any]] = {}
    cpu: dict[str, float] = {}
    for name in policies:
        result, cpu[name], wall = timed(trace, name)
        per[name] = {
            "jobs_done": sum(1 for lv in result.jobs if lv.finished_at is not None),
            "decisions": result.decisions,
            "cpu_s": round(cpu[name], 2),
            "wall_s": round(wall, 2),
            "schedule": schedule_id(result),
        }
    return {"jobs": n, "policies": per, "ratios": cpu_ratio(cpu), "loadavg": os.getloadavg()[0]}


def speed_table(data: dict[str, Any]) -> str:
    rows = [
        "| policy | jobs | decisions | CPU s | wall s | schedule |",
        "|---|---|---|---|---|---|",
    ]
    n = data["jobs"]
    for name, p in data["policies"].items():
        rows.append(
            f"| {name} | {p['jobs_done']}/{n} | {p['decisions']} | {p['cpu_s']:.1f} "
            f"| {p['wall_s']:.1f} | `{p['schedule']}` |"
        )
    cpu = {name: p["cpu_s"] for name, p in data["policies"].items()}
    return "\n".join(rows) + "\n\n" + cpu_line(cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--alibaba", type=Path, default=DEFAULT_ALIBABA)
    ap.add_argument("--jobs", type=int, default=2000, help="Alibaba pods (default 2000)")
    ap.add_argument("--seeds", type=int, default=3, help="lab-week seeds 0..N-1 (default 3)")
    ap.add_argument("--load", type=float, default=1.3, help="lab-week load (default 1.3)")
    ap.add_argument("--speed-jobs", type=int, default=10_000)
    ap.add_argument("--speed-policies", default="fifo,backfill,m27")
    ap.add_argument("--only", action="append", choices=["lab", "alibaba", "speed"])
    ap.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    args = ap.parse_args()
    parts = set(args.only or ["lab", "alibaba", "speed"])
    out: dict[str, Any] = {}
    if "lab" in parts:
        out["lab"] = lab(range(args.seeds), args.load)
        if not args.json:
            print(f"## Lab week (4 GPUs, 72 h, load {args.load:g})\n")
            print(lab_table(out["lab"]))
    source = args.alibaba if args.alibaba.exists() else SAMPLE_ALIBABA
    if "alibaba" in parts and source != args.alibaba and not args.json:
        print(f"\n({args.alibaba} not found: using the repository's sample {source.name})")
    if "alibaba" in parts and source.exists():
        data = out["alibaba"] = alibaba(source, args.jobs)
        if not args.json:
            print(f"\n## {data['trace']}\n")
            print(jct_table(list(data["policies"].values())))
            cpu = {name: p["cpu_s"] for name, p in data["policies"].items()}
            print("\n" + cpu_line(cpu))
            ids = ", ".join(f"{name} `{p['schedule']}`" for name, p in data["policies"].items())
            print(f"Schedules (sha1 of every job's finish time): {ids}.")
    if "speed" in parts:
        out["speed"] = speed(args.speed_jobs, args.speed_policies.split(","))
        if not args.json:
            print(f"\n## Speed ({args.speed_jobs} jobs, 8 GPUs)\n")
            print(speed_table(out["speed"]))
    if args.json:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
