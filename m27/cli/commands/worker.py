"""`m27 worker`: the Prefect worker of this node (type m27), polling the m27 work pool."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from m27.cli.commands import SUMMARY
from m27.cli.commands._options import whole
from m27.cli.commands.pool import lab_server
from m27.lab.capacity import TIERS
from m27.lab.deploy import POOL_NAME


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "worker",
        help=SUMMARY["worker"],
        description="Poll work pool m27 and run the flow runs this node has room for, "
        "highest tier first; publish the node's free seats; record crashed runs. The node "
        "is M27_HOME and M27_GPUS; PREFECT_API_URL names the server (without it: this "
        "node's own, the node service's, kept running while the worker runs). Poll interval: "
        "PREFECT_WORKER_QUERY_SECONDS (default 10). Same as `prefect worker start --pool "
        "m27 --type m27`.",
    )
    p.add_argument("--pool", default=POOL_NAME, help="work pool (default m27)")
    p.add_argument("--name", help="worker name (default m27-<node>)")
    p.add_argument("--node", help="node name (default M27_NODE or the host name)")
    p.add_argument(
        "--queue",
        dest="queues",
        action="append",
        choices=TIERS,
        help="only these tier queues (repeatable; default all)",
    )
    p.add_argument(
        "--limit",
        type=whole(least=1),
        help="at most this many flow runs at once (default: no limit)",
    )
    p.add_argument("--run-once", action="store_true", help="poll once, wait for its runs, exit")
    p.set_defaults(func=run)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


#: How often a worker on the node service's Prefect server tells the service it is in use.
IN_USE_EVERY_S = 60.0


def keep_in_use(home: Path, stop: threading.Event, every: float = IN_USE_EVERY_S) -> None:
    """Mark the node service used every `every` seconds until `stop`: a worker waiting for
    scheduled runs has no run or step, and the service would stop after `service_idle`,
    taking the Prefect server the worker polls with it."""
    from m27.node.info import touch

    while not stop.wait(every):
        touch(home)


def run(args: argparse.Namespace) -> int:
    if args.node:
        os.environ["M27_NODE"] = args.node
    stop = threading.Event()
    with lab_server() as server:
        if server.node_home is not None:
            from m27.config import load_settings

            # well within service_idle, however short it is set
            every = min(IN_USE_EVERY_S, load_settings().service_idle / 4)
            threading.Thread(
                target=keep_in_use,
                args=(server.node_home, stop, every),
                name="m27-in-use",
                daemon=True,
            ).start()
        try:
            return _serve(args)
        finally:
            stop.set()


def _serve(args: argparse.Namespace) -> int:
    import anyio

    from m27.cli.commands.pool import init_pool
    from m27.lab.worker import M27Worker, node_name

    anyio.run(init_pool, args.pool)
    worker = M27Worker(
        work_pool_name=args.pool,
        work_queues=args.queues,
        name=args.name or f"m27-{node_name()}",
        limit=args.limit,
        create_pool_if_not_found=False,
    )
    signal.signal(signal.SIGTERM, _interrupt)  # systemd stop: tear down like Ctrl-C
    try:
        anyio.run(lambda: worker.start(run_once=args.run_once))
    except KeyboardInterrupt:
        print("m27 worker: stopped", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run `m27 worker` without the full CLI (tests, and a systemd unit before wiring)."""
    parser = argparse.ArgumentParser(prog="m27")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["worker", *(argv or [])])
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
