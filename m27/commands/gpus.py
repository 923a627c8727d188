"""`m27 gpus`: the node's GPUs now, and which steps hold them."""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from typing import Any

from m27._exceptions import M27Error
from m27.gpu import GpuSample, detect
from m27.units import format_size


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "gpus",
        help="show the GPUs of this node",
        description="One line per GPU: utilization, memory, temperature, power, and the "
        "steps on it (primary and guests). M27_GPUS=sim:N shows simulated GPUs.",
    )
    p.add_argument("--json", action="store_true", help="one JSON array, for scripts")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    backend = detect()
    try:
        # NVML's utilization is an average since the previous call: the first is discarded.
        backend.sample(time.time())
        samples = backend.sample(time.time())
    finally:
        backend.close()
    primaries, guests = _occupancy()
    rows = [
        _row(s, backend.kind, primaries.get(s.index, []), guests.get(s.index, [])) for s in samples
    ]
    if args.json:
        from m27.commands import _common

        _common.print_json(rows)
        return 0
    print(
        f"{'GPU':>3}  {'NAME':<26} {'UUID':<14} {'UTIL':>5} {'MEMORY':>21} {'TEMP':>5} "
        f"{'POWER':>6}  {'PRIMARY':<24} GUESTS"
    )
    for s, row in zip(samples, rows, strict=True):
        print(
            f"{s.index:>3}  {_cut(s.name, 26):<26} {_cut(s.uuid, 14):<14} "
            f"{'lost' if s.lost else _fmt(s.utilization_gpu, '{:.0f}%'):>5} "
            f"{_memory(s):>21} {_fmt(s.temperature_c, '{:.0f}C'):>5} "
            f"{_fmt(s.power_w, '{:.0f}W'):>6}  {', '.join(row['primary']) or '-':<24} "
            f"{', '.join(row['guests']) or '-'}"
        )
    return 0


def _row(s: GpuSample, kind: str, primary: list[str], guests: list[str]) -> dict[str, Any]:
    row = asdict(s)
    row["throttle_reasons"] = None if s.throttle_reasons is None else sorted(s.throttle_reasons)
    row.update(backend=kind, primary=primary, guests=guests)
    return row


def _occupancy() -> tuple[dict[int, list[str]], dict[int, list[str]]]:
    """Steps on each GPU from the node's event log; empty if there is no readable log."""
    primaries: dict[int, list[str]] = {}
    guests: dict[int, list[str]] = {}
    try:
        from m27.commands import _common
        from m27.config import m27_home

        if not (m27_home() / "events.db").exists():
            return primaries, guests  # no run yet; do not create a log just to read it
        state = _common.load_state()
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


def _memory(s: GpuSample) -> str:
    used = "-" if s.memory_used is None else format_size(s.memory_used)
    total = "-" if s.memory_total is None else format_size(s.memory_total)
    return f"{used} / {total}"


def _cut(text: str | None, width: int) -> str:
    if text is None:
        return "-"
    return text if len(text) <= width else text[: width - 1] + "…"
