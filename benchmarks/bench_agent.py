"""The live agent on 2 simulated GPUs: three tiers vs strict FIFO-exclusive, real processes.

Steps alternate compute and I/O phases, like MD writing trajectory frames (compute is a
sleep: a simulated GPU counts a process as computing unless it is at its gate, inside
``m27.io_wait()`` or stopped). All steps are submitted at once to one agent, first with
the default three-tier policy, then with ``PolicyConfig(fifo=True)``. Reported:

- makespan and GPU busy fraction (union of the compute phases the steps recorded, per
  GPU, over GPUs x makespan);
- dispatch latency: lease released -> the next step's process started (fifo), or
  -> the best guest promoted (tiers: the process is already there);
- guest reaction time: primary enters an I/O wait -> a guest computes (from the steps'
  own records) and -> the agent's GuestResumed.

    python benchmarks/bench_agent.py [--steps 8] [--cycles 4] [--compute 0.2] [--io 0.2] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from m27 import events as ev
from m27.executors.local import StepLaunch
from m27.gpu.sim import SimBackend
from m27.node.agent import Agent
from m27.node.lease import AgentLease, run_leased
from m27.policy import PolicyConfig
from m27.store.sqlite import SqliteEventStore

GiB = 1024**3

STEP = textwrap.dedent("""\
    import sys, time
    from m27.step._channel import gate, io_wait
    out, cycles, compute, io = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    rec = open(out, "w", buffering=1)
    with io_wait():
        time.sleep(0.05)  # load the input
    for _ in range(cycles):
        left = compute
        while left > 1e-9:
            gate()
            t = time.time(); time.sleep(min(0.01, left)); left -= 0.01
            rec.write(f"compute {t} {time.time()}\\n")
        with io_wait():
            t = time.time(); time.sleep(io); rec.write(f"io {t} {time.time()}\\n")
""")


def _phases(path: Path, kind: str) -> list[tuple[float, float]]:
    rows = [line.split() for line in path.read_text().splitlines()] if path.exists() else []
    return [(float(a), float(b)) for k, a, b in rows if k == kind]


def _union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def run_mode(fifo: bool, steps: int, cycles: int, compute: float, io: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="m27-bench-agent-") as tmp:
        home = Path(tmp)
        store = SqliteEventStore(home / "events.db")
        backend = SimBackend(2, memory_total=16 * GiB)
        agent = Agent(store, backend, home, config=PolicyConfig(fifo=fifo, cpu_slots=2))
        stop = threading.Event()
        loop = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        loop.start()
        while agent.book.last_seq == 0:
            time.sleep(0.01)
        lease = AgentLease(store, home, embed=False)
        outs = {f"s{i}": home / f"s{i}.txt" for i in range(steps)}
        threads = []
        t0 = time.time()
        for name, out in outs.items():
            argv = (sys.executable, "-c", STEP, str(out), str(cycles), str(compute), str(io))
            launch = StepLaunch("bench", name, argv, log_path=home / f"{name}.log")
            th = threading.Thread(
                target=run_leased,
                args=(lease, launch, "gpu"),
                kwargs={"cancel": threading.Event(), "gpu_memory": GiB},
                daemon=True,
            )
            th.start()
            threads.append(th)
            time.sleep(0.005)  # submission order = queue order
        for th in threads:
            th.join()
        makespan = time.time() - t0
        stop.set()
        loop.join()
        events = [r.event for r in store.read()]
        lease.close()
        agent.close()
        store.close()
        return _measure(events, outs, makespan)


def _measure(events: list[ev.Event], outs: dict[str, Path], makespan: float) -> dict[str, Any]:
    gpu_of = {e.step: e.gpus[0] for e in events if isinstance(e, ev.LeaseGranted)}
    per_gpu: dict[int, list[tuple[float, float]]] = {}
    for name, out in outs.items():
        per_gpu.setdefault(gpu_of[name], []).extend(_phases(out, "compute"))
    busy = sum(_union(spans) for spans in per_gpu.values()) / (2 * makespan)
    # dispatch: each release -> the next start (or promotion) on the same GPU
    dispatch: list[float] = []
    for i, e in enumerate(events):
        if not isinstance(e, ev.LeaseReleased) or not e.gpus:
            continue
        for later in events[i + 1 :]:
            if isinstance(later, ev.Promoted) and later.gpu == e.gpus[0]:
                dispatch.append(later.at - e.at)
                break
            if isinstance(later, ev.StepStarted) and later.gpus == e.gpus:
                granted = next(
                    g for g in events if isinstance(g, ev.LeaseGranted) and g.step == later.step
                )
                if granted.tier == "immediate" and granted.at >= e.at:
                    dispatch.append(later.at - e.at)
                    break
    # guest reaction: a primary's I/O start -> the first guest compute chunk in that I/O
    reaction, resumed = [], []
    primaries: dict[int, str] = {}
    guest_chunks = {n: _phases(p, "compute") for n, p in outs.items()}
    io_spans = {n: _phases(p, "io") for n, p in outs.items()}
    res = [e for e in events if isinstance(e, ev.GuestResumed)]
    for e in events:
        if isinstance(e, ev.LeaseGranted) and e.tier == "immediate":
            primaries[e.gpus[0]] = e.step
    for name, spans in io_spans.items():
        for a, b in spans:
            starts = [
                c
                for other, chunks in guest_chunks.items()
                if other != name and gpu_of[other] == gpu_of[name]
                for c, _ in chunks
                if a <= c <= b
            ]
            if starts:
                reaction.append(min(starts) - a)
            marks = [r.at - a for r in res if r.gpu == gpu_of[name] and a <= r.at <= b]
            if marks:
                resumed.append(min(marks))
    ms = 1000.0
    return {
        "makespan_s": round(makespan, 3),
        "gpu_busy_fraction": round(busy, 3),
        "dispatch_ms_p50": _r(_pct(dispatch, 0.5), ms),
        "dispatch_ms_p99": _r(_pct(dispatch, 0.99), ms),
        "dispatches": len(dispatch),
        "guest_reaction_ms_p50": _r(_pct(reaction, 0.5), ms),
        "guest_reaction_ms_p99": _r(_pct(reaction, 0.99), ms),
        "guest_resumed_ms_p50": _r(_pct(resumed, 0.5), ms),
        "io_waits_used_by_guests": f"{len(reaction)}/{sum(len(s) for s in io_spans.values())}",
    }


def _r(value: float | None, scale: float) -> float | None:
    return None if value is None else round(value * scale, 1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--cycles", type=int, default=4)
    p.add_argument("--compute", type=float, default=0.2)
    p.add_argument("--io", type=float, default=0.2)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    results = {
        mode: run_mode(mode == "fifo", args.steps, args.cycles, args.compute, args.io)
        for mode in ("tiers", "fifo")
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    keys = list(results["tiers"])
    print(f"{'metric':<26} {'three tiers':>12} {'fifo':>12}")
    for k in keys:
        print(f"{k:<26} {results['tiers'][k]!s:>12} {results['fifo'][k]!s:>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
