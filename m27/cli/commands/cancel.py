"""`m27 cancel RUN [STEP...]`: ask a run, or some of its steps, to stop; their process
groups get SIGTERM (and their grace to checkpoint), then SIGKILL."""

from __future__ import annotations

import argparse
import os
import sys
import time

from m27._exceptions import M27Error
from m27.cli.commands import SUMMARY, _common
from m27.cli.commands._options import seconds
from m27.events import (
    CancelRequested,
    RunCancelled,
    RunFailed,
    RunSucceeded,
    StepCancelled,
    StepFailed,
    StepSkipped,
    StepSucceeded,
)
from m27.events.state import STEP_DONE, RunState
from m27.store.sqlite import SqliteEventStore

RunEnded = RunSucceeded | RunFailed | RunCancelled
StepEnded = StepSucceeded | StepFailed | StepCancelled | StepSkipped


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "cancel",
        help=SUMMARY["cancel"],
        usage="m27 cancel [-h] [--wait WAIT] RUN [STEP...]",
        description="Record a cancel request for RUN; the process running it "
        "stops its steps and records the run as cancelled. If that process is "
        "gone (crashed), the steps' process groups are stopped here. With STEP, only "
        "those steps stop (one replica of a matrix: its steps' names, or the entry's "
        "name for all of them); the run goes on without them and the steps waiting on "
        "them, and ends failed; `m27 run --resume RUN` runs them later.",
    )
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("steps", metavar="STEP", nargs="*", help="only these steps")
    p.add_argument(
        "--wait",
        type=seconds(),
        default=30.0,
        help="seconds to wait for the run to stop (default 30)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    st = _common.store()
    r = _common.find_run(_common.outline(st), args.run_id)
    if r.status == "failed" and r.reason.startswith("crashed"):
        # Crashed earlier (closed by the node service): the user's word now is "cancelled".
        st.append([RunCancelled(at=time.time(), run_id=r.run_id, reason="cancelled after a crash")])
        _prefect_cancelled(r.flow_run_id)
        print(f"run {r.run_id}: cancelled (it had crashed)")
        return 0
    if r.status != "running":
        print(f"run {r.run_id} already {r.status}")
        return 0
    if args.steps:
        return _cancel_steps(st, r, args.steps, args.wait)
    now = time.time()
    st.append([CancelRequested(at=now, run_id=r.run_id, by=f"cli:{os.getpid()}")])
    if _common.shown_status(r) == "crashed":
        code = _cancel_orphans(st, r.run_id)
        _prefect_cancelled(r.flow_run_id)
        return code
    deadline = time.monotonic() + args.wait
    after = st.last_seq()
    while time.monotonic() < deadline:
        for rec in st.follow(after, timeout=0.5):
            after = rec.seq
            ev = rec.event
            if getattr(ev, "run_id", None) == r.run_id and type(ev).__name__.startswith("Run"):
                print(f"run {r.run_id}: {type(ev).__name__.removeprefix('Run').lower()}")
                return 0
    print(f"m27 cancel: run {r.run_id} did not stop within {args.wait:.0f}s", file=sys.stderr)
    return 1


def _cancel_steps(st: SqliteEventStore, r: RunState, asked: list[str], wait_s: float) -> int:
    """`m27 cancel RUN STEP...`: ask the run's process to stop those steps, and wait for
    each that runs or queues to end. One that waits on other steps ends when the run
    reaches it (cancelled before it started)."""
    if _common.shown_status(r) == "crashed":
        print(
            f"m27 cancel: run {r.run_id}'s process is gone: `m27 cancel {r.run_id}` stops "
            "what is left of it",
            file=sys.stderr,
        )
        return 1
    steps = _common.run_state(st, r.run_id).runs[r.run_id].steps
    names: list[str] = []
    for name in asked:
        made = [name] if name in steps else _common.made_by(name, steps)
        if not made:
            print(f"m27 cancel: {_common.no_such_step(r.run_id, name, steps)}", file=sys.stderr)
            return 2
        names += [n for n in made if n not in names]
    live = []
    for name in names:
        status = steps[name].status
        if status in STEP_DONE:
            print(f"step {name} already {status}")
        else:
            live.append(name)
    if not live:
        return 0
    by = f"cli:{os.getpid()}"
    after = st.last_seq()
    st.append([CancelRequested(at=time.time(), run_id=r.run_id, by=by, step=n) for n in live])
    waiting = {n for n in live if steps[n].status in ("queued", "running")}
    for name in live:
        if name not in waiting:
            print(f"step {name}: cancelled; it waits on other steps, and will not start")
    deadline = time.monotonic() + wait_s
    while waiting and time.monotonic() < deadline:
        for rec in st.follow(after, timeout=0.5):
            after = rec.seq
            ev = rec.event
            if getattr(ev, "run_id", None) != r.run_id:
                continue
            if isinstance(ev, RunEnded):
                waiting.clear()
            elif isinstance(ev, StepEnded) and ev.step in waiting:
                if isinstance(ev, StepFailed) and ev.will_retry:
                    continue
                waiting.discard(ev.step)
                how = type(ev).__name__.removeprefix("Step").lower()
                print(f"step {ev.step}: {how}")
    if waiting:
        shown = ", ".join(sorted(waiting))
        print(f"m27 cancel: {shown} did not stop within {wait_s:.0f}s", file=sys.stderr)
        return 1
    return 0


def _prefect_cancelled(flow_run_id: str | None) -> None:
    """Show the crashed run as Cancelled in Prefect too (through the node service's server,
    or the lab's); the log already says so, Prefect is told at best effort."""
    if not flow_run_id:
        return
    from m27.config import m27_home
    from m27.node.crash import mark_prefect_cancelled, with_prefect
    from m27.node.service import ensure_service

    try:
        info, _ = ensure_service(m27_home())
    except M27Error as exc:
        print(f"m27 cancel: Prefect not updated: {exc}", file=sys.stderr)
        return
    os.environ["PREFECT_API_URL"] = info.url
    why = "cancelled after its run crashed"
    try:
        with_prefect(lambda client: mark_prefect_cancelled(client, flow_run_id, why))
    except Exception as exc:  # Prefect unreachable: the log is the truth
        print(f"m27 cancel: Prefect not updated: {exc}", file=sys.stderr)


def _cancel_orphans(st: SqliteEventStore, run_id: str) -> int:
    """The run's process died: stop what it left running (process groups, Slurm jobs),
    release its leases and close the run in the log, the way the crash watcher does."""
    from m27.node.crash import finalize

    out = finalize(st, run_id, "cancelled after its run crashed", outcome="cancelled")
    steps = sum(isinstance(e, StepCancelled) for e in out)
    print(f"run {run_id}: cancelled (its process had died; stopped {steps} step(s))")
    return 0
