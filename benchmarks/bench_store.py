"""Event log benchmark: m27's SQLite EventStore against raw sqlite3 on the same rows.

    python benchmarks/bench_store.py [--events 1000000] [--batch 100] [--json]

A mix of typical events (StepStarted, StepSucceeded, GuestPaused, GuestResumed) is
appended in batches of --batch through ``SqliteEventStore.append`` and, as the baseline,
as pre-encoded rows with a bare ``executemany`` + ``COMMIT`` per batch on a sqlite3
connection with the same pragmas (WAL, synchronous=NORMAL): the floor SQLite itself sets.
Then the whole log is replayed with ``store.read()`` (every row decoded into an event)
against ``SELECT ... fetchall()`` of the raw rows. Ratios are m27 / baseline, same run.
Targets (issue 16): append >= 50k events/s batched, replay of 1M events <= 5 s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from m27.events import Event, GuestPaused, GuestResumed, StepStarted, StepSucceeded, encode
from m27.store.sqlite import SqliteEventStore

TARGET_APPEND_PER_S = 50_000.0
TARGET_REPLAY_1M_S = 5.0


def sample(i: int) -> Event:
    """One of four typical events, cycling (payloads 60-250 bytes of JSON)."""
    at = 1_700_000_000.0 + i * 0.001
    run, step = f"r-{i // 1000:06d}", f"step-{i % 50}"
    match i % 4:
        case 0:
            return StepStarted(
                at=at,
                run_id=run,
                step=step,
                attempt=1,
                pid=10_000 + i % 5000,
                pgid=10_000 + i % 5000,
                command=("python", "md.py", "--steps", "1000"),
                gpus=(i % 8,),
                log_path=f"/home/u/.m27/logs/{run}/{step}.log",
            )
        case 1:
            return GuestPaused(at=at, run_id=run, step=step, gpu=i % 8)
        case 2:
            return GuestResumed(at=at, run_id=run, step=step, gpu=i % 8)
        case _:
            return StepSucceeded(
                at=at, run_id=run, step=step, attempt=1, duration_s=12.5, outputs=("out.gro",)
            )


def bench_m27(path: Path, events: list[Event], batch: int) -> dict[str, float]:
    store = SqliteEventStore(path)
    try:
        started = time.perf_counter()
        for first in range(0, len(events), batch):
            store.append(events[first : first + batch])
        append_s = time.perf_counter() - started
        started = time.perf_counter()
        records = store.read()
        replay_s = time.perf_counter() - started
        assert len(records) == len(events) and records[-1].event == events[-1]
        del records
    finally:
        store.close()
    return {"append_s": append_s, "replay_s": replay_s}


def bench_raw(path: Path, events: list[Event], batch: int) -> dict[str, float]:
    """The floor: the same rows, pre-encoded, inserted and selected with bare sqlite3."""
    rows = [(i + 1, *encode(ev)[:2], ev.at, encode(ev)[2]) for i, ev in enumerate(events)]
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute(
            "CREATE TABLE events (seq INTEGER PRIMARY KEY, kind TEXT NOT NULL,"
            " version INT NOT NULL, at REAL NOT NULL, payload TEXT NOT NULL)"
        )
        started = time.perf_counter()
        for first in range(0, len(rows), batch):
            conn.execute("BEGIN IMMEDIATE")
            chunk = rows[first : first + batch]
            conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?)", chunk)
            conn.execute("COMMIT")
        append_s = time.perf_counter() - started
        started = time.perf_counter()
        got = conn.execute(
            "SELECT seq, kind, version, payload FROM events WHERE seq > 0 ORDER BY seq"
        ).fetchall()
        replay_s = time.perf_counter() - started
        assert len(got) == len(events)
    finally:
        conn.close()
    return {"append_s": append_s, "replay_s": replay_s}


def run(count: int, batch: int, root: Path) -> dict[str, Any]:
    events = [sample(i) for i in range(count)]
    raw = bench_raw(root / "raw.db", events, batch)
    m27 = bench_m27(root / "m27.db", events, batch)
    scale = 1_000_000 / count
    return {
        "events": count,
        "batch": batch,
        "baseline": "bare sqlite3 executemany/SELECT on pre-encoded rows, same pragmas",
        "append_per_s": count / m27["append_s"],
        "append_per_s_baseline": count / raw["append_s"],
        "append_ratio": m27["append_s"] / raw["append_s"],
        "append_target_per_s": TARGET_APPEND_PER_S,
        "replay_s": m27["replay_s"],
        "replay_s_baseline": raw["replay_s"],
        "replay_ratio": m27["replay_s"] / raw["replay_s"],
        "replay_1m_s": m27["replay_s"] * scale,
        "replay_1m_target_s": TARGET_REPLAY_1M_S,
        "append_ok": count / m27["append_s"] >= TARGET_APPEND_PER_S,
        "replay_ok": m27["replay_s"] * scale <= TARGET_REPLAY_1M_S,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="100k events")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    count = 100_000 if args.quick else args.events
    root = Path(tempfile.mkdtemp(prefix="m27-bench-store-"))
    try:
        res = run(count, args.batch, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"\n{count} events, batches of {args.batch}, {time.strftime('%Y-%m-%d %H:%M')}\n")
    print("| metric | m27 | bare sqlite3 | ratio | target |")
    print("|---|---|---|---|---|")
    print(
        f"| append, events/s | {res['append_per_s']:,.0f} | {res['append_per_s_baseline']:,.0f} "
        f"| {res['append_ratio']:.2f}x time | >= {TARGET_APPEND_PER_S:,.0f} |"
    )
    print(
        f"| replay {count} events | {res['replay_s']:.2f} s | {res['replay_s_baseline']:.2f} s "
        f"| {res['replay_ratio']:.2f}x | 1M <= {TARGET_REPLAY_1M_S:.0f} s "
        f"(here {res['replay_1m_s']:.2f} s per 1M) |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
