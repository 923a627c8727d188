"""decide() at scale: one node of 8 GPUs with a long queue, timed call by call.

The input is what a busy node's agent hands the policy every tick: 8 GPUs, each with a
primary (a tenth of them 2-GPU steps) and its guests, as many as the policy's
``guests_per_gpu`` (``--guests``; a saturated node, as the policy leaves it), and N pending
steps (``--queued``, default 500) of mixed priorities, owners, memory and time limits, 5 %
of them multi-GPU (so a reservation is held and EASY backfill is tried down the queue).
Each call moves `now` on by 50 ms (the agent's tick), so aging and the I/O inference
change as they would. Reported: p50 / p99 per call, against the same input with an empty
queue (the cost floor of a tick) in the same run, and the same queue on a node with one
guest per GPU (``open_slots``): there every call fills the free guest slots (16 grants),
the tick right after guests ended, not a steady one.

    python benchmarks/bench_policy.py [--queued 500] [--calls 400] [--json] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from m27.policy import GpuView, Pending, PolicyConfig, PolicyInput, Running, decide

GiB = 1024**3


def node_input(queued: int, gpus: int = 8, seed: int = 0, guests: int | None = None) -> PolicyInput:
    rng = random.Random(seed)
    per_gpu = PolicyConfig().guests_per_gpu if guests is None else guests
    running: list[Running] = []
    g = 0
    n = 0
    while g < gpus:
        k = 2 if g + 1 < gpus and rng.random() < 0.1 else 1
        running.append(
            Running(
                (f"run{n}", "main"),
                gpus=tuple(range(g, g + k)),
                gpu_memory=int(rng.uniform(4, 20) * GiB),
                priority=rng.choice([10, 10, 30]),
                owner=rng.choice("abcd"),
                started_at=rng.uniform(0, 3000),
                time_limit=rng.choice([None, 7200.0, 14400.0]),
                io_waiting=rng.random() < 0.3,
            )
        )
        running.extend(
            Running(
                (f"run{n}", "guest" if j == 0 else f"guest{j}"),
                role="guest",
                tier="ready",
                gpus=(g,),
                paused=True,
                gpu_memory=int(rng.uniform(2, 8) * GiB),
                priority=10,
                owner=rng.choice("abcd"),
            )
            for j in range(per_gpu)
        )
        g += k
        n += 1
    pending = tuple(
        Pending(
            (f"q{i}", "main"),
            type="gpu_light" if rng.random() < 0.05 else "gpu",
            priority=rng.choice([-5, 10, 10, 10, 30]),
            owner=rng.choice("abcdefgh"),
            gpus=2 if rng.random() < 0.05 else 1,
            gpu_memory=int(rng.uniform(2, 40) * GiB),
            queued_at=rng.uniform(0, 3600),
            time_limit=rng.choice([None, 1800.0, 3600.0, 7200.0]),
        )
        for i in range(queued)
    )
    views = tuple(GpuView(i, 80 * GiB, None, False, 100.0, None) for i in range(gpus))
    return PolicyInput(pending, tuple(running), views, 3600.0, PolicyConfig())


def time_calls(inp: PolicyInput, calls: int) -> dict[str, float]:
    """Wall time and the thread's CPU time per call (CPU time leaves out the time this
    process waited for a core: on a shared machine that is most of a wall p99)."""
    wall, cpu = [], []
    for c in range(calls):
        step = PolicyInput(inp.pending, inp.running, inp.gpus, inp.now + 0.05 * c, inp.config)
        t0, c0 = time.perf_counter(), time.thread_time()
        decide(step)
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - t0)
    out: dict[str, float] = {}
    for name, times in (("wall", wall), ("cpu", cpu)):
        times.sort()
        out[f"{name}_p50_ms"] = round(times[len(times) // 2] * 1000, 3)
        out[f"{name}_p99_ms"] = round(times[min(len(times) - 1, int(0.99 * len(times)))] * 1000, 3)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queued", type=int, default=500)
    p.add_argument(
        "--guests", type=int, default=None, help="guests per GPU (default: the policy's)"
    )
    p.add_argument("--calls", type=int, default=400)
    p.add_argument("--json", action="store_true")
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    inp = node_input(args.queued, guests=args.guests)
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        time_calls(inp, args.calls)
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        return 0
    results: dict[str, Any] = {
        f"queued_{args.queued}": time_calls(inp, args.calls),
        "queued_0": time_calls(node_input(0, guests=args.guests), args.calls),
        f"queued_{args.queued}_open_slots": time_calls(
            node_input(args.queued, guests=1), args.calls
        ),
    }
    results["guests_per_gpu"] = (
        PolicyConfig().guests_per_gpu if args.guests is None else args.guests
    )
    results["target_p99_ms"] = 1.0
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"decide() on 8 GPUs, {args.calls} calls (50 ms apart)")
    for name, row in results.items():
        print(f"{name:<24} {row}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
