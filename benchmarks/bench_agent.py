"""The live agent on 2 simulated GPUs: three tiers vs strict FIFO-exclusive, real processes.

Steps alternate compute and I/O phases, like MD writing trajectory frames (compute is a
sleep in 2 ms chunks with a ``m27.gate()`` call before each: a simulated GPU counts a
process as computing unless it is at its gate, inside ``m27.io_wait()`` or stopped). All
steps are submitted at once to one agent, in four modes:

- ``tiers``: the default three-tier policy, standby guests following their primary's
  hint and the agent waking on I/O changes (m27.node.follow);
- ``tiers_tick``: the same policy, tick-driven as before (the baseline for the reaction
  times: the agent acts every ``io_timeout`` = 50 ms, guests wait for its word);
- ``tiers_inferred``: the agent ignores the hints, so it infers every I/O wait from the
  primary's utilization (the black-box path);
- ``fifo``: ``PolicyConfig(fifo=True)``, strict FIFO-exclusive (the baseline for busy).

Reported:

- makespan and GPU busy fraction (union of the compute phases the steps recorded, per
  GPU, over GPUs x makespan);
- dispatch latency: lease released -> the next step's process started (fifo), or
  -> the best guest promoted (tiers: the process is already there);
- guest reaction time: primary enters an I/O wait -> a guest computes (from the steps'
  own records; only waits with a guest loaded and not in its own I/O) and -> the agent's
  GuestResumed;
- guest pause time: the primary computes again after an I/O wait (its first compute
  chunk) -> the guest's last compute chunk begun before that ends (0 if it ended first;
  not after the primary's last wait, when it exits instead of computing and the guest
  rightly goes on);
- primary waits: the primary leaves its I/O wait -> it computes again: its own gate call
  plus, where it yields to a guest as high in rank (``PolicyConfig.primary_yield``), the
  rest of that guest's compute phase;
- guest handover: inside a primary's I/O wait, the computing guest enters its own I/O
  while another guest is loaded and not in its own -> a guest computes again.

Each step is a new Python process importing ``m27.step``; m27's modules are byte-compiled
first (as ``pip install`` leaves them), so a step does not compile them again at every
start where ``PYTHONDONTWRITEBYTECODE`` is set (``--no-compile``: as found).

    python benchmarks/bench_agent.py [--steps 8] [--cycles 4] [--compute 0.2] [--io 0.2] [--json]
        [--modes tiers,tiers_tick,tiers_inferred,fifo] [--no-compile]
"""

from __future__ import annotations

import argparse
import compileall
import json
import math
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
from m27.policy import Decision, PolicyConfig, StepKey
from m27.store.sqlite import SqliteEventStore

GiB = 1024**3

STEP = textwrap.dedent("""\
    import sys, time
    from m27.step import gate, io_wait
    out, cycles, compute, io = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    rec = open(out, "w", buffering=1)
    with io_wait():
        time.sleep(0.05)  # load the input
    rec.write(f"ready {time.time()} {time.time()}\\n")
    for _ in range(cycles):
        left = compute
        while left > 1e-9:
            gate()
            t = time.time(); time.sleep(min(0.002, left)); e = time.time(); left -= e - t
            rec.write(f"compute {t} {e}\\n")
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


class TickAgent(Agent):
    """The agent as it was: guests wait for its word, given once per tick."""

    def _follow(self, decision: Decision, now: float) -> None:
        pass

    def _wait(self, timeout: float) -> int:
        return self.poll(timeout)


class InferringAgent(Agent):
    """An agent that does not read the hints: every I/O wait is inferred."""

    def _io_waiting(self, key: StepKey) -> bool:
        return False

    def _hints(self, key: StepKey) -> bool:
        return False


AGENTS: dict[str, type[Agent]] = {
    "tiers": Agent,
    "tiers_tick": TickAgent,
    "tiers_inferred": InferringAgent,
    "fifo": Agent,
}


def run_mode(
    mode: str,
    steps: int,
    cycles: int,
    compute: float,
    io: float,
    gpus: int = 2,
    gpu_memory: int = GiB,
    guests_per_gpu: int = PolicyConfig().guests_per_gpu,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="m27-bench-agent-") as tmp:
        home = Path(tmp)
        store = SqliteEventStore(home / "events.db")
        backend = SimBackend(gpus, memory_total=16 * GiB)
        config = PolicyConfig(fifo=mode == "fifo", cpu_slots=2, guests_per_gpu=guests_per_gpu)
        agent = AGENTS[mode](store, backend, home, config=config)
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
                kwargs={"cancel": threading.Event(), "gpu_memory": gpu_memory},
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
        result = _measure(events, outs, makespan, gpus)
        runs = [_run_span(out) for out in outs.values()]
        span = max(b for _, b in runs) - min(a for a, _ in runs)
        result["span_over_sum"] = round(span / sum(b - a for a, b in runs), 3)
        return result


def _run_span(out: Path) -> tuple[float, float]:
    """A step's own first and last record: the time it ran (loading included)."""
    rows = [_phases(out, k) for k in ("ready", "compute", "io")]
    starts = [a for spans in rows for a, _ in spans]
    ends = [b for spans in rows for _, b in spans]
    return min(starts), max(ends)


def _measure(
    events: list[ev.Event], outs: dict[str, Path], makespan: float, gpus: int = 2
) -> dict[str, Any]:
    gpu_of = {e.step: e.gpus[0] for e in events if isinstance(e, ev.LeaseGranted)}
    per_gpu: dict[int, list[tuple[float, float]]] = {}
    for name, out in outs.items():
        per_gpu.setdefault(gpu_of[name], []).extend(_phases(out, "compute"))
    busy = sum(_union(spans) for spans in per_gpu.values()) / (gpus * makespan)
    # dispatch: each primary's release -> the next start (or promotion) on the same GPU (a
    # guest that ends, which it may before its primary, frees no GPU)
    dispatch: list[float] = []
    primary_now: dict[int, str] = {}
    for i, e in enumerate(events):
        if isinstance(e, ev.LeaseGranted) and e.tier == "immediate" and e.gpus:
            primary_now[e.gpus[0]] = e.step
        elif isinstance(e, ev.Promoted):
            primary_now[e.gpu] = e.step
        if not isinstance(e, ev.LeaseReleased) or not e.gpus:
            continue
        if primary_now.get(e.gpus[0]) != e.step:
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
    # (only I/O waits of a step while it is its GPU's primary, with a guest loaded)
    reaction, resumed, pause, handover, waited = [], [], [], [], []
    primaries: dict[int, str] = {}
    guest_chunks = {n: _phases(p, "compute") for n, p in outs.items()}
    io_spans = {n: _phases(p, "io") for n, p in outs.items()}
    res = [e for e in events if isinstance(e, ev.GuestResumed)]
    primary_from: dict[str, float] = {}  # when each step became its GPU's primary
    for e in events:
        if isinstance(e, ev.LeaseGranted) and e.tier == "immediate":
            primaries[e.gpus[0]] = e.step
            primary_from[e.step] = e.at
        elif isinstance(e, ev.Promoted):
            primary_from[e.step] = e.at
    ready = {n: min((a for a, _ in _phases(p, "ready")), default=math.inf) for n, p in outs.items()}
    done = {n: max((b for _, b in guest_chunks[n] + io_spans[n]), default=0.0) for n in outs}
    for name, spans in io_spans.items():
        for a, b in spans:
            # only I/O waits with a guest already loaded and at its gate count: the time a
            # guest takes to start (import, load) or to end its own I/O is not a reaction
            if a < primary_from.get(name, math.inf) or not any(
                ready[o] < a < done[o] and not any(x <= a <= y for x, y in io_spans[o])
                for o in outs
                if o != name and gpu_of[o] == gpu_of[name]
            ):
                continue
            starts = [
                c
                for other, chunks in guest_chunks.items()
                if other != name and gpu_of[other] == gpu_of[name]
                for c, _ in chunks
                if a <= c <= b
            ]
            if starts:
                reaction.append(min(starts) - a)
                # the primary computes again at its first chunk after the wait (it may
                # first yield to an equal guest ending its phase); the guests' chunks begun
                # before that must end by then (after its last wait it exits instead)
                again = [c for c, _ in guest_chunks[name] if c >= b]
                if again and (a, b) != spans[-1]:
                    ends = [
                        d
                        for other, chunks in guest_chunks.items()
                        if other != name and gpu_of[other] == gpu_of[name]
                        for c, d in chunks
                        if a <= c < min(again)
                    ]
                    pause.append(max(0.0, max(ends) - min(again)))
                    waited.append(min(again) - b)
            marks = [r.at - a for r in res if r.gpu == gpu_of[name] and a <= r.at <= b]
            if marks:
                resumed.append(min(marks))
            handover.extend(_handovers(name, (a, b), outs, gpu_of, guest_chunks, io_spans, ready))
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
        "guest_resumed_ms_p99": _r(_pct(resumed, 0.99), ms),
        "guest_pause_ms_p50": _r(_pct(pause, 0.5), ms),
        "guest_pause_ms_p99": _r(_pct(pause, 0.99), ms),
        "primary_waits_ms_p50": _r(_pct(waited, 0.5), ms),
        "primary_waits_ms_p99": _r(_pct(waited, 0.99), ms),
        "io_waits_used_by_guests": f"{len(reaction)}/{sum(len(s) for s in io_spans.values())}",
        "guest_handover_ms_p50": _r(_pct(handover, 0.5), ms),
        "guest_handover_ms_p99": _r(_pct(handover, 0.99), ms),
    }


def _handovers(
    primary: str,
    wait: tuple[float, float],
    outs: dict[str, Path],
    gpu_of: dict[str, int],
    chunks: dict[str, list[tuple[float, float]]],
    io_spans: dict[str, list[tuple[float, float]]],
    ready: dict[str, float],
) -> list[float]:
    """Within one I/O wait of `primary`: each time the guest computing in it enters its
    own I/O while another guest is loaded and out of its own, the time until a guest
    computes again (another one, or the same one back from its I/O)."""
    a, b = wait
    gpu = gpu_of[primary]
    guests = [o for o in outs if o != primary and gpu_of[o] == gpu]
    out = []
    for g in guests:
        for x, _ in io_spans[g]:
            if not a < x < b or not any(a <= c <= x for c, _ in chunks[g]):
                continue  # not the guest that was computing in this wait
            others = [
                o
                for o in guests
                if o != g and ready[o] < x and not any(p <= x <= q for p, q in io_spans[o])
            ]
            later = [c for o in guests for c, _ in chunks[o] if x <= c <= b]
            if others and later:
                out.append(min(later) - x)
    return out


def _r(value: float | None, scale: float) -> float | None:
    return None if value is None else round(value * scale, 1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--cycles", type=int, default=4)
    p.add_argument("--compute", type=float, default=0.2)
    p.add_argument("--io", type=float, default=0.2)
    p.add_argument("--modes", default=",".join([*AGENTS, "pair"]))
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--no-compile", action="store_true", help="do not byte-compile m27 first (see above)"
    )
    p.add_argument(
        "--guests-per-gpu",
        type=int,
        default=PolicyConfig().guests_per_gpu,
        help="the policy's guests_per_gpu for the tiers modes (default: the policy's)",
    )
    args = p.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if not args.no_compile:
        import m27

        compileall.compile_dir(Path(m27.__file__).parent, quiet=2)
    results: dict[str, Any] = {
        mode: run_mode(
            mode, args.steps, args.cycles, args.compute, args.io, guests_per_gpu=args.guests_per_gpu
        )
        for mode in modes
        if mode in AGENTS
    }
    # Two I/O-bound steps on one GPU, with and without a declared gpu_memory (issue 16.3)
    for label, memory in (("pair_declared", GiB), ("pair_undeclared", 0)):
        if "pair" in modes or label in modes:
            results[label] = run_mode("tiers", 2, 4, args.compute, args.io, 1, memory)
    ratios = _ratios(results)
    if args.json:
        print(json.dumps({**results, "ratios": ratios}, indent=2))
        return 0
    keys = list(next(iter(results.values())))
    cols = list(results)
    print(f"{'metric':<26}" + "".join(f" {m:>15}" for m in cols))
    for k in keys:
        print(f"{k:<26}" + "".join(f" {results[m][k]!s:>15}" for m in cols))
    for k, v in ratios.items():
        print(f"{k}: {v}")
    return 0


def _ratios(results: dict[str, Any]) -> dict[str, float]:
    """Each figure against its baseline in the same run."""
    out: dict[str, float] = {}

    def ratio(name: str, a: str, b: str, key: str) -> None:
        x, y = results.get(a, {}).get(key), results.get(b, {}).get(key)
        if x is not None and y:
            out[name] = round(x / y, 3)

    ratio("busy_tiers_over_fifo", "tiers", "fifo", "gpu_busy_fraction")
    ratio("makespan_tiers_over_fifo", "tiers", "fifo", "makespan_s")
    ratio("reaction_p99_tiers_over_tick", "tiers", "tiers_tick", "guest_reaction_ms_p99")
    ratio("pause_p99_tiers_over_tick", "tiers", "tiers_tick", "guest_pause_ms_p99")
    ratio("handover_p99_tiers_over_tick", "tiers", "tiers_tick", "guest_handover_ms_p99")
    ratio("pair_undeclared_over_declared", "pair_undeclared", "pair_declared", "span_over_sum")
    return out


if __name__ == "__main__":
    sys.exit(main())
