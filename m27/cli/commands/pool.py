"""`m27 pool init`: create the `m27` work pool and its tier queues on the Prefect server."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from m27._exceptions import M27Error
from m27.cli.commands import SUMMARY, _common
from m27.lab.deploy import POOL_NAME


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "pool",
        help=SUMMARY["pool"],
        description="`m27 pool init` creates work pool m27 (type m27) with the queues "
        "immediate, ready and background (priorities 1, 2, 3) on the Prefect server at "
        "PREFECT_API_URL, or without it on this node's own (the node service's); Prefect "
        "adds its own queue `default` to every pool, which m27 deploys nothing to. Running "
        "it again changes nothing.",
    )
    actions = p.add_subparsers(dest="pool_action", metavar="ACTION", required=True)
    init = actions.add_parser("init", help="create the pool and its tier queues (idempotent)")
    init.add_argument("--pool", default=POOL_NAME, help="work pool name (default m27)")
    init.add_argument("--json", action="store_true", help="print the result as JSON")
    init.set_defaults(func=run)


@dataclass(frozen=True)
class LabServer:
    """The Prefect server a lab command talks to; `node_home` is set when it is this
    node's own (the node service's), which must then not stop while the command runs."""

    url: str
    node_home: Path | None = None


@contextlib.contextmanager
def lab_server() -> Iterator[LabServer]:
    """PREFECT_API_URL (the lab's server), else this node's own Prefect server.

    One GPU server needs no lab server for deployments and schedules: the node service
    keeps a Prefect server on SQLite under ``$M27_HOME/prefect/`` (started here when none
    runs, as `m27 run` does), and a deployment made on it is run by this node's
    `m27 worker`. Prefect reads its settings once, on import, so the URL is also put in
    Prefect's settings for this block; ``os.environ`` carries it to child processes.
    A server that cannot be reached or refuses a request is an M27Error naming it."""
    url = os.environ.get("PREFECT_API_URL", "")
    from prefect.settings import PREFECT_API_URL, temporary_settings

    url = url or PREFECT_API_URL.value() or ""
    server = LabServer(url)
    if not url:
        from m27.config import m27_home
        from m27.node.service import ensure_service

        home = m27_home()
        info, _ = ensure_service(home)
        os.environ["PREFECT_API_URL"] = info.url
        print(
            f"m27: PREFECT_API_URL is not set: using this node's Prefect server {info.url} "
            "(the node service's; set PREFECT_API_URL for a lab's server)",
            file=sys.stderr,
        )
        server = LabServer(info.url, home)
    import httpx

    try:
        with temporary_settings(updates={PREFECT_API_URL: server.url}):
            yield server
    except httpx.HTTPStatusError as exc:
        raise M27Error(
            f"the Prefect server at {server.url} refused a request: "
            f"{exc.response.status_code} {exc.response.text[:300]}",
            url=server.url,
        ) from exc
    except httpx.HTTPError as exc:
        raise M27Error(
            f"cannot reach the Prefect server at {server.url}: {exc}; is it running?",
            url=server.url,
        ) from exc


async def init_pool(pool: str) -> dict[str, Any]:
    """Create the pool and its tier queues (safe to repeat); `m27 worker` calls it too."""
    from prefect.client.orchestration import get_client

    from m27.lab.deploy import pool_init

    async with get_client() as client:
        return await pool_init(client, pool)


def run(args: argparse.Namespace) -> int:
    with lab_server():
        result = asyncio.run(init_pool(args.pool))
    if args.json:
        _common.print_json(result)
    else:
        verb = "created" if result["created"] else "exists"
        queues = ", ".join(
            f"{q} (priority {p})" for q, p in sorted(result["queues"].items(), key=lambda kv: kv[1])
        )
        print(f"work pool {result['pool']}: {verb}; queues: {queues}")
    return 0
