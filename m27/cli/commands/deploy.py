"""`m27 deploy FILE --name N`: a Prefect deployment of a pipeline on its tier's queue."""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
from pathlib import Path
from typing import Any

from m27.cli.commands import SUMMARY, _common
from m27.cli.commands._options import add_set_option
from m27.cli.commands.pool import lab_server
from m27.lab.capacity import TIERS, check_tier
from m27.lab.deploy import POOL_NAME, DeploymentSpec
from m27.spec import load_pipeline, parse_set_args


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "deploy",
        help=SUMMARY["deploy"],
        description="Validate FILE and create (or update) deployment m27-pipeline/NAME of "
        "flows/pipeline.py with FILE and the --set values as parameters, in work pool m27 "
        "on the queue of --tier. With --cron the deployment runs on that schedule. The "
        "server is PREFECT_API_URL's, or without it this node's own (the node service's, "
        "started when none runs); `m27 worker` runs the flow runs. A variable `vars:` declares "
        "without a value is left to each run (its overrides); --cron then needs it in --set. "
        "Exit code 2 for a bad file.",
    )
    p.add_argument(
        "file",
        help="pipeline YAML (its absolute path is stored: keep it on a "
        "filesystem every worker node sees)",
    )
    p.add_argument("--name", required=True, help="deployment name")
    p.add_argument("--cron", help='schedule, e.g. "0 2 * * *" (every night at 02:00)')
    p.add_argument("--timezone", help="time zone of --cron, e.g. Europe/Berlin (default UTC)")
    add_set_option(p)
    p.add_argument("--tier", choices=TIERS, default="ready", help="queue to run on (default ready)")
    p.add_argument("--pool", default=POOL_NAME, help="work pool (default m27)")
    p.add_argument("--json", action="store_true", help="print the deployment as JSON")
    p.set_defaults(func=run)


async def _deploy(spec: DeploymentSpec) -> dict[str, Any]:
    from prefect.client.orchestration import get_client

    from m27.lab.deploy import deploy

    async with get_client() as client:
        return await deploy(client, spec)


def run(args: argparse.Namespace) -> int:
    overrides = parse_set_args(args.sets)
    # SpecError -> exit 2 before any API call; a variable declared without a value is
    # left to each run
    pipeline = load_pipeline(args.file, overrides, each_run=True)
    spec = DeploymentSpec(
        name=args.name,
        spec_path=str(Path(args.file).resolve()),
        pipeline_name=pipeline.name,
        overrides=overrides,
        tier=check_tier(args.tier),
        cron=args.cron,
        timezone=args.timezone,
        pool=args.pool,
        variables=dict(pipeline.vars),
        each_run=pipeline.unset,
        lists=pipeline.lists,
    )
    spec.check()  # before a server is asked, or started
    with lab_server() as server:
        result = asyncio.run(_deploy(spec))
    if args.json:
        _common.print_json(result)
    else:
        when = f", cron {args.cron!r} ({args.timezone or 'UTC'})" if args.cron else ""
        print(f"deployment {result['name']}: pool {result['pool']}, queue {result['queue']}{when}")
        api = f"PREFECT_API_URL={server.url} " if server.node_home is not None else ""
        given = ""
        if spec.each_run:
            names = ", ".join(spec.each_run)
            print(f"each run gives {names} in its overrides (`vars:` declares no value)")
            # a run's overrides replace the deployment's whole (Prefect replaces a
            # parameter), so the example carries the --set values too
            values = {**overrides, **{n: "..." for n in spec.each_run}}
            given = f" --params {shlex.quote(json.dumps({'overrides': values}))}"
        print(f"run it now: {api}prefect deployment run '{result['name']}'{given}")
        if server.node_home is not None:
            pool = "" if result["pool"] == POOL_NAME else f" --pool {shlex.quote(result['pool'])}"
            print(f"its runs start when a worker polls pool {result['pool']}: `m27 worker{pool}`")
    return 0
