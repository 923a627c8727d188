"""`m27 runs`: the run history of this node, from the event log."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from m27 import tables
from m27.cli.commands import SUMMARY, _common
from m27.cli.commands.status import crash_truth
from m27.tables import Col
from m27.units import closest, format_duration, listed


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "runs",
        help=SUMMARY["runs"],
        description="List the runs recorded in this node's event log.",
    )
    p.add_argument(
        "--limit",
        type=_limit,
        default=20,
        metavar="N",
        help="show the newest N runs (default 20; 0: all)",
    )
    p.add_argument(
        "--status",
        choices=STATUSES,
        action="append",
        help="only runs that ended so, or still run (repeatable)",
    )
    p.add_argument("--pipeline", metavar="NAME", help="only runs of the pipeline called NAME")
    p.add_argument("--json", action="store_true", help="one JSON array, for scripts")
    p.set_defaults(func=run)


#: What `m27 runs` shows in STATUS (`m27 status` shows the same words).
STATUSES = ("running", "succeeded", "failed", "crashed", "cancelled")


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (all) or more, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    st = _common.store()
    known = _common.outline(st)
    crash_truth(known)
    matching = [
        r
        for r in known.runs.values()
        if (args.pipeline is None or r.pipeline == args.pipeline)
        and (not args.status or _common.shown_status(r) in args.status)
    ]
    shown = matching[-args.limit :] if args.limit > 0 else matching
    state = _common.in_full(st, known, (r.run_id for r in shown))
    rows: list[dict[str, Any]] = []
    for r in (state.runs[s.run_id] for s in shown):
        ok = sum(1 for s in r.steps.values() if s.status == "succeeded" or s.done_before)
        rows.append(
            {
                "run_id": r.run_id,
                "pipeline": r.pipeline,
                "status": _common.shown_status(r),
                "submitted_at": r.submitted_at,
                "duration_s": r.duration_s,
                "steps_succeeded": ok,
                "steps": len(r.steps),
                "resume_of": r.resume_of,
                "spec_path": r.spec_path,
            }
        )
    if args.json:
        _common.print_json(rows)
        return 0
    if not rows:
        names = {r.pipeline for r in known.runs.values()}
        if args.pipeline and args.pipeline not in names:
            close = closest(args.pipeline, names)
            hint = f"; did you mean {close!r}?" if close else f" (pipelines: {_listed(names)})"
            print(f"no run of a pipeline called {args.pipeline!r}{hint}")
        elif known.runs:
            print(f"no run matches; this node has {len(known.runs)} (`m27 runs --limit 0`)")
        else:
            print("no runs yet: start one with `m27 run PIPELINE.yaml`")
        return 0
    cols = [
        Col("RUN", wrap=True),
        Col("PIPELINE", max_width=18),
        Col("STATUS"),
        Col("STARTED"),
        Col("TIME", right=True),
        Col("STEPS"),
    ]
    tables.show(
        cols,
        (
            (
                row["run_id"],
                row["pipeline"],
                row["status"],
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["submitted_at"])),
                format_duration(row["duration_s"]) if row["duration_s"] is not None else "",
                f"{row['steps_succeeded']}/{row['steps']}",
            )
            for row in rows
        ),
    )
    if len(rows) < len(matching) and sys.stdout.isatty():  # a person reads the table
        print(f"(the newest {len(rows)} of {len(matching)}; --limit 0 shows all)")
    return 0


def _listed(names: set[str]) -> str:
    """A few of the node's pipeline names, for a `--pipeline` that matches none."""
    return listed(sorted(names), 10)
