"""`m27 queue`: the node's GPU queue as the agent sees it, and why each step waits.

It folds the event log and runs the agent's own :func:`m27.policy.decide` on it, so the
tiers, effective priorities and reasons shown are the ones the agent acts on (GPU
utilization is not sampled here: a waiting step's reason never depends on it).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from m27 import tables
from m27.cli.commands import _common
from m27.cli.commands._options import add_command
from m27.config import load_settings, m27_home
from m27.gpu import detect
from m27.node.agent import policy_config
from m27.node.book import Book, fold_book, policy_input
from m27.policy import Decision, GpuView, PolicyConfig, StepKey, effective_priority, key_text
from m27.tables import Col


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "queue", run, "show the GPU queue: tiers, effective priorities, reasons")
    p.add_argument("--why", metavar="STEP", help="only the reason for STEP (RUN/STEP or STEP)")
    p.add_argument("--json", action="store_true", help="one JSON object, for scripts")


def _views(book: Book) -> list[GpuView]:
    backend = detect()
    try:
        devices = backend.devices()
    finally:
        backend.close()
    return [GpuView(d.index, d.memory_total or 0, None, d.index in book.lost_gpus) for d in devices]


def snapshot(book: Book, views: list[GpuView], now: float, cfg: PolicyConfig) -> dict[str, Any]:
    """Held and waiting steps with their tiers, priorities and reasons."""
    decision = _decide(book, views, now, cfg)
    held = []
    for key, h in book.held.items():
        req = h.request
        prio = effective_priority(
            req.priority if req else 0,
            book.bumps.get(key, 0),
            req.at if req else h.granted_at,
            now,
            cfg,
        )
        state = "paused" if h.paused else "running"
        held.append(
            {
                "step": key_text(key),
                "role": h.role,
                "tier": h.tier,
                "gpus": list(h.gpus),
                "priority": prio,
                "state": state if h.role == "guest" else "running",
            }
        )
    waiting = []
    ranked = sorted(
        book.requests.values(),
        key=lambda r: (
            -effective_priority(r.priority, book.bumps.get((r.run_id, r.step), 0), r.at, now, cfg),
            r.at,
        ),
    )
    for r in ranked:
        key = (r.run_id, r.step)
        waiting.append(
            {
                "step": key_text(key),
                "type": r.type,
                "gpus": r.gpus,
                "priority": effective_priority(r.priority, book.bumps.get(key, 0), r.at, now, cfg),
                "base": r.priority,
                "bump": book.bumps.get(key, 0),
                "owner": r.owner,
                "waited_s": round(max(0.0, now - r.at), 1),
                "why": decision.why(key),
            }
        )
    return {"held": held, "waiting": waiting}


def _decide(book: Book, views: list[GpuView], now: float, cfg: PolicyConfig) -> Decision:
    from m27.policy import decide

    # The agent's own input: the same fair-share usage, folded from the same log.
    return decide(policy_input(book, views, now, cfg, usage=book.usage.at(now)))


def _find(book: Book, name: str) -> StepKey | None:
    keys = list(book.requests) + list(book.held)
    for key in keys:
        if key_text(key) == name:
            return key
    matches = [k for k in keys if k[1] == name or key_text(k).startswith(name)]
    return matches[0] if len(matches) == 1 else None


def run(args: argparse.Namespace) -> int:
    """Steps holding a lease (primary, guest, background, cpu) and steps waiting, in queue
    order, with their effective priority (base + bump + aging) and the reason they wait."""
    book = Book()
    if (m27_home() / "events.db").exists():
        book = fold_book(_common.store().read())
    cfg = policy_config(load_settings())
    now = time.time()
    views = _views(book)
    if args.why:
        key = _find(book, args.why)
        if key is None:
            print(f"m27 queue: no waiting or running step matches {args.why!r}", file=sys.stderr)
            return 2
        print(f"{key_text(key)}: {_decide(book, views, now, cfg).why(key)}")
        return 0
    snap = snapshot(book, views, now, cfg)
    if args.json:
        _common.print_json(snap)
        return 0
    if not snap["held"] and not snap["waiting"]:
        print("the queue is empty")
        return 0
    # A waiting step's STATE is why it waits (the reason `--why` explains in full).
    rows: list[tuple[object, ...]] = []
    for h in snap["held"]:
        gpus = ",".join(map(str, h["gpus"])) or "-"
        rows.append((h["step"], h["tier"], h["role"], gpus, h["priority"], h["state"]))
    for w in snap["waiting"]:
        rows.append((w["step"], "waiting", w["type"], w["gpus"], w["priority"], w["why"]))
    cols = [Col("STEP", wrap=True), Col("TIER"), Col("ROLE"), Col("GPUS"), Col("PRIO", right=True)]
    tables.show([*cols, Col("STATE", wrap=True)], rows)
    return 0
