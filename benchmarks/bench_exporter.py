"""Scrape cost of `m27 exporter` with 8 simulated GPUs and a 100k-event log.

A scrape must stay fast however long the node's history is: the read model applies only
the events appended since the previous scrape. Prints the median scrape time on an empty
log and on a 100k-event log, with no new events between scrapes and with 100 (both logs
get the same), their ratios, and the one-time fold of the log at start-up.

    python benchmarks/bench_exporter.py [--json] [--events 100000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import generate_latest

from m27 import events as ev
from m27.gpu.sim import SimBackend
from m27.monitoring.exporter import Sampler, build_registry
from m27.store.sqlite import SqliteEventStore

GPUS = 8
SCRAPES = 30
STEPS = ("prep", "md", "analysis")


def run_events(i: int, t: float) -> list[ev.Event]:
    """The ~25 events of one finished three-step run, checkpoints and energy included."""
    run = f"run-{i:06d}"
    out: list[ev.Event] = [
        ev.RunSubmitted(at=t, run_id=run, pipeline="md", spec_path="", steps=STEPS)
    ]
    for k, step in enumerate(STEPS):
        typ = "cpu" if step == "prep" else "gpu"
        gpus = () if typ == "cpu" else (i % GPUS,)
        out += [
            ev.StepQueued(at=t, run_id=run, step=step, type=typ),
            ev.LeaseGranted(at=t + 1, run_id=run, step=step, gpus=gpus),
            ev.StepStarted(
                at=t + 2,
                run_id=run,
                step=step,
                attempt=1,
                pid=10_000 + k,
                pgid=10_000 + k,
                command=("python", f"{step}.py"),
                gpus=gpus,
            ),
        ]
        out += [
            ev.CheckpointWritten(
                at=t + 3 + c,
                run_id=run,
                step=step,
                path=f"/c/{c}",
                sim_step=c,
                bytes_written=1 << 20,
                bytes_total=1 << 24,
                duration_s=0.01,
            )
            for c in range(2)
        ]
        out += [
            ev.StepSucceeded(at=t + 9, run_id=run, step=step, attempt=1, duration_s=7.0),
            ev.LeaseReleased(at=t + 9, run_id=run, step=step, gpus=gpus),
        ]
        if gpus:
            out.append(
                ev.StepEnergyMeasured(at=t + 9, run_id=run, step=step, gpu=gpus[0], joules=2100.0)
            )
    out.append(ev.RunSucceeded(at=t + 10, run_id=run, duration_s=10.0))
    return out


def fill(store: SqliteEventStore, count: int) -> int:
    batch: list[ev.Event] = []
    i = 0
    while store.last_seq() + len(batch) < count:
        batch += run_events(i, 1_700_000_000.0 + i * 10)
        i += 1
        if len(batch) >= 5000:
            store.append(batch)
            batch = []
    store.append(batch)
    return i


def scrape_times(store: SqliteEventStore, new_events: int, start: int) -> tuple[float, float]:
    """(median scrape seconds, start-up seconds), appending `new_events` before each scrape."""
    began = time.perf_counter()
    sampler = Sampler(SimBackend(GPUS), store, node="bench")
    startup = time.perf_counter() - began
    registry = build_registry(sampler)
    generate_latest(registry)
    times = []
    run = start
    for _ in range(SCRAPES):
        added = 0
        while added < new_events:
            batch = run_events(run, 1_800_000_000.0 + run)
            store.append(batch)
            added += len(batch)
            run += 1
        began = time.perf_counter()
        generate_latest(registry)
        times.append(time.perf_counter() - began)
    sampler.close()
    return statistics.median(times), startup


def main() -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--events", type=int, default=100_000)
    args = parser.parse_args()
    res: dict[str, float] = {"gpus": GPUS}
    with tempfile.TemporaryDirectory() as tmp:
        empty = SqliteEventStore(Path(tmp) / "empty.db")
        big = SqliteEventStore(Path(tmp) / "big.db")
        runs = fill(big, args.events)
        res["events"] = float(big.last_seq())
        for new in (0, 100):
            empty_s, _ = scrape_times(empty, new, 0)
            big_s, startup_s = scrape_times(big, new, runs + 10_000 * (new + 1))
            res[f"scrape_empty_ms_new{new}"] = empty_s * 1e3
            res[f"scrape_big_ms_new{new}"] = big_s * 1e3
            res[f"ratio_new{new}"] = big_s / empty_s
        res["startup_fold_s"] = startup_s
        empty.close()
        big.close()
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        for key, value in res.items():
            print(f"{key:<22} {value:10.2f}")
    return res


if __name__ == "__main__":
    main()
