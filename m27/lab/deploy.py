"""A lab on Prefect: the `m27` work pool, its tier queues, pipeline deployments, and how much
room a node has for each tier.

One Prefect server serves the lab; each GPU server runs `m27 agent` and `m27 worker`. A
pipeline is deployed onto the queue of its tier (``immediate``, ``ready``, ``background``);
the m27 worker on each node takes a flow run only when its node has a free seat of that
tier, highest tier first. The seat model (:func:`node_capacity`) is deliberately small:

- ``immediate``: a GPU with no primary on it;
- ``ready``: a guest seat (a GPU whose primary has no guest yet), or a free GPU: a ready run
  starts early, loads its data and waits at its gate (DESIGN.md, the three tiers);
- ``background``: a CPU slot.

A run admitted by a worker (``RunAdmitted`` in the node's log) holds one seat of its tier
until it ends, whatever its steps are doing; runs started by hand (`m27 run`) count through
the leases and requests they hold. Leases inside a run are still arbitrated per step by the
node (agent or local lease): the seats only decide which runs a node pulls from Prefect.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from m27._exceptions import ConfigError
from m27.events.state import NodeState

if TYPE_CHECKING:
    from prefect.client.orchestration import PrefectClient

Tier = Literal["immediate", "ready", "background"]

#: The tiers, highest first; a queue's Prefect priority is its place here (1, 2, 3).
TIERS: tuple[Tier, ...] = ("immediate", "ready", "background")
POOL_NAME = "m27"
POOL_TYPE = "m27"
FLOW_NAME = "m27-pipeline"
ENTRYPOINT = "flows/pipeline.py:pipeline_flow"


def tier_rank(tier: str) -> int:
    """0 for immediate, 1 for ready, 2 for background; unknown names sort last."""
    return TIERS.index(tier) if tier in TIERS else len(TIERS)  # type: ignore[arg-type]


def check_tier(tier: str) -> Tier:
    if tier not in TIERS:
        raise ConfigError(f"unknown tier {tier!r}; one of {', '.join(TIERS)}", tier=tier)
    return tier  # type: ignore[return-value]


# --- capacity -------------------------------------------------------------------------------


def live_admitted(state: NodeState) -> dict[str, str]:
    """run id -> tier of the runs a worker admitted here that have not ended."""
    out: dict[str, str] = {}
    for run_id, adm in state.admitted.items():
        run = state.runs.get(run_id)
        if run is None or run.status == "running":
            out[run_id] = adm.tier
    return out


def node_capacity(
    state: NodeState,
    gpu_count: int,
    cpu_slots: int,
    starting: Mapping[str, str] | None = None,
) -> dict[str, int]:
    """Free seats per tier on a node (see the module docstring for the seat model).

    `starting` maps run ids the caller admitted but the log does not show yet to their tier.
    Pure: the worker, `m27 status` and the tests call it with a folded state.
    """
    held = {**live_admitted(state), **(starting or {})}
    usable = max(0, gpu_count - len({g for g in state.lost_gpus if 0 <= g < gpu_count}))
    primaries = sum(1 for t in held.values() if t == "immediate")
    guests = sum(1 for t in held.values() if t == "ready")
    cpu_used = sum(1 for t in held.values() if t == "background")
    pending_gpus = 0
    for key in {*state.leases, *state.guests}:
        if key[0] in held:
            continue  # an admitted run holds one seat, not one per step
        gpus = state.leases.get(key, ())
        tier = state.lease_tiers.get(key, "immediate")
        if key in state.guests or tier in ("guest", "ready"):
            guests += 1
        elif tier == "immediate":
            primaries += len(gpus)
        elif not gpus:
            cpu_used += 1  # a cpu step's slot; gpu_light shares a GPU and takes no seat
    for (run_id, _step), req in state.requests.items():
        if run_id in held:
            continue
        if req.type == "cpu":
            cpu_used += 1
        elif req.type == "gpu":
            pending_gpus += max(1, req.gpus)
    seated = min(primaries, usable)
    guest_seats = max(0, seated - guests)
    overflow = max(0, guests - seated)  # guests beyond primaries sit on a GPU of their own
    free_gpus = max(0, usable - primaries - pending_gpus - overflow)
    return {
        "immediate": free_gpus,
        "ready": free_gpus + guest_seats,
        "background": max(0, cpu_slots - cpu_used),
    }


@dataclass(frozen=True)
class Candidate:
    """A flow run waiting in the pool, as the worker sees it."""

    run_id: str
    tier: str
    order: float = 0.0  # expected start time: earlier first within a tier


def plan_admissions(
    candidates: Iterable[Candidate],
    state: NodeState,
    gpu_count: int,
    cpu_slots: int,
    starting: Mapping[str, str] | None = None,
) -> list[Candidate]:
    """Which waiting runs this node takes now, in the order it takes them.

    Highest tier first, earliest first within a tier. Once a run finds no seat, no run of
    a lower tier is taken in this pass: lower tiers get what no one above is waiting for,
    so a busy node never lets background work overtake a waiting GPU run.
    """
    taken: dict[str, str] = dict(starting or {})
    plan: list[Candidate] = []
    blocked_from: int | None = None
    for cand in sorted(candidates, key=lambda c: (tier_rank(c.tier), c.order)):
        rank = tier_rank(cand.tier)
        if cand.tier not in TIERS or (blocked_from is not None and rank > blocked_from):
            continue
        room = node_capacity(state, gpu_count, cpu_slots, taken)
        if room[cand.tier] > 0:
            taken[cand.run_id] = cand.tier
            plan.append(cand)
        elif blocked_from is None:
            blocked_from = rank
    return plan


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


def flow_root() -> Path:
    """The folder that holds ``flows/pipeline.py`` (the repository, or site-packages)."""
    import flows

    return Path(next(iter(flows.__path__))).resolve().parent


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

    def parameters(self) -> dict[str, Any]:
        return {
            "spec_path": self.spec_path,
            "overrides": dict(self.overrides),
            "pipeline_name": self.pipeline_name,
        }

    def tags(self) -> list[str]:
        return ["m27", f"tier:{self.tier}", f"pipeline:{self.pipeline_name}"]


#: Where a flow run finds flows/pipeline.py: the m27 installed on the node that runs it (the
#: m27 worker sets M27_FLOWS_DIR for each flow run), not the folder `m27 deploy` ran in.
FLOWS_DIR_TEMPLATE = "{{ $M27_FLOWS_DIR }}"


def pull_steps() -> list[dict[str, Any]]:
    return [{"prefect.deployments.steps.set_working_directory": {"directory": FLOWS_DIR_TEMPLATE}}]


async def deploy(client: PrefectClient, spec: DeploymentSpec) -> dict[str, Any]:
    """Create or update deployment ``m27-pipeline/<name>``; returns its id and full name.

    Updating replaces the parameters, queue and schedule: the command line is the truth.
    """
    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.utilities.callables import parameter_schema

    from flows.pipeline import pipeline_flow

    schedules: list[DeploymentScheduleCreate] = []
    if spec.cron:
        try:
            cron = CronSchedule(cron=spec.cron, timezone=spec.timezone or "UTC")
        except ValueError as exc:
            raise ConfigError(f"bad schedule: {exc}", cron=spec.cron) from exc
        schedules.append(DeploymentScheduleCreate(schedule=cron, active=True))
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
        parameter_openapi_schema=parameter_schema(pipeline_flow.fn).model_dump_for_openapi(),
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
        "schedule": {"cron": spec.cron, "timezone": spec.timezone or "UTC"} if spec.cron else None,
    }


def queue_tier(queue_name: str | None, tags: Sequence[str] = ()) -> str:
    """The tier of a flow run: its queue's name, or a ``tier:X`` tag, else ``ready``."""
    if queue_name in TIERS:
        return str(queue_name)
    for tag in tags:
        if tag.startswith("tier:") and tag[5:] in TIERS:
            return tag[5:]
    return "ready"
