"""`m27 wait RUN...`: block until runs end; exit 0 only if every one succeeded.

Runs started with `m27 run --detach` (replicas of one simulation, a sweep of `--set`
values) go on without the command that started them; a script that analyses them all
afterwards needs the moment the last one ends and whether each succeeded, as a shell's
`wait` gives for its jobs. Polling `m27 status --json` in a loop was the way round it.
A run whose process died without recording its end counts as ended (crashed), as `m27
status` shows it, so a wait never outlasts a dead run, unless its pipeline says
`on_crash: resume` and the node service resumes it: the wait follows the resume then.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time

from m27 import runids
from m27.cli.commands import SUMMARY, _common
from m27.config import m27_home
from m27.events.state import NodeState, RunState, live_runs
from m27.node.info import find_service
from m27.units import format_duration, parse_duration

#: The exit code when --timeout passed first (GNU timeout's).
TIMED_OUT = 124


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "wait",
        help=SUMMARY["wait"],
        usage="m27 wait [-h] [--timeout DURATION] [RUN...]",
        description="Wait until each RUN (an id, a unique prefix, or `last`) has ended, "
        "printing a line as each one does; without RUN, every run in progress now (as a "
        "shell's `wait` waits for all its jobs). A run that crashed while its pipeline says "
        "`on_crash: resume` is followed to the run the node service resumes it as. Exit code 0 "
        "when every run succeeded, 1 when one failed, was cancelled or crashed, 124 when "
        "--timeout passed first, 2 for a run id that names no run.",
    )
    p.add_argument("run_ids", metavar="RUN", nargs="*")
    p.add_argument(
        "--timeout",
        type=_duration,
        default=None,
        metavar="DURATION",
        help="give up after this long: seconds or a duration (90, 30m, 2d12h; default: "
        "as long as the runs take)",
    )
    p.set_defaults(func=run)


def _duration(text: str) -> float:
    try:
        value = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not 0 < value <= 366 * 86400:
        raise argparse.ArgumentTypeError(f"{text!r}: give a duration from 1ms to 366d")
    return value


def _resumed_by(known: NodeState, run_id: str) -> str | None:
    """The run that resumes `run_id`, if one does (the newest)."""
    found = [r.run_id for r in known.runs.values() if r.resume_of == run_id]
    return found[-1] if found else None


def _resume_pending(r: RunState) -> bool:
    """Whether the node service will resume `r` (crashed, `on_crash: resume`) and has not
    said how yet: it started the resume (its run is not in the log yet), or has not
    decided, and runs here to decide. A decision not to (`AutoResumeSkipped`), or no
    service to make one, ends the wait on the crash."""
    if r.auto_resume == "started":
        return True
    if r.auto_resume == "skipped" or r.host != socket.gethostname():
        return False
    return find_service(m27_home()) is not None


def run(args: argparse.Namespace) -> int:
    st = _common.store()
    known = _common.outline(st)
    if args.run_ids:
        pending = list(dict.fromkeys(runids.resolve(r, list(known.runs)) for r in args.run_ids))
    else:
        pending = [r.run_id for r in live_runs(known) if _common.shown_status(r) == "running"]
        if not pending:
            print("no runs in progress")
            return 0
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    failed = False
    while True:
        for run_id in list(pending):
            r = known.runs[run_id]
            status = _common.shown_status(r)  # `crashed` for a run whose process is gone
            if status == "running":
                continue
            if status == "crashed" and r.on_crash == "resume":
                later = _resumed_by(known, run_id)
                if later is not None:  # follow the resume, to the chain's end
                    print(
                        f"run {run_id} crashed; run {later} resumes it (on_crash: resume)",
                        flush=True,
                    )
                    if later in pending:
                        pending.remove(run_id)
                    else:
                        pending[pending.index(run_id)] = later
                    continue
                if _resume_pending(r):
                    continue
            pending.remove(run_id)
            failed |= status != "succeeded"
            reason = r.reason.removeprefix(f"{status}: ") if r.reason else ""
            took = f" in {format_duration(r.duration_s)}" if r.duration_s is not None else ""
            print(f"run {run_id} {status}{took}" + (f": {reason}" if reason else ""), flush=True)
        if not pending:
            return 1 if failed else 0
        if deadline is not None and time.monotonic() >= deadline:
            print(
                f"m27 wait: still running after {format_duration(args.timeout)}: "
                f"{', '.join(pending)}",
                file=sys.stderr,
            )
            return TIMED_OUT
        # wakes on the log's next event; a dead run's process is looked at once a second
        left = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
        st.follow(st.last_seq(), timeout=left)
        known = _common.outline(st)
