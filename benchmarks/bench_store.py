"""Event log benchmark: m27's SQLite EventStore against raw sqlite3 on the same rows.

    python benchmarks/bench_store.py [--events 1000000] [--batch 100] [--json]

A mix of typical events (StepStarted, StepSucceeded, GuestPaused, GuestResumed) is
appended in batches of --batch through ``SqliteEventStore.append`` and, as the baseline,
as pre-encoded rows with a bare ``executemany`` + ``COMMIT`` per batch on a sqlite3
connection with the same pragmas (WAL, synchronous=NORMAL): the floor SQLite itself sets.
Then the whole log is replayed with ``store.read()`` (every row decoded into an event)
against ``SELECT ... fetchall()`` of the raw rows. The two sides take turns (blocks of
50k events; three replay rounds, the fastest kept), so a busy machine slows both alike.
Ratios are m27 / baseline, same run.
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


class M27Side:
    """m27's store: events encoded and decoded by m27 (what is measured)."""

    def __init__(self, path: Path) -> None:
        self.store = SqliteEventStore(path)

    def append(self, events: list[Event], batch: int) -> None:
        for first in range(0, len(events), batch):
            self.store.append(events[first : first + batch])

    def replay(self) -> int:
        return len(self.store.read())

    def close(self) -> None:
        self.store.close()


class RawSide:
    """The floor: the same rows, pre-encoded, inserted and selected with bare sqlite3."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = NORMAL")
        self.conn.execute(
            "CREATE TABLE events (seq INTEGER PRIMARY KEY, kind TEXT NOT NULL,"
            " version INT NOT NULL, at REAL NOT NULL, payload TEXT NOT NULL)"
        )
        self.seq = 0

    def rows(self, events: list[Event]) -> list[tuple[Any, ...]]:
        out = []
        for ev in events:
            self.seq += 1
            kind, version, payload = encode(ev)
            out.append((self.seq, kind, version, ev.at, payload))
        return out

    def append(self, rows: list[tuple[Any, ...]], batch: int) -> None:
        for first in range(0, len(rows), batch):
            self.conn.execute("BEGIN IMMEDIATE")
            chunk = rows[first : first + batch]
            self.conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?)", chunk)
            self.conn.execute("COMMIT")

    def replay(self) -> int:
        return len(
            self.conn.execute(
                "SELECT seq, kind, version, payload FROM events WHERE seq > 0 ORDER BY seq"
            ).fetchall()
        )

    def close(self) -> None:
        self.conn.close()


#: Events per block: m27 and the baseline take turns, so both see the same machine load.
BLOCK = 50_000
REPLAY_ROUNDS = 3


def run(count: int, batch: int, root: Path) -> dict[str, Any]:
    """Append in alternating blocks, then replay in alternating rounds (fastest kept)."""
    m27, raw = M27Side(root / "m27.db"), RawSide(root / "raw.db")
    append_m27 = append_raw = 0.0
    try:
        for first in range(0, count, BLOCK):
            events = [sample(i) for i in range(first, min(count, first + BLOCK))]
            rows = raw.rows(events)
            began = time.perf_counter()
            raw.append(rows, batch)
            append_raw += time.perf_counter() - began
            began = time.perf_counter()
            m27.append(events, batch)
            append_m27 += time.perf_counter() - began
        replay_m27, replay_raw = [], []
        for _ in range(REPLAY_ROUNDS):
            began = time.perf_counter()
            assert raw.replay() == count
            replay_raw.append(time.perf_counter() - began)
            began = time.perf_counter()
            assert m27.replay() == count
            replay_m27.append(time.perf_counter() - began)
    finally:
        m27.close()
        raw.close()
    scale = 1_000_000 / count
    best_m27, best_raw = min(replay_m27), min(replay_raw)
    return {
        "events": count,
        "batch": batch,
        "baseline": "bare sqlite3 executemany/SELECT on pre-encoded rows, same pragmas,"
        f" alternating with m27 in blocks of {BLOCK} (append) and {REPLAY_ROUNDS} rounds"
        " (replay, fastest of each kept)",
        "append_per_s": count / append_m27,
        "append_per_s_baseline": count / append_raw,
        "append_ratio": append_m27 / append_raw,
        "append_target_per_s": TARGET_APPEND_PER_S,
        "replay_s": best_m27,
        "replay_s_baseline": best_raw,
        "replay_ratio": best_m27 / best_raw,
        "replay_1m_s": best_m27 * scale,
        "replay_1m_target_s": TARGET_REPLAY_1M_S,
        "append_ok": count / append_m27 >= TARGET_APPEND_PER_S,
        "replay_ok": best_m27 * scale <= TARGET_REPLAY_1M_S,
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
