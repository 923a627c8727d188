"""`m27 logs RUN [STEP] [-n N] [-f]`: a step's output (both streams, every attempt)."""

from __future__ import annotations

import argparse
import codecs
import sys
import time
from pathlib import Path
from typing import BinaryIO

from m27.cli import detach
from m27.cli.commands import SUMMARY, _common
from m27.cli.commands.status import step_status
from m27.config import m27_home
from m27.events.state import RunState, StepState
from m27.paths import join_under, not_a_file
from m27.store.sqlite import SqliteEventStore
from m27.units import listed


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "logs",
        help=SUMMARY["logs"],
        description="Print the log of STEP in RUN (STEP may be left out when the run has one "
        "step); with -f keep following it until the step ends. Without STEP, a run started "
        "with `m27 run --detach` shows its whole output (what `m27 run` would have printed, "
        "$M27_HOME/runs/RUN/run.out), followed with -f until the run's process exits. RUN "
        "is a run id, a unique prefix, or `last`.",
    )
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("step", metavar="STEP", nargs="?")
    p.add_argument(
        "-n",
        "--tail",
        metavar="N",
        type=_lines,
        help="only the last N lines (with -f: then follow, like tail -n N -f)",
    )
    p.add_argument(
        "-f", "--follow", action="store_true", help="follow until the step (or the run) ends"
    )
    p.set_defaults(func=run)


def _lines(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of lines (0 or more)")
    return n


def run(args: argparse.Namespace) -> int:
    st = _common.store()
    run_id = _common.find_run(_common.outline(st), args.run_id).run_id
    r = _common.run_state(st, run_id).runs[run_id]
    if args.step is None:
        out = detach.out_path(m27_home(), r.run_id)
        if len(r.steps) != 1 and out.is_file():  # a detached run's own output
            return _show(args, st, r, out)
        if len(r.steps) != 1:
            print(
                f"m27 logs: name a step of run {r.run_id}: {listed(r.steps, 20)}\n"
                f"  e.g. m27 logs {r.run_id} {next(iter(r.steps), 'STEP')}",
                file=sys.stderr,
            )
            return 2
        args.step = next(iter(r.steps))
    if args.step not in r.steps:
        print(f"m27 logs: {_common.no_such_step(r.run_id, args.step, r.steps)}", file=sys.stderr)
        return 2
    default = join_under(m27_home(), "runs", r.run_id, f"{args.step}.log")
    path = Path(r.steps[args.step].log_path or default)
    try:
        return _show(args, st, r, path)
    except _Unreadable as exc:
        print(f"m27 logs: cannot read the log of {args.step}: {exc}", file=sys.stderr)
        return 1


class _Unreadable(Exception):
    """The step's log path holds something that is not a readable file."""


def _show(args: argparse.Namespace, st: SqliteEventStore, r: RunState, path: Path) -> int:
    """Copy the log (its last `--tail` lines), following it with `-f` while the step runs."""
    offset = _tail_offset(path, args.tail) if args.tail is not None and path.exists() else 0
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while True:
        if path.exists():
            offset = _copy(path, offset, decoder)
        if args.step is None:  # a detached run's output: until its process is gone
            if not args.follow or (not detach.writing(path) and path.stat().st_size == offset):
                return 0
            st.follow(st.last_seq(), timeout=0.3)
            time.sleep(0.05)
            continue
        if not args.follow:
            if not path.exists():
                print(f"({_no_log(r.steps[args.step], r.status, path)})", file=sys.stderr)
            elif (note := _no_end(r, r.steps[args.step])) is not None:
                print(f"({note})", file=sys.stderr)
            return 0
        run_state = _common.run_state(st, r.run_id).runs[r.run_id]
        step_done = run_state.steps[args.step].done
        finished = step_done or _common.shown_status(run_state) != "running"
        if finished and path.exists() and path.stat().st_size == offset:
            if (note := _no_end(run_state, run_state.steps[args.step])) is not None:
                print(f"({note})", file=sys.stderr)
            return 0
        st.follow(st.last_seq(), timeout=0.3)
        time.sleep(0.05)


def _no_end(r: RunState, step: StepState) -> str | None:
    """Why the log stops without its last attempt's end (`=== attempt 1 failed: ... ===`):
    the process that wrote it died with the run, or the agent or m27's runner ended the
    step for it. Without this, a crashed step's log read as one still running."""
    if step_status(r, step) == "crashed":
        why = step.reason if step.status == "failed" else r.reason or "the run's process died"
    elif step.status == "failed" and step.reason.startswith(("lost", "m27 error")):
        why = step.reason
    else:
        return None
    return f"the log ends without attempt {max(1, step.attempts)}'s end: {why}"


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


#: Logs are copied in blocks of this size (a chatty step's log is gigabytes, not one read).
_BLOCK = 1 << 20


def _open(path: Path) -> BinaryIO:
    """The log, opened to read; a folder or pipe put in its place (a pipe would wait for a
    writer forever) or an unreadable file raises :class:`_Unreadable` saying which."""
    what = not_a_file(path)
    if what is not None:
        raise _Unreadable(f"{path} is {what}, not a file")
    try:
        return path.open("rb")
    except OSError as exc:
        raise _Unreadable(f"{path}: {exc.strerror or exc}") from None


def _copy(path: Path, offset: int, decoder: codecs.IncrementalDecoder) -> int:
    """Write the log from `offset` to its current end; the new offset."""
    with _open(path) as fh:
        fh.seek(offset)
        while block := fh.read(_BLOCK):
            offset += len(block)
            sys.stdout.write(decoder.decode(block))
    sys.stdout.flush()
    return offset


def _tail_offset(path: Path, lines: int) -> int:
    """Where the last `lines` lines of the file start, read backwards block by block; a
    newline that ends the file ends its last line and starts no other."""
    with _open(path) as fh:
        end = fh.seek(0, 2)
        if lines == 0:
            return end
        pos = end
        if end:
            fh.seek(end - 1)
            pos -= fh.read(1) == b"\n"
        while pos > 0:
            start = max(0, pos - _BLOCK)
            fh.seek(start)
            block = fh.read(pos - start)
            while (i := block.rfind(b"\n")) >= 0:
                lines -= 1
                if lines == 0:
                    return start + i + 1
                block = block[:i]
            pos = start
        return 0
