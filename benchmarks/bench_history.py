"""What a command pays for a node's history: `m27 status RUN` and `m27 runs` on a long log.

    python benchmarks/bench_history.py [--runs 15000] [--json]

A log of --runs runs (5 steps each, the 32 events a run appends: 480k events for the
default, a year of 40 runs a day) is written to a temporary SQLite file. Then, in turns
(three rounds, the fastest kept), what the commands read and fold now, against the
baseline of the same file: the whole log folded (what every command did before the log
recorded each event's run). `status`: the outline (every run as a whole) and one old run
in full; `runs`: the outline and the newest 20 in full. Only the reading and folding are
timed, not the printing or the interpreter's start.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from m27 import events as ev
from m27.events.state import NodeState, fill_in, fold, live_runs
from m27.store.sqlite import SqliteEventStore

STEPS = ("prep", "em", "nvt", "md", "ana")


def run_events(i: int) -> list[ev.Event]:
    """The events of one run of 5 steps (3 on GPUs), as `m27 run` and the agent append."""
    r, t = f"md-{i:06d}", 1.7e9 + i * 100.0
    out: list[ev.Event] = [
        ev.RunSubmitted(at=t, run_id=r, pipeline="md", spec_path="/home/u/md.yaml",
                        steps=STEPS, vars={"NSTEPS": "5000"}, owner="ann", pid=4000,
                        host="gpu1", step_types=("cpu", "gpu", "gpu", "gpu", "cpu"))
    ]  # fmt: skip
    for k, s in enumerate(STEPS):
        gpus, kind = ((k % 2,), "gpu") if 0 < k < 4 else ((), "cpu")
        after = (STEPS[k - 1],) if k else ()
        out += [
            ev.StepQueued(at=t, run_id=r, step=s, type=kind, depends_on=after),
            ev.StepRequested(at=t, run_id=r, step=s, type=kind, gpus=len(gpus), owner="ann"),
            ev.LeaseGranted(at=t, run_id=r, step=s, gpus=gpus, channel=f"/tmp/{r}-{s}.chan"),
            ev.StepStarted(at=t, run_id=r, step=s, attempt=1, pid=5000 + k, pgid=5000 + k,
                           command=("gmx", "mdrun", "-deffnm", s), gpus=gpus,
                           log_path=f"/home/u/.m27/runs/{r}/{s}.log"),
            ev.StepSucceeded(at=t + 1, run_id=r, step=s, attempt=1, duration_s=1.0,
                             outputs=(f"{s}.gro",)),
            ev.LeaseReleased(at=t + 1, run_id=r, step=s, gpus=gpus),
        ]  # fmt: skip
    out.append(ev.RunSucceeded(at=t + 5, run_id=r, duration_s=5.0))
    return out


def _in_full(store: SqliteEventStore, pick: Callable[[NodeState], list[str]]) -> NodeState:
    """What m27.cli.commands._common's outline and in_full do."""
    known = fold(store.read_runs((), outline=True))
    wanted = {*pick(known), *(r.run_id for r in live_runs(known))}
    return fill_in(known, fold(store.read_runs(wanted)), wanted)


def _best(fn: Callable[[], object], rounds: int = 3) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def run(runs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="m27-history-") as tmp:
        store = SqliteEventStore(Path(tmp) / "events.db")
        for first in range(0, runs, 200):
            store.append([e for i in range(first, min(runs, first + 200)) for e in run_events(i)])
        events = store.last_seq()
        old = f"md-{runs // 2:06d}"
        whole = _best(lambda: fold(store.read()))
        status = _best(lambda: _in_full(store, lambda _: [old]))
        listing = _best(lambda: _in_full(store, lambda k: list(k.runs)[-20:]))
        one = _in_full(store, lambda _: [old])
        assert one.runs[old].steps["md"].status == "succeeded"  # told in full
        store.close()
    return {
        "runs": runs,
        "events": events,
        "whole_fold_s": whole,
        "status_s": status,
        "runs_s": listing,
        "status_ratio": status / whole,
        "runs_ratio": listing / whole,
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=15_000, help="runs in the log (default 15000)")
    p.add_argument("--quick", action="store_true", help="2,000 runs")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    out = run(2_000 if args.quick else args.runs)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{out['runs']} runs, {out['events']} events")
    print(f"  whole log folded (baseline)  {out['whole_fold_s'] * 1000:8.0f} ms")
    for name in ("status", "runs"):
        ms, ratio = out[f"{name}_s"] * 1000, out[f"{name}_ratio"]
        print(f"  m27 {name:<8} reads+folds     {ms:8.0f} ms  ({ratio:.2f}x the baseline)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
