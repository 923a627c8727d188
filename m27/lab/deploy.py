"""A lab on Prefect: the `m27` work pool, its tier queues and pipeline deployments.

One Prefect server serves the lab; each GPU server runs `m27 agent` and `m27 worker`. A
pipeline is deployed onto the queue of its tier (``immediate``, ``ready``, ``background``);
the m27 worker on each node takes a flow run only when its node has a free seat of that
tier, highest tier first (:mod:`m27.lab.capacity`).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from m27._exceptions import ConfigError
from m27.lab.capacity import TIERS, Tier

if TYPE_CHECKING:
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.schedules import CronSchedule

POOL_NAME = "m27"
POOL_TYPE = "m27"
FLOW_NAME = "m27-pipeline"
ENTRYPOINT = "flows/pipeline.py:pipeline_flow"


# --- the pool and its queues ----------------------------------------------------------------


async def pool_init(client: PrefectClient, name: str = POOL_NAME) -> dict[str, Any]:
    """Create work pool `name` (type m27) with the tier queues; safe to run again.

    Returns what exists afterwards: {"pool": name, "created": bool, "queues": {name: prio}}.
    """
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    from m27.lab.worker import M27Worker

    created = False
    try:
        await client.read_work_pool(name)
    except ObjectNotFound:
        template = M27Worker.get_default_base_job_template()
        try:
            await client.create_work_pool(
                WorkPoolCreate(name=name, type=POOL_TYPE, base_job_template=template)
            )
            created = True
        except ObjectAlreadyExists:  # another node created it meanwhile
            pass
    existing = {q.name: q for q in await client.read_work_queues(work_pool_name=name)}
    for priority, tier in enumerate(TIERS, start=1):
        queue = existing.get(tier)
        if queue is None:
            with contextlib.suppress(ObjectAlreadyExists):  # another node was quicker
                await client.create_work_queue(
                    name=tier,
                    work_pool_name=name,
                    priority=priority,
                    description=f"m27 {tier} tier",
                )
        elif queue.priority != priority:
            await client.update_work_queue(queue.id, priority=priority)
    queues = {q.name: q.priority for q in await client.read_work_queues(work_pool_name=name)}
    return {"pool": name, "created": created, "queues": queues}


# --- deployments ----------------------------------------------------------------------------


@dataclass(frozen=True)
class DeploymentSpec:
    """What `m27 deploy` sends: one pipeline file with its {{VARS}} values on a tier."""

    name: str
    spec_path: str
    pipeline_name: str
    overrides: Mapping[str, str]
    tier: Tier = "ready"
    cron: str | None = None
    timezone: str | None = None
    pool: str = POOL_NAME
    description: str = ""
    #: the pipeline's variables with the values its runs get unless they give their own
    #: (the file's `vars:`, then --set), shown in the deployment's run form
    variables: Mapping[str, str] = field(default_factory=dict)
    #: variables `vars:` declares without a value and no --set gave: each run gives them
    each_run: tuple[str, ...] = ()
    #: list variables: the run form says how to give their values
    lists: tuple[str, ...] = ()

    def check(self) -> None:
        """Refuse what Prefect would refuse, before any server is asked (or started), in
        one line naming the option: a name with / % & < >, a bad --cron or --timezone; and
        a schedule for a pipeline whose runs must each give a variable (a scheduled run
        gives none, so every one would fail)."""
        if any(c in self.name for c in _NAME_FORBIDDEN):
            raise ConfigError(
                f"--name {self.name!r}: a deployment name cannot contain "
                f"{' '.join(_NAME_FORBIDDEN)}",
                name=self.name,
            )
        if self.cron:
            schedule_of(self.cron, self.timezone)
            if self.each_run:
                names = ", ".join(self.each_run)
                sets = " ".join(f"--set {n}=..." for n in self.each_run)
                raise ConfigError(
                    f"--cron: a scheduled run gives no variables, and `vars:` declares {names}"
                    f" without a value; give {'it' if len(self.each_run) == 1 else 'them'} "
                    f"here: {sets}",
                    variables=list(self.each_run),
                )

    def parameter_schema(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """The flow's parameter schema `base` with `overrides` spelled out: one text field
        per variable, its default the value a run gets without one, and the variables each
        run must give required, so Prefect's run form asks for them by name."""
        schema = copy.deepcopy(dict(base))
        if not (self.variables or self.each_run):
            return schema
        fields: dict[str, Any] = {}
        for name, value in self.variables.items():
            fields[name] = {"type": "string", "title": name, "default": value}
            if name in self.lists:
                fields[name]["description"] = "a list: values separated by blanks or commas"
        for name in self.each_run:
            fields[name] = {"type": "string", "title": name}
        old = schema["properties"]["overrides"]
        schema["properties"]["overrides"] = {
            **{k: old[k] for k in ("position",) if k in old},
            "title": "overrides",
            "description": "the pipeline's {{VARS}}: a run uses these values, the file's "
            "`vars:` and the deployment's --set, unless it gives its own",
            "type": "object",
            "properties": fields,
            "required": list(self.each_run),
            "additionalProperties": {"type": "string"},
        }
        return schema

    def parameters(self) -> dict[str, Any]:
        return {
            "spec_path": self.spec_path,
            "overrides": dict(self.overrides),
            "pipeline_name": self.pipeline_name,
        }

    def tags(self) -> list[str]:
        return ["m27", f"tier:{self.tier}", f"pipeline:{self.pipeline_name}"]


#: Characters Prefect refuses in a deployment name.
_NAME_FORBIDDEN = ("/", "%", "&", "<", ">")


def schedule_of(cron: str, timezone: str | None) -> CronSchedule:
    """The Prefect schedule of `cron` in `timezone` (UTC when None); a ConfigError with
    the option and Prefect's reason when either is bad (not pydantic's error dump)."""
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    try:
        return CronSchedule(cron=cron, timezone=timezone or "UTC")
    except ValidationError as exc:
        error = exc.errors()[0]
        reason = str(error.get("msg", exc)).removeprefix("Value error, ")
        option = f"--timezone {timezone!r}" if "timezone" in error.get("loc", ()) else ""
        raise ConfigError(
            f"{option or f'--cron {cron!r}'}: {reason}", cron=cron, timezone=timezone
        ) from None


#: Where a flow run finds flows/pipeline.py: the m27 installed on the node that runs it (the
#: m27 worker sets M27_FLOWS_DIR for each flow run), not the folder `m27 deploy` ran in.
FLOWS_DIR_TEMPLATE = "{{ $M27_FLOWS_DIR }}"


def pull_steps() -> list[dict[str, Any]]:
    return [{"prefect.deployments.steps.set_working_directory": {"directory": FLOWS_DIR_TEMPLATE}}]


async def deploy(client: PrefectClient, spec: DeploymentSpec) -> dict[str, Any]:
    """Create or update deployment ``m27-pipeline/<name>``; returns its id and full name.

    Updating replaces the parameters, queue and schedule: the command line is the truth.
    The pool and its tier queues are made first when missing (`pool_init`): a deployment
    on a pool that does not exist is refused by the server.
    """
    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.utilities.callables import parameter_schema

    from flows.pipeline import pipeline_flow

    schedules: list[DeploymentScheduleCreate] = []
    if spec.cron:
        cron = schedule_of(spec.cron, spec.timezone)
        schedules.append(DeploymentScheduleCreate(schedule=cron, active=True))
    await pool_init(client, spec.pool)
    flow_id = await client.create_flow_from_name(FLOW_NAME)
    deployment_id = await client.create_deployment(
        flow_id=flow_id,
        name=spec.name,
        description=spec.description or f"m27 pipeline {spec.pipeline_name} ({spec.tier} tier)",
        parameters=spec.parameters(),
        work_pool_name=spec.pool,
        work_queue_name=spec.tier,
        tags=spec.tags(),
        entrypoint=ENTRYPOINT,
        pull_steps=pull_steps(),
        parameter_openapi_schema=spec.parameter_schema(
            parameter_schema(pipeline_flow.fn).model_dump_for_openapi()
        ),
        schedules=schedules,
        enforce_parameter_schema=False,
    )
    # The server keeps old schedules on an upsert: make the stored ones what was asked.
    existing = await client.read_deployment_schedules(deployment_id)
    wanted = [(s.schedule.cron, s.schedule.timezone) for s in schedules]  # type: ignore[union-attr]
    have = [
        (getattr(s.schedule, "cron", None), getattr(s.schedule, "timezone", None)) for s in existing
    ]
    if have != wanted:
        for old in existing:
            await client.delete_deployment_schedule(deployment_id, old.id)
        if schedules:
            await client.create_deployment_schedules(deployment_id, schedules)
    return {
        "id": str(deployment_id),
        "name": f"{FLOW_NAME}/{spec.name}",
        "pool": spec.pool,
        "queue": spec.tier,
        "parameters": spec.parameters(),
        "each_run": list(spec.each_run),
        "schedule": {"cron": spec.cron, "timezone": spec.timezone or "UTC"} if spec.cron else None,
    }
