"""`m27 pool init`: create the `m27` work pool and its tier queues on the Prefect server."""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from m27._exceptions import ConfigError
from m27.cli.commands import _common
from m27.lab.deploy import POOL_NAME


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "pool",
        help="manage the m27 work pool on a Prefect server",
        description="`m27 pool init` creates work pool m27 (type m27) with the queues "
        "immediate, ready and background (priorities 1, 2, 3) on the Prefect server at "
        "PREFECT_API_URL. Running it again changes nothing.",
    )
    actions = p.add_subparsers(dest="pool_action", metavar="ACTION", required=True)
    init = actions.add_parser("init", help="create the pool and its tier queues (idempotent)")
    init.add_argument("--pool", default=POOL_NAME, help="work pool name (default m27)")
    init.add_argument("--json", action="store_true", help="print the result as JSON")
    init.set_defaults(func=run)


def require_api() -> str:
    """The Prefect server to talk to; a lab command makes no sense on a temporary server."""
    url = os.environ.get("PREFECT_API_URL", "")
    if not url:
        from prefect.settings import PREFECT_API_URL

        url = PREFECT_API_URL.value() or ""
    if not url:
        raise ConfigError(
            "PREFECT_API_URL is not set: point it at the lab's Prefect server, "
            "e.g. export PREFECT_API_URL=http://prefect.lab:4200/api"
        )
    return url


async def init_pool(pool: str) -> dict[str, Any]:
    """Create the pool and its tier queues (safe to repeat); `m27 worker` calls it too."""
    from prefect.client.orchestration import get_client

    from m27.lab.deploy import pool_init

    async with get_client() as client:
        return await pool_init(client, pool)


def run(args: argparse.Namespace) -> int:
    require_api()
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
