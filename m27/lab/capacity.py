"""How much room a node has for each tier, and which waiting flow runs it takes.

The m27 worker on each node takes a flow run only when its node has a free seat of the
run's tier, highest tier first. The seat model (:func:`node_capacity`) is deliberately small:

- ``immediate``: a GPU with no primary on it;
- ``ready``: a guest seat (a GPU whose primary has no guest yet), or a free GPU: a ready run
  starts early, loads its data and waits at its gate (the three tiers of m27.policy);
- ``background``: a CPU slot.

A run admitted by a worker (``RunAdmitted`` in the node's log) holds one seat of its tier
until it ends, whatever its steps are doing; runs started by hand (`m27 run`) count through
the leases and requests they hold. Leases inside a run are still arbitrated per step by the
node (agent or local lease): the seats only decide which runs a node pulls from Prefect.
Pure functions of a folded :class:`~m27.events.state.NodeState`: the worker, `m27 status`
and the tests call them alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from m27._exceptions import ConfigError
from m27.events.state import NodeState

Tier = Literal["immediate", "ready", "background"]

#: The tiers, highest first; a queue's Prefect priority is its place here (1, 2, 3).
TIERS: tuple[Tier, ...] = ("immediate", "ready", "background")


def tier_rank(tier: str) -> int:
    """0 for immediate, 1 for ready, 2 for background; unknown names sort last."""
    return TIERS.index(tier) if tier in TIERS else len(TIERS)  # type: ignore[arg-type]


def check_tier(tier: str) -> Tier:
    if tier not in TIERS:
        raise ConfigError(f"unknown tier {tier!r}; one of {', '.join(TIERS)}", tier=tier)
    return tier  # type: ignore[return-value]


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


def queue_tier(queue_name: str | None, tags: Sequence[str] = ()) -> str:
    """The tier of a flow run: its queue's name, or a ``tier:X`` tag, else ``ready``."""
    if queue_name in TIERS:
        return str(queue_name)
    for tag in tags:
        if tag.startswith("tier:") and tag[5:] in TIERS:
            return tag[5:]
    return "ready"
