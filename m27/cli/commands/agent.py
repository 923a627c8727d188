"""`m27 agent`: the node service (agent, crash watcher, the node's Prefect server).

`m27 agent` runs it in the foreground until SIGTERM or SIGINT (systemd, compose);
`m27 agent status` and `m27 agent stop` talk to the running one through
``$M27_HOME/service.json``. One agent serves a node: if another process holds the node,
this one waits for it to end and then takes over, re-adopting the steps it left running
(see docs/agent.md).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from m27.cli.commands import SUMMARY, _common
from m27.cli.commands._options import duration, whole
from m27.cli.warm import runner_pid
from m27.config import load_settings, m27_home
from m27.events import Event, RunSubmitted
from m27.node.info import ServiceInfo, find_service
from m27.node.serve import serve
from m27.node.service import stop_service
from m27.policy import Decision, Reserve, key_text
from m27.signals import stop_event
from m27.store.sqlite import open_store
from m27.units import count, format_duration, listed


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "agent",
        help=SUMMARY["agent"],
        description="Run the node service until SIGTERM/SIGINT: the agent (it grants GPUs "
        "and CPU slots to waiting steps with the three-tier policy, pauses, resumes and "
        "promotes guests), the crash watcher (a run whose process died becomes Crashed in "
        "Prefect and its steps are stopped) and, unless PREFECT_API_URL names a lab server, "
        "one Prefect server on 127.0.0.1. `m27 run` starts it detached when none runs. "
        "`m27 agent status` shows it, `m27 agent stop` stops it.",
    )
    p.add_argument(
        "action",
        nargs="?",
        choices=("serve", "status", "stop"),
        default="serve",
        help="serve (default, in the foreground), status, or stop the running service",
    )
    p.add_argument("--verbose", action="store_true", help="print one line per decision")
    p.add_argument("--json", action="store_true", help="status as JSON")
    p.add_argument(
        "--port",
        type=whole(least=1, most=65535),
        help="the Prefect server's port (default: the one it had last time, while free)",
    )
    p.add_argument(
        "--idle",
        type=duration("10m"),
        metavar="DURATION",
        help="stop after this long with no runs and no steps (default: never in the "
        "foreground; `service_idle` for a service an m27 command started)",
    )
    p.add_argument("--on-demand", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=run)


#: Events worth a line even without a decision behind them.
_LOUD = frozenset({"GpuLost", "StepFailed", "GpuOverheated", "GpuThrottled"})


def _printer(decision: Decision, appended: Sequence[Event]) -> None:
    stamp = time.strftime("%H:%M:%S")
    for a in decision.actions:
        if isinstance(a, Reserve):
            continue
        name = type(a).__name__
        where = getattr(a, "gpus", None) or (getattr(a, "gpu", None),)
        extra = f" tier={a.tier}" if hasattr(a, "tier") else ""
        gpus = ",".join(str(g) for g in where if g is not None)
        print(f"{stamp} {name:<11} {key_text(a.key)} gpu={gpus or '-'}{extra}", flush=True)
    for e in appended:
        if e.kind in _LOUD or (e.kind == "GuestPaused" and _how(e)):
            print(f"{stamp} {e.kind:<11} {e.to_payload()}", flush=True)


def _how(e: Event) -> bool:
    return getattr(e, "how", "") == "signal"


def run(args: argparse.Namespace) -> int:
    home = m27_home()
    if args.action == "status":
        return _status(home, args.json)
    if args.action == "stop":
        return _stop(home)
    idle_s: float | None = args.idle
    if idle_s is None and args.on_demand:
        idle_s = load_settings().service_idle
    stop = stop_event((signal.SIGTERM, signal.SIGINT))
    try:
        return serve(
            home,
            stop,
            port=args.port,
            idle_s=idle_s,
            on_decision=_printer if args.verbose else None,
            warn=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except OSError as exc:  # a full disk, a read-only home: one clear line
        print(f"m27 agent: cannot serve {home}: {exc}", file=sys.stderr, flush=True)
        return 1


def _runs_served(home: Path, info: ServiceInfo) -> int:
    from m27.store.sqlite import open_store

    store = open_store(home)
    try:
        return sum(
            1
            for rec in store.read_runs((), outline=True)  # runs as a whole: not every step's
            if isinstance(rec.event, RunSubmitted)
            and rec.event.at >= info.started_at
            and rec.event.host == info.host
        )
    finally:
        store.close()


def _status(home: Path, as_json: bool) -> int:
    info = find_service(home)
    if info is None:
        if as_json:
            print(json.dumps({"running": False, "home": str(home)}))
        else:
            print(f"no node service runs for {home} (the next `m27 run` starts one)")
        return 1
    uptime = max(0.0, time.time() - info.started_at)
    data = {
        "running": True,
        "pid": info.pid,
        "prefect_url": info.url,
        "ui_url": info.ui_url,
        "own_server": info.own_server,
        "prefect_pid": info.prefect_pid,
        "state": info.state,
        "uptime_s": round(uptime, 1),
        "runs_served": _runs_served(home, info),
        "restarts": info.restarts,
        "warm_runner_pid": runner_pid(home),
        "home": str(home),
        # what it did: crashed runs closed, resumed (on_crash: resume), Prefect told late
        "log": str(home / "service.log"),
    }
    if as_json:
        print(json.dumps(data, indent=2))
        return 0
    server = "own" if info.own_server else "lab"
    print(f"node service  pid {info.pid}  {info.state}  up {format_duration(uptime)}")
    print(f"prefect       {info.url} ({server} server; UI {info.ui_url})")
    print(f"runs served   {data['runs_served']}")
    warm = data["warm_runner_pid"]
    print(
        f"warm runner   pid {warm}"
        if warm
        else "warm runner   not ready (runs use their own process)"
    )
    if info.restarts:
        print(f"restarts      Prefect server restarted {info.restarts} time(s)")
    print(f"log           {data['log']}")
    return 0


def _stop(home: Path) -> int:
    info = stop_service(home)
    if info is None:
        print(f"no node service runs for {home}")
        return 0
    print(f"node service (pid {info.pid}) stopped")
    store = open_store(home)
    try:
        state = _common.outline(store)  # every run as a whole: status and process
    finally:
        store.close()
    live = [r.run_id for r in state.runs.values() if _common.shown_status(r) == "running"]
    if live:
        one = len(live) == 1
        print(
            f"{count(len(live), 'run')} still running ({listed(live, 3)}) "
            f"{'goes' if one else 'go'} on without it; Prefect shows how "
            f"{'it ends' if one else 'they end'} once the service runs again (the next "
            "`m27 run` starts it)"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m m27.cli.commands.agent``: the service without the rest of the CLI."""
    parser = argparse.ArgumentParser(prog="m27")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["agent", *(sys.argv[1:] if argv is None else argv)])
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
