"""`m27 agent`: run the node agent as a service, until SIGTERM or SIGINT.

One agent serves a node. If another process holds the node (an `m27 run` that embeds
its agent), this one waits for it to end and then takes over; the service then re-adopts
the steps the embedded agent left running (see docs/agent.md).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

from m27.config import m27_home
from m27.events import Event
from m27.node.embed import NodeLock, build_agent
from m27.policy import Decision, Reserve, key_text


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "agent",
        help="run the node agent (the GPU queue) as a service",
        description="Run the node agent until SIGTERM/SIGINT: it grants GPUs and CPU slots "
        "to waiting steps with the three-tier policy, pauses and resumes guests, promotes "
        "them, and re-adopts live steps after a restart. `m27 run` embeds one when none runs.",
    )
    p.add_argument("--verbose", action="store_true", help="print one line per decision")
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
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    lock = NodeLock(home)
    told = False
    while not lock.acquire():
        if not told:
            print(
                f"m27 agent: pid {lock.holder()} runs this node's agent; waiting for it to end",
                file=sys.stderr,
                flush=True,
            )
            told = True
        if stop.wait(0.2):
            return 0
    try:
        agent = build_agent(home, on_decision=_printer if args.verbose else None)
        try:
            agent.start()
            print(
                f"m27 agent: serving {home} with {len(agent.backend.devices())} "
                f"{agent.backend.kind} GPU(s), tick {agent.tick_s * 1000:.0f} ms",
                flush=True,
            )
            agent.run(stop)
        finally:
            agent.close()
            agent.store.close()
    finally:
        lock.release()
    print("m27 agent: stopped", flush=True)
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
