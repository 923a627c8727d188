"""Event log benchmark: m27's SQLite EventStore against raw sqlite3 on the same rows.

    python benchmarks/bench_store.py [--events 1000000] [--batch 100] [--named] [--fold] [--json]

A mix of typical events (StepStarted, StepSucceeded, GuestPaused, GuestResumed) is
appended in batches of --batch through ``SqliteEventStore.append`` and, as the baseline,
as pre-encoded rows (the very payloads m27 stores: positional JSON arrays) with a bare
``executemany`` + ``COMMIT`` per batch on a sqlite3 connection with the same pragmas (WAL,
synchronous=NORMAL): the floor SQLite itself sets. Then the whole log is replayed with
``store.read()`` (every row decoded into an event) against ``SELECT ... fetchall()`` of
the raw rows. The two sides take turns (blocks of 50k events; three replay rounds, the
fastest kept), so a busy machine slows both alike. A replay's time includes freeing what
it read (the list is dropped), on both sides; ``replay_free_s*`` says how much of it that
was. ``--named`` also replays the same events stored in the named format (JSON objects,
what every log before schema version 2 holds) through the same m27, in the same rounds.
``--fold`` also folds each m27 replay into the projection (``m27.events.state.fold``: what
the agent and ``m27 replay`` do with a replay), timed on its own (``fold_s*``). Ratios are
m27 / baseline, same run, in wall time and in CPU time of this process (the
steadier figure on a shared machine); the load average is recorded before and after.
Targets (issue 16): append >= 50k events/s batched, replay of 1M events <= 5 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from m27.events import (
    Event,
    GuestPaused,
    GuestResumed,
    RunSubmitted,
    StepStarted,
    StepSucceeded,
    encode,
    encode_positional,
)
from m27.events.state import fold
from m27.store.sqlite import SqliteEventStore

TARGET_APPEND_PER_S = 50_000.0
TARGET_REPLAY_1M_S = 5.0


def sample(i: int) -> Event:
    """One of four typical events, cycling (payloads 60-250 bytes of JSON); every 1000th
    submits the run the next 999 are about (so a fold has runs and steps to change)."""
    at = 1_700_000_000.0 + i * 0.001
    run, step = f"r-{i // 1000:06d}", f"step-{i % 50}"
    if i % 1000 == 0:
        return RunSubmitted(
            at=at, run_id=run, pipeline="md", spec_path="/home/u/md.yaml", steps=STEPS
        )
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
                at=at,
                run_id=run,
                step=step,
                attempt=1,
                duration_s=12.5,
                outputs=("out.gro",),
            )


STEPS = tuple(f"step-{i}" for i in range(50))


class M27Side:
    """m27's store: events encoded and decoded by m27 (what is measured)."""

    def __init__(self, path: Path) -> None:
        self.store = SqliteEventStore(path)

    def append(self, events: list[Event], batch: int) -> None:
        for first in range(0, len(events), batch):
            self.store.append(events[first : first + batch])

    def replay(self) -> list[Any]:
        return self.store.read()

    def close(self) -> None:
        self.store.close()


class RawSide:
    """The floor: the same rows, pre-encoded, inserted and selected with bare sqlite3."""

    def __init__(self, path: Path, *, named: bool = False) -> None:
        self.named = named
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
            row = None if self.named else encode_positional(ev)
            kind, version, payload = row or encode(ev)
            out.append((self.seq, kind, version, ev.at, payload))
        return out

    def append(self, rows: list[tuple[Any, ...]], batch: int) -> None:
        for first in range(0, len(rows), batch):
            self.conn.execute("BEGIN IMMEDIATE")
            chunk = rows[first : first + batch]
            self.conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?)", chunk)
            self.conn.execute("COMMIT")

    def replay(self) -> list[Any]:
        return self.conn.execute(
            "SELECT seq, kind, version, payload FROM events WHERE seq > 0 ORDER BY seq"
        ).fetchall()

    def close(self) -> None:
        self.conn.close()


class Replay(NamedTuple):
    """One replay round: seconds in all (reading, then freeing what was read) and of
    freeing alone, wall and CPU."""

    wall: float
    cpu: float
    free_wall: float
    free_cpu: float


def _replay(side: M27Side | RawSide, count: int) -> Replay:
    """Read the whole log and drop it, timed in two parts (the total is the figure)."""
    wall, cpu = time.perf_counter(), time.process_time()
    got = side.replay()
    wall_read, cpu_read = time.perf_counter(), time.process_time()
    assert len(got) == count
    del got
    wall_end, cpu_end = time.perf_counter(), time.process_time()
    return Replay(wall_end - wall, cpu_end - cpu, wall_end - wall_read, cpu_end - cpu_read)


#: Events per block: m27 and the baseline take turns, so both see the same machine load.
BLOCK = 50_000
REPLAY_ROUNDS = 3


class Clock:
    """Wall and CPU seconds (this process) of what it times, summed over its uses.

    CPU time is the steadier figure on a shared machine: wall time also counts the
    moments other processes hold the cores. Both sides are timed the same way.
    """

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.process_time()
        yield
        self.wall.append(time.perf_counter() - wall)
        self.cpu.append(time.process_time() - cpu)


def _fold(side: M27Side, count: int) -> tuple[float, float]:
    """Read the whole log, then fold it into the projection: (wall, CPU) of the fold."""
    records = side.replay()
    wall, cpu = time.perf_counter(), time.process_time()
    state = fold(records)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert state.last_seq == count and state.runs
    return wall, cpu


def run(
    count: int, batch: int, root: Path, *, named: bool = False, folds: bool = False
) -> dict[str, Any]:
    """Append in alternating blocks, then replay in alternating rounds (fastest kept)."""
    load_before = _loadavg()
    m27, raw = M27Side(root / "m27.db"), RawSide(root / "raw.db")
    old = RawSide(root / "named.db", named=True) if named else None
    append_m27, append_raw = Clock(), Clock()
    replays: dict[str, list[Replay]] = {"m27": [], "raw": [], "named": []}
    sides: list[tuple[str, M27Side | RawSide]] = [("raw", raw), ("m27", m27)]
    try:
        for first in range(0, count, BLOCK):
            events = [sample(i) for i in range(first, min(count, first + BLOCK))]
            rows = raw.rows(events)
            with append_raw.timing():
                raw.append(rows, batch)
            with append_m27.timing():
                m27.append(events, batch)
            if old is not None:  # not timed: what an older m27 wrote, read by this one
                old.append(old.rows(events), batch)
        if old is not None:
            old.close()
            sides.append(("named", M27Side(root / "named.db")))
        for _ in range(REPLAY_ROUNDS):
            for name, side in sides:
                replays[name].append(_replay(side, count))
        folded = [_fold(m27, count) for _ in range(REPLAY_ROUNDS) if folds]
    finally:
        for _, side in sides:
            side.close()
    scale = 1_000_000 / count
    res: dict[str, Any] = {
        "events": count,
        "batch": batch,
        "baseline": "bare sqlite3 executemany/SELECT on the same pre-encoded rows, same"
        f" pragmas, alternating with m27 in blocks of {BLOCK} (append) and {REPLAY_ROUNDS}"
        " rounds (replay, fastest of each kept)",
        "loadavg": load_before,
    }
    for clock, suffix in (("wall", ""), ("cpu", "_cpu")):
        a_m27, a_raw = sum(getattr(append_m27, clock)), sum(getattr(append_raw, clock))
        best = {
            name: min(rounds, key=lambda r: getattr(r, clock))
            for name, rounds in replays.items()
            if rounds
        }
        r_m27, r_raw = getattr(best["m27"], clock), getattr(best["raw"], clock)
        res |= {
            f"append_per_s{suffix}": count / a_m27,
            f"append_per_s{suffix}_baseline": count / a_raw,
            f"append_ratio{suffix}": a_m27 / a_raw,
            f"replay_s{suffix}": r_m27,
            f"replay_s{suffix}_baseline": r_raw,
            f"replay_ratio{suffix}": r_m27 / r_raw,
            f"replay_1m_s{suffix}": r_m27 * scale,
            f"replay_1m_s{suffix}_baseline": r_raw * scale,
            f"replay_free_s{suffix}": getattr(best["m27"], f"free_{clock}"),
            f"replay_free_s{suffix}_baseline": getattr(best["raw"], f"free_{clock}"),
        }
        if "named" in best:
            r_named = getattr(best["named"], clock)
            res |= {
                f"replay_named_s{suffix}": r_named,
                f"replay_named_ratio{suffix}": r_named / r_raw,
                f"replay_named_1m_s{suffix}": r_named * scale,
            }
    if folded:
        res |= {
            "fold_s": min(w for w, _ in folded),
            "fold_s_cpu": min(c for _, c in folded),
            "fold_1m_s_cpu": min(c for _, c in folded) * scale,
        }
    res |= {
        "append_target_per_s": TARGET_APPEND_PER_S,
        "replay_1m_target_s": TARGET_REPLAY_1M_S,
        "append_ok": res["append_per_s"] >= TARGET_APPEND_PER_S,
        "replay_ok": res["replay_1m_s"] <= TARGET_REPLAY_1M_S,
        "loadavg_after": _loadavg(),
    }
    return res


def _loadavg() -> str:
    """The 1, 5 and 15 minute load averages (how shared the machine was), or "" off Linux."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return ""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="100k events")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--named",
        action="store_true",
        help="also replay the events in the named format",
    )
    parser.add_argument(
        "--fold", action="store_true", help="also fold each replay into the projection"
    )
    args = parser.parse_args(argv)
    count = 100_000 if args.quick else args.events
    root = Path(tempfile.mkdtemp(prefix="m27-bench-store-"))
    try:
        res = run(count, args.batch, root, named=args.named, folds=args.fold)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(
        f"\n{count} events, batches of {args.batch}, {time.strftime('%Y-%m-%d %H:%M')},"
        f" load {res['loadavg']} -> {res['loadavg_after']}\n"
    )
    print("| metric | m27 | bare sqlite3 | ratio | target |")
    print("|---|---|---|---|---|")
    for clock, suffix in (("wall", ""), ("CPU", "_cpu")):
        print(
            f"| append, events/s ({clock}) | {res[f'append_per_s{suffix}']:,.0f} "
            f"| {res[f'append_per_s{suffix}_baseline']:,.0f} "
            f"| {res[f'append_ratio{suffix}']:.2f}x time | >= {TARGET_APPEND_PER_S:,.0f} |"
        )
        print(
            f"| replay {count} events ({clock}) | {res[f'replay_s{suffix}']:.2f} s "
            f"| {res[f'replay_s{suffix}_baseline']:.2f} s | {res[f'replay_ratio{suffix}']:.2f}x "
            f"| 1M <= {TARGET_REPLAY_1M_S:.0f} s "
            f"(here {res[f'replay_1m_s{suffix}']:.2f} s per 1M) |"
        )
        print(
            f"| of which freeing the events ({clock}) | {res[f'replay_free_s{suffix}']:.2f} s "
            f"| {res[f'replay_free_s{suffix}_baseline']:.2f} s | | |"
        )
        if f"replay_named_s{suffix}" in res:
            print(
                f"| replay, named (old) rows ({clock}) | {res[f'replay_named_s{suffix}']:.2f} s "
                f"| {res[f'replay_s{suffix}_baseline']:.2f} s "
                f"| {res[f'replay_named_ratio{suffix}']:.2f}x | |"
            )
    if "fold_s" in res:
        print(
            f"| fold the replay into the projection | {res['fold_s']:.2f} s wall,"
            f" {res['fold_s_cpu']:.2f} s CPU | | | |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
