"""`m27 simulate TRACE`: replay a trace under several policies and compare them."""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from m27._exceptions import SpecError
from m27.cli.commands import SUMMARY
from m27.cli.commands._options import duration, number, whole
from m27.paths import not_a_file
from m27.units import closest, count

if TYPE_CHECKING:
    from collections.abc import Callable

    from m27.sim.trace import Trace


#: Highest offered load (the lab week's, Alibaba's --load): the lab week's jobs grow with it
#: (~118 per unit; 100: ~12,000 jobs); lab:load=1e9 asked for 10^11 jobs and never returned.
LOAD_MAX = 100.0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "simulate",
        help=SUMMARY["simulate"],
        description="TRACE is a JSON Lines trace, an Alibaba openb_pod_list_*.csv, an m27 "
        "event log (events.db), or `lab[:seed=N,load=X]` for the generated lab week. "
        "Prints GPU busy %, idle % while work waits, makespan, jobs done in the window "
        "and JCT per priority class for each policy.",
    )
    p.add_argument("trace", metavar="TRACE")
    p.add_argument(
        "--gpus", type=whole(least=1, most=1024), default=None, help="GPUs of the simulated node"
    )
    p.add_argument(
        "--policy",
        action="append",
        default=None,
        help="manual, fifo, backfill, m27 (repeat or comma-separate; default: all)",
    )
    p.add_argument("--report", type=Path, default=None, help="write an HTML report here")
    p.add_argument("--json", action="store_true", help="one JSON object per policy")
    p.add_argument(
        "--window",
        type=duration("72h"),
        metavar="DURATION",
        help="window for busy %% and jobs done (72h)",
    )
    p.add_argument("--jobs", type=whole(least=1), default=2000, help="Alibaba: GPU pods to take")
    p.add_argument(
        "--load",
        type=number(least=0.01, most=LOAD_MAX),
        default=0.9,
        help=f"Alibaba: offered load on the node (0.01 to {LOAD_MAX:g})",
    )
    p.add_argument("--save-trace", type=Path, default=None, help="also write the trace (JSONL)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from m27.sim import POLICIES, compare
    from m27.sim.report import html_report, table
    from m27.sim.trace import save_trace

    try:
        policies = [x for p in (args.policy or [",".join(POLICIES)]) for x in p.split(",") if x]
        unknown = [p for p in policies if p not in POLICIES]
        if unknown:
            raise SpecError(f"unknown policy {', '.join(unknown)}; use {', '.join(POLICIES)}")
        window = args.window
        for out in (args.report, args.save_trace):
            if out is not None:
                _check_writable(out)
        trace = _load(args)
    except ValueError as exc:
        print(f"m27: {exc}", file=sys.stderr)
        return 2
    if args.gpus is not None:
        trace = trace.with_gpus(args.gpus)
    if wide := [j for j in trace.jobs if j.gpus > trace.gpus]:
        # no policy could ever start them: the table would count them as never done
        first = max(wide, key=lambda j: j.gpus)
        print(
            f"m27: {trace.name}: {count(len(wide), 'job')} asking for more GPUs than the "
            f"simulated node has ({trace.gpus}); job {first.id!r} asks for {first.gpus}: "
            f"simulate a larger node with --gpus {first.gpus}",
            file=sys.stderr,
        )
        return 2
    if args.save_trace:
        save_trace(trace, args.save_trace)
    results = compare(trace, policies, window=window, on_policy=_progress(trace, policies))
    if sys.stderr.isatty():
        print("\x1b[2K", end="", file=sys.stderr, flush=True)  # the last progress line
    if args.json:
        for _, m in results:
            sys.stdout.write(json.dumps({"trace": trace.name, **m.to_json()}) + "\n")
    else:
        print(f"{trace.name}: {len(trace.jobs)} jobs, {trace.gpus} GPUs")
        print(table([m for _, m in results]))
    if args.report:
        args.report.write_text(html_report(results, f"m27 simulate: {trace.name}"))
        if not args.json:
            print(f"report: {args.report}")
    return 0


def _progress(trace: Trace, policies: list[str]) -> Callable[[str, int], None] | None:
    """On a terminal, which policy is being simulated (100,000 jobs take ~40 s under
    m27's; nothing was shown until the table)."""
    if not sys.stderr.isatty():
        return None

    def say(name: str, i: int) -> None:
        print(
            f"\x1b[2Ksimulating {name} ({i} of {len(policies)}) on "
            f"{count(len(trace.jobs), 'job')}...",
            end="\r",
            file=sys.stderr,
            flush=True,
        )

    return say


def _check_writable(path: Path) -> None:
    """The OSError writing `path` would raise, before the simulation (minutes on a large
    trace) rather than after it."""
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    folder = path.parent
    if not folder.is_dir():
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
    if not os.access(folder, os.W_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))


def _load(args: argparse.Namespace) -> Trace:
    from m27.sim.alibaba import load_alibaba, scale_to_node, sniff
    from m27.sim.eventlog import trace_from_events
    from m27.sim.lab import lab_week
    from m27.sim.trace import load_trace

    kind = sniff(args.trace)
    if kind == "lab":
        seed, load = _lab_options(args.trace)
        return lab_week(seed=seed, gpus=args.gpus or 4, load=load)
    path = Path(args.trace)
    if not path.exists():
        raise SpecError(f"no such trace: {path}", file=str(path))
    what = not_a_file(path)
    if what is not None:
        first = " (save the trace first)" if what == "a pipe" else ""
        raise SpecError(f"{path} is {what}, not a trace file{first}", file=str(path))
    if kind == "alibaba":
        jobs = load_alibaba(path, limit=args.jobs)
        return scale_to_node(jobs, gpus=args.gpus or 8, load=args.load)
    if kind == "events":
        from m27.store.sqlite import SqliteEventStore

        store = SqliteEventStore(path)
        try:
            records = store.read()
        finally:
            store.close()
        return trace_from_events(records, gpus=args.gpus or _node_gpus(records) or 4)
    return load_trace(path)


def _node_gpus(records: list[Any]) -> int | None:
    """The GPU count of the node that wrote the log (its last ``AgentStarted``)."""
    from m27.events import AgentStarted

    counts = [r.event.gpus for r in records if isinstance(r.event, AgentStarted)]
    return counts[-1] if counts and counts[-1] > 0 else None


_LAB_KEYS = {
    "seed": "a whole number, e.g. lab:seed=3",
    "load": f"a number above 0 and at most {LOAD_MAX:g}, e.g. lab:load=1.2",
}


def _lab_options(text: str) -> tuple[int, float]:
    """``lab[:seed=N,load=X]`` -> (seed, load), with a clean message for a bad option."""
    seed, load = 0, 1.0
    for item in text.partition(":")[2].split(","):
        if not item:
            continue
        key, eq, value = item.partition("=")
        if key not in _LAB_KEYS:
            close = closest(key, _LAB_KEYS)
            hint = f"; did you mean {close!r}?" if close else " (known: seed, load)"
            raise SpecError(f"{text}: unknown option {key!r}{hint}", value=text)
        try:
            if not eq:
                raise ValueError
            if key == "seed":
                seed = int(value)
            else:
                load = float(value)
                if not 0 < load <= LOAD_MAX:
                    raise ValueError
        except ValueError:
            raise SpecError(
                f"{text}: {key} must be {_LAB_KEYS[key]}, not {value!r}", value=text
            ) from None
    return seed, load
