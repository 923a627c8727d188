"""`m27 gpus`: the node's GPUs now, and which steps hold them; `--watch` keeps it live.

While the node's agent runs, its snapshot (``$M27_HOME/gpus.json``, rewritten about once
a second) is what is shown: simulated utilization exists only inside the agent, and the
agent knows the primaries and guests first-hand. Without a fresh snapshot the GPUs are
sampled here and the steps on them read from the event log.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from m27 import tables
from m27._exceptions import M27Error
from m27.cli.commands._options import add_command, seconds, whole
from m27.gpu import GpuBackend, detect
from m27.tables import Col
from m27.units import cpu_list, format_size


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "gpus", run)
    p.add_argument("--json", action="store_true", help="one JSON array, for scripts")
    p.add_argument(
        "--watch",
        nargs="?",
        const=1.0,
        type=seconds(least=0.05, most=3600),
        metavar="SECONDS",
        help="refresh every SECONDS (default 1) until Ctrl-C; with --json, one array a line",
    )
    p.add_argument(
        "--count",
        type=whole(least=1),
        default=0,
        metavar="N",
        help="with --watch: stop after N tables",
    )


class _Source:
    """Rows from the agent's snapshot when fresh, else from a backend opened here (kept
    open across refreshes: NVML's utilization is an average since the previous call)."""

    def __init__(self) -> None:
        self.backend: GpuBackend | None = None
        self.live_from: int | None = None  # the agent's pid when its snapshot is shown

    def rows(self) -> list[dict[str, Any]]:
        from m27.config import load_settings, m27_home
        from m27.gpu.cpus import gpu_shares
        from m27.node.report import read_snapshot, sample_row
        from m27.node.views import outside_m27

        snap = read_snapshot(m27_home())
        if snap is not None:
            self.live_from = snap["pid"]
            return list(snap["gpus"])
        self.live_from = None
        if self.backend is None:
            self.backend = detect()
            self.backend.sample(time.time())  # the first NVML utilization is discarded
        samples = self.backend.sample(time.time())
        primaries, guests = _occupancy()
        cores = gpu_shares(load_settings().gpu_cpus, self.backend)
        # a GPU without a lease in the log has no process of m27's: all of it is outside
        outside = outside_m27(samples, ())
        rows = []
        for s in samples:
            row = sample_row(s)
            mine = s.index in primaries or s.index in guests
            row.update(
                backend=self.backend.kind,
                primary=primaries.get(s.index, []),
                guests=guests.get(s.index, []),
                outside_memory=0 if mine else outside[s.index],
                cores=list(cores.get(s.index, ())),
            )
            rows.append(row)
        return rows

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()


def run(args: argparse.Namespace) -> int:
    """One line per GPU: utilization, memory, temperature, power, and the steps on it
    (primary and guests). Live from the node's agent while one runs; M27_GPUS=sim:N shows
    simulated GPUs."""
    interval: float | None = getattr(args, "watch", None)
    count: int = getattr(args, "count", 0) or 0
    if count and interval is None:  # one table was shown and the N said nothing
        print(
            f"m27 gpus: --count goes with --watch: m27 gpus --watch --count {count}",
            file=sys.stderr,
        )
        return 2
    source = _Source()
    shown = 0
    try:
        while True:
            rows = source.rows()
            if args.json and interval is not None:
                print(json.dumps(rows, default=str), flush=True)
            elif args.json:
                from m27.cli.commands import _common

                _common.print_json(rows)
            else:
                if interval is not None and sys.stdout.isatty():
                    print("\033[H\033[2J", end="")  # clear the screen: a live table
                _table(rows, source.live_from, interval)
            shown += 1
            if interval is None or (count and shown >= count):
                return 0
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0
    finally:
        source.close()


def _outside(row: dict[str, Any]) -> str:
    """`outside m27 (60.0GiB)` for a GPU that work m27 did not start holds (the agent
    reports it once it is enough to leave the GPU to that work), else `-`."""
    held = int(row.get("outside_memory") or 0)
    return f"outside m27 ({format_size(held)})" if held and not row.get("guests") else "-"


def _table(rows: list[dict[str, Any]], live_from: int | None, interval: float | None) -> None:
    if interval is not None:
        where = f"live from the agent (pid {live_from})" if live_from else "sampled here"
        print(f"{time.strftime('%H:%M:%S')}  {where}, every {interval:g}s; Ctrl-C to stop")
    cols = [
        Col("GPU", right=True),
        Col("NAME", max_width=26),
        Col("UUID", max_width=14),
        Col("UTIL", right=True),
        Col("MEMORY", right=True),
        Col("TEMP", right=True),
        Col("POWER", right=True),
        Col("PRIMARY", wrap=True),
        Col("GUESTS", wrap=True),
    ]
    # a node that confines its GPU steps (gpu_cpus) says to which cores, GPU by GPU
    shared = any(r.get("cores") for r in rows)
    if shared:
        cols.insert(7, Col("CORES", max_width=20))
    table = [
        (
            r["index"],
            r.get("name") or "-",
            r.get("uuid") or "-",
            "lost" if r.get("lost") else _fmt(r.get("utilization_gpu"), "{:.0f}%"),
            _memory(r),
            _fmt(r.get("temperature_c"), "{:.0f}C"),
            _fmt(r.get("power_w"), "{:.0f}W"),
            *([cpu_list(r.get("cores") or ()) or "-"] if shared else []),
            ", ".join(r["primary"]) or _outside(r),
            ", ".join(r["guests"]) or "-",
        )
        for r in rows
    ]
    tables.show(cols, table)
    sys.stdout.flush()


def _occupancy() -> tuple[dict[int, list[str]], dict[int, list[str]]]:
    """Steps on each GPU from the node's event log; empty if there is no readable log.

    Only the runs the log has as running are folded in full (`_common.in_full`), not the
    whole history: a lease is released before its run ends, by the run or, when its
    process died, by the crash watcher (`LeaseReleased`, then `RunCrashed`). Steps that
    asked the agent for a lease outside any run (tests, benchmarks) are not listed here;
    the agent's snapshot shows them."""
    primaries: dict[int, list[str]] = {}
    guests: dict[int, list[str]] = {}
    try:
        from m27.cli.commands import _common
        from m27.config import m27_home

        if not (m27_home() / "events.db").exists():
            return primaries, guests  # no run yet; do not create a log just to read it
        st = _common.store()
        try:
            state = _common.in_full(st, _common.outline(st), ())
        finally:
            st.close()
    except (M27Error, OSError, ImportError):
        return primaries, guests
    for (run_id, step), gpus in state.leases.items():
        # A lease not held as a guest is its GPUs' primary (immediate, or background work
        # on a GPU nobody above wanted); a ready lease is always a guest.
        if (run_id, step) in state.guests or state.lease_tiers.get((run_id, step)) == "ready":
            continue
        for gpu in gpus:
            primaries.setdefault(gpu, []).append(f"{run_id}/{step}")
    for (run_id, step), gpu in state.guests.items():
        guests.setdefault(gpu, []).append(f"{run_id}/{step}")
    return primaries, guests


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else spec.format(value)


def _memory(r: dict[str, Any]) -> str:
    used, total = r.get("memory_used"), r.get("memory_total")
    used_s = "-" if used is None else format_size(used)
    total_s = "-" if total is None else format_size(total)
    return f"{used_s} / {total_s}"
