"""`m27 logs RUN [STEP] [-f]`: a step's output (both streams, every attempt)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from m27.cli.commands import _common
from m27.config import m27_home
from m27.events.state import StepState
from m27.paths import join_under


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "logs",
        help="print a step's log",
        description="Print the log of STEP in RUN (STEP may be left out when the run has one "
        "step); with -f keep following it until the step ends. RUN is a run id, a unique "
        "prefix, or `last`.",
    )
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("step", metavar="STEP", nargs="?")
    p.add_argument("-f", "--follow", action="store_true", help="follow until the step ends")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    st = _common.store()
    state = _common.load_state(st)
    r = _common.find_run(state, args.run_id)
    if args.step is None:
        if len(r.steps) != 1:
            print(
                f"m27 logs: name a step of run {r.run_id}: {', '.join(r.steps)}\n"
                f"  e.g. m27 logs {r.run_id} {next(iter(r.steps), 'STEP')}",
                file=sys.stderr,
            )
            return 2
        args.step = next(iter(r.steps))
    if args.step not in r.steps:
        print(
            f"m27 logs: run {r.run_id} has no step {args.step!r} (steps: {', '.join(r.steps)})",
            file=sys.stderr,
        )
        return 2
    default = join_under(m27_home(), "runs", r.run_id, f"{args.step}.log")
    path = Path(r.steps[args.step].log_path or default)
    offset = 0
    while True:
        if path.exists():
            with path.open("rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
                offset += len(chunk)
            sys.stdout.write(chunk.decode("utf-8", errors="replace"))
            sys.stdout.flush()
        if not args.follow:
            if not path.exists():
                print(f"({_no_log(r.steps[args.step], r.status, path)})", file=sys.stderr)
            return 0
        state = _common.load_state(st)
        run_state = state.runs[r.run_id]
        step_done = run_state.steps[args.step].done
        finished = step_done or _common.shown_status(run_state) != "running"
        if finished and path.exists() and path.stat().st_size == offset:
            return 0
        st.follow(st.last_seq(), timeout=0.3)
        time.sleep(0.05)


def _no_log(step: StepState, run_status: str, path: Path) -> str:
    """Why a step has no log: it has not started yet, it never will, or it was removed."""
    if step.attempts > 0:
        return f"no log for {step.name}: {path} is gone"
    if step.done:
        why = f": {step.reason}" if step.reason else ""
        return f"no log for {step.name}: it did not run ({step.status}{why})"
    if run_status != "running":
        return f"no log for {step.name}: it did not run (the run {run_status} first)"
    return f"no log yet for {step.name}: it has not started"
