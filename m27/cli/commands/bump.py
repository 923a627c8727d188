"""`m27 bump RUN STEP N`: raise (or, with a negative N, lower) a step's priority; a
matrix entry's name bumps each of its steps that still waits or runs."""

from __future__ import annotations

import argparse
import sys
import time

from m27.cli.commands import _common
from m27.cli.commands._options import add_command, whole
from m27.events import PriorityBumped, Recorded
from m27.events.state import fold
from m27.node.book import fold_book
from m27.policy import PRIORITY_LIMIT
from m27.runids import RunIdError, resolve
from m27.store.sqlite import SqliteEventStore


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "bump", run)
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("step", metavar="STEP")
    p.add_argument(
        "delta",
        metavar="N",
        type=whole(least=-PRIORITY_LIMIT, most=PRIORITY_LIMIT),
        help=f"points to add (negative lowers); a step's bumps together count up to "
        f"±{PRIORITY_LIMIT:,}",
    )


def run(args: argparse.Namespace) -> int:
    """Add N (may be negative) to STEP's priority in RUN. The agent uses the new effective
    priority at its next tick; `m27 queue` shows it."""
    st = _common.store()
    run_id, records = _run_records(st, args.run_id)
    state = fold(records)
    book = fold_book(records)
    steps = set(state.runs[run_id].steps) if run_id in state.runs else set()
    steps |= {s for r, s in [*book.requests, *book.held] if r == run_id}
    made = sorted(_common.made_by(args.step, steps))
    if args.step not in steps and not made:
        print(
            f"m27 bump: {_common.no_such_step(run_id, args.step, sorted(steps))}", file=sys.stderr
        )
        return 2
    names = [args.step] if args.step in steps else made  # a matrix entry: its steps
    run_state = state.runs.get(run_id)
    live = [n for n in names if run_state is None or run_state.ended(n) is None]
    if not live:
        ended = run_state.ended(names[0]) if run_state is not None else None
        which = args.step if len(names) == 1 else f"every step of {args.step}"
        print(
            f"m27 bump: {run_id}/{which} already ended ({ended}): a priority only "
            "matters while a step waits or runs",
            file=sys.stderr,
        )
        return 2
    now = time.time()
    st.append([PriorityBumped(at=now, run_id=run_id, step=n, delta=args.delta) for n in live])
    for name in live:
        total = book.bumps.get((run_id, name), 0) + args.delta
        print(f"{run_id}/{name}: priority {args.delta:+d} (bumps now {total:+d})")
    return 0


def _run_records(st: SqliteEventStore, prefix: str) -> tuple[str, list[Recorded]]:
    """The run `prefix` names (found in every run's outline) and its own events: all that
    its steps, leases and bumps fold from, without the rest of the log (480k events took
    1.3 s to fold). A run the log knows only by its lease requests (steps that asked the
    agent directly, no `m27 run`) is looked for in the whole log."""
    submitted = list(_common.outline(st).runs)
    try:
        run_id = resolve(prefix, submitted)
    except RunIdError:
        records = st.read()
        book = fold_book(records)
        others = [r for r, _ in [*book.requests, *book.held] if r not in submitted]
        return resolve(prefix, [*submitted, *dict.fromkeys(others)]), records
    return run_id, st.read_runs((run_id,))
