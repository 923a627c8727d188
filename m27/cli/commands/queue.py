"""`m27 queue`: the node's GPU queue as the agent sees it, and why each step waits.

While the node's agent runs, it is the queue the agent published with its last decision
(``gpus.json``, :func:`m27.node.report.queue_rows`), once that holds every change the log
has. Without a live agent the event log is folded and the agent's own
:func:`m27.policy.decide` run on it, so the tiers, effective priorities and reasons shown
are the ones the agent would act on (GPU utilization is not sampled then: a waiting
step's reason never depends on it; the memory of processes m27 did not start is). The
fold reads the whole log (1.7 s for 480k events); the published queue does not.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from m27 import tables
from m27.cli.commands import _common
from m27.cli.commands._options import add_command
from m27.config import load_settings, m27_home
from m27.events.state import live_runs
from m27.gpu import detect
from m27.node.agent import policy_config
from m27.node.book import BOOK_KINDS, Book, fold_book, policy_input
from m27.node.lease import lease_wanted
from m27.node.report import queue_rows, read_snapshot
from m27.node.views import outside_m27
from m27.policy import Decision, GpuView, PolicyConfig
from m27.tables import Col
from m27.units import format_duration


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "queue", run)
    p.add_argument("--why", metavar="STEP", help="only the reason for STEP (RUN/STEP or STEP)")
    p.add_argument("--json", action="store_true", help="one JSON object, for scripts")


def _views(book: Book) -> list[GpuView]:
    """The GPUs as the agent would see them, less utilization: memory, lost, and the memory
    of processes m27 did not start (another user's job leaves its GPU to them)."""
    backend = detect()
    try:
        samples = backend.sample(time.time())
    finally:
        backend.close()
    outside = outside_m27(samples, book.held.values())
    return [
        GpuView(
            s.index, s.memory_total or 0, None,
            s.lost or s.index in book.lost_gpus, foreign_memory=outside[s.index],
        )
        for s in samples
    ]  # fmt: skip


def _decide(book: Book, views: list[GpuView], now: float, cfg: PolicyConfig) -> Decision:
    from m27.policy import decide

    # The agent's own input: the same fair-share usage, folded from the same log.
    return decide(policy_input(book, views, now, cfg, usage=book.usage.at(now)))


def _matching(rows: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The held, waiting or retrying rows step `name` can mean: ``RUN/STEP`` exactly, else
    every row it is the STEP of or a prefix of."""
    exact = [row for row in rows if row["step"] == name]
    if exact:
        return exact[:1]
    return [r for r in rows if r["step"].split("/", 1)[1] == name or r["step"].startswith(name)]


def _published(home: Path) -> dict[str, Any] | None:
    """The queue the running agent published (``gpus.json``) once it holds every change
    the log has: a bump or a request made just now shows within a tick or two (waited for
    up to :data:`WAIT_S`); None without a live agent (the log is folded then)."""
    deadline = time.monotonic() + WAIT_S
    with _common.store() as st:
        while True:
            live = read_snapshot(home)
            queue, seq = (live or {}).get("queue"), (live or {}).get("seq")
            if not isinstance(queue, dict) or not isinstance(seq, int):
                return None
            if not any(type(r.event) in BOOK_KINDS for r in st.read(after=seq)):
                return queue
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)


#: How long `m27 queue` waits for the agent to publish the changes the log holds.
WAIT_S = 1.0


def _folded() -> dict[str, Any]:
    """The queue from a fold of the whole log, decided here with the agent's own code."""
    book = Book()
    if (m27_home() / "events.db").exists():
        book = fold_book(_common.store().read())
    cfg = policy_config(load_settings())
    now = time.time()
    return queue_rows(book, _decide(book, _views(book), now, cfg), now, cfg)


def run(args: argparse.Namespace) -> int:
    """Steps holding a lease (primary, guest, background, cpu) and steps waiting, in queue
    order, with their effective priority (base + bump + aging) and the reason they wait."""
    home = m27_home()
    snap = (_published(home) if (home / "events.db").exists() else None) or _folded()
    retrying = _retrying() if (home / "events.db").exists() else []
    if args.why:
        found = _matching([*snap["held"], *snap["waiting"], *retrying], args.why)
        if len(found) != 1:
            print(f"m27 queue: {_not_one(args.why, found)}", file=sys.stderr)
            return 2
        row = found[0]
        print(f"{row['step']}: {row.get('why') or row['step'] + ' is not pending'}")
        return 0
    if args.json:
        _common.print_json({**snap, "retrying": retrying})
        return 0
    if not snap["held"] and not snap["waiting"]:
        print("the queue is empty")
    else:
        # A waiting step's STATE is why it waits (the reason `--why` explains in full).
        rows: list[tuple[object, ...]] = []
        for h in snap["held"]:
            gpus = ",".join(map(str, h["gpus"])) or "-"
            rows.append((h["step"], h["tier"], h["role"], gpus, h["priority"], h["state"]))
        for w in snap["waiting"]:
            rows.append((w["step"], "waiting", w["type"], w["gpus"], w["priority"], w["why"]))
        cols = [Col("STEP", wrap=True), Col("TIER"), Col("ROLE"), Col("GPUS")]
        cols += [Col("PRIO", right=True), Col("STATE", wrap=True)]
        tables.show(cols, rows)
    for r in retrying:
        print(f"{r['step']}: {r['why']}")
    return 0


def _not_one(name: str, found: list[dict[str, Any]]) -> str:
    """Why `--why NAME` names no step: none matches, or several do (two runs of one
    pipeline each have a step `md`: it said `no waiting or running step matches 'md'`)."""
    if not found:
        return f"no waiting or running step matches {name!r}"
    shown = ", ".join(r["step"] for r in found[:5]) + (", ..." if len(found) > 5 else "")
    return f"{name!r} matches {len(found)} steps ({shown}): name one as RUN/STEP"


def _retrying() -> list[dict[str, Any]]:
    """Steps of live runs waiting out a `retry_delay`: out of the queue until their next
    attempt asks again, so `m27 queue` said `the queue is empty` (and `--why` knew no such
    step) while `m27 status` showed them queued."""
    now = time.time()
    with _common.store() as st:
        state = _common.in_full(st, _common.outline(st), [])
    found = []
    for r in live_runs(state):
        for s in r.steps.values():
            if s.status == "queued" and s.retry_at is not None and s.retry_at > now:
                attempt = s.attempts + 1
                wait = format_duration(s.retry_at - now)
                found.append(
                    {
                        "step": f"{r.run_id}/{s.name}",
                        "retry_at": s.retry_at,
                        "why": f"waits out its retry_delay: attempt {attempt} asks for "
                        f"{lease_wanted(s.gpus_wanted)} "
                        f"in {wait} (attempt {s.attempts}: {s.reason})",
                    }
                )
    return found
