"""The three-tier GPU policy: one pure function, ``decide(PolicyInput) -> Decision``.

The node agent and the trace simulator call this same function with the same plain data,
so a simulated week tells the truth about the agent. Nothing here reads a clock, a file or
a GPU; everything it knows is in the input.

Tiers:

- immediate: on each GPU the best runnable GPU step is the *primary*; it computes alone.
- ready: the next GPU steps start early as *guests* (``guests_per_gpu``, only if their
  declared memory fits next to the primary's, times ``memory_overprovision``); a guest
  computes only while its primary waits on I/O (its hint, or its utilization below
  ``io_util_threshold`` for ``io_timeout``) and is paused when the primary computes; when
  the primary ends the best guest is promoted in place, without a restart (unless a
  waiting step outranks it: that step takes the GPU and the guest stays paused).
- background: ``cpu`` steps on CPU slots; ``gpu_light`` and low-priority GPU work on GPUs
  nobody above wants (demoted to a paused guest when someone does), or as the last guests.

Order: effective priority (base + bump + whole points of aging, capped), then fair share
(the owner holding fewer GPUs, then with less recent GPU time), then queue time, then the
larger GPU need (steps queued together start biggest first), then key. A multi-GPU step
that cannot start reserves the GPUs that free first, so it cannot starve; a step whose
declared time limit ends before the reservation is complete may use them meanwhile (EASY
backfill).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from m27.policy._admit import Note, Notes, Pass
from m27.policy._explain import explain
from m27.policy._gate import gate, outrank, promote, run_or_pause, yielders
from m27.policy._hold import nothing_starts, waiting_needs
from m27.policy._model import (
    OUTSIDE_MEMORY_MIN,
    PRIORITY_LIMIT,
    Action,
    Demote,
    GpuView,
    Grant,
    Move,
    PauseGuest,
    Pending,
    PolicyConfig,
    PolicyInput,
    Promote,
    Reserve,
    ResumeGuest,
    Role,
    Running,
    StartCpu,
    StepKey,
    StepType,
    Tier,
    bounded,
    key_text,
)
from m27.policy._move import move_to_idle
from m27.policy._order import order_pending
from m27.policy._place import place, reservation
from m27.policy._state import (
    GpuState,
    Ranked,
    by_guest_rank,
    effective_priority,
    lease_eff,
    place_leases,
)

__all__ = [
    "OUTSIDE_MEMORY_MIN",
    "PRIORITY_LIMIT",
    "Action",
    "Decision",
    "Demote",
    "GpuView",
    "Grant",
    "Move",
    "PauseGuest",
    "Pending",
    "PolicyConfig",
    "PolicyInput",
    "Promote",
    "Reserve",
    "ResumeGuest",
    "Role",
    "Running",
    "StartCpu",
    "StepKey",
    "StepType",
    "Tier",
    "bounded",
    "decide",
    "effective_priority",
    "key_text",
]


@dataclass(frozen=True)
class Decision:
    """What to do now, and why everything else waits.

    ``next_check`` is the earliest time the answer can change with no new event (an
    inferred I/O wait reaching ``io_timeout``); the simulator wakes itself then.
    ``reasons`` maps every pending step that got no action (a Reserve does not start a
    step) to one line a person can read; it is built on first access. ``standby`` names,
    per GPU with guests, the guest that computes in its primary's next I/O wait (the agent
    lets it follow the primary's ``io_wait()`` hint directly, within a millisecond);
    ``followers``, per GPU with two guests or more, the others in the order they take the
    gap over when the ones before them wait on their own I/O (the agent chains their
    gates on those guests' hints, so the next one starts as directly). ``yield_to``, per
    GPU, those of them that rank as high as its primary: it waits for such a guest to end
    the phase it began in the primary's I/O wait (docs/policy.md, "Equals take turns").
    """

    actions: tuple[Action, ...]
    next_check: float | None = None
    standby: Mapping[int, StepKey] = field(default_factory=dict, compare=False)
    followers: Mapping[int, tuple[StepKey, ...]] = field(default_factory=dict, compare=False)
    yield_to: Mapping[int, tuple[StepKey, ...]] = field(default_factory=dict, compare=False)
    _inp: PolicyInput | None = field(default=None, repr=False, compare=False)
    _ranked: Sequence[Ranked] = field(default=(), repr=False, compare=False)
    _gpus: Mapping[int, GpuState] = field(default_factory=dict, repr=False, compare=False)
    _notes: Mapping[StepKey, list[Note]] = field(default_factory=dict, repr=False, compare=False)
    #: decided by the busy-node shortcut: the reasons come from the full pass, on demand
    _shortcut: bool = field(default=False, repr=False, compare=False)

    @cached_property
    def reasons(self) -> dict[StepKey, str]:
        if self._inp is None:
            return {}
        if self._shortcut:
            return _decide(self._inp, shortcut=False).reasons
        started = {a.key for a in self.actions if isinstance(a, Grant | StartCpu)}
        return explain(self._inp, self._ranked, self._gpus, self._notes, started)

    def why(self, key: StepKey) -> str:
        """The reason `key` waits, or what it was given."""
        for a in self.actions:
            if isinstance(a, Grant) and a.key == key:
                return f"granted ({a.tier}) on GPU {', '.join(map(str, a.gpus))}"
            if isinstance(a, StartCpu) and a.key == key:
                return "started on a CPU slot"
        return self.reasons.get(key, f"{key_text(key)} is not pending")


def _decision(
    actions: tuple[Action, ...],
    next_check: float | None,
    standby: Mapping[int, StepKey],
    followers: Mapping[int, tuple[StepKey, ...]],
    inp: PolicyInput,
    yield_to: Mapping[int, tuple[StepKey, ...]],
    ranked: Sequence[Ranked] = (),
    gpus: Mapping[int, GpuState] | None = None,
    notes: Mapping[StepKey, list[Note]] | None = None,
    shortcut: bool = False,
) -> Decision:
    """The same as ``Decision(...)``, built without the generated ``__init__`` of a frozen
    dataclass (a field at a time through ``object.__setattr__``, and dict factories): that
    was ~10 % of a simulated decision; every field is set here."""
    d: Decision = object.__new__(Decision)
    f = d.__dict__
    f["actions"], f["next_check"], f["standby"], f["_inp"] = actions, next_check, standby, inp
    f["followers"], f["yield_to"] = followers, yield_to
    f["_ranked"], f["_shortcut"] = ranked, shortcut
    f["_gpus"] = {} if gpus is None else gpus
    f["_notes"] = {} if notes is None else notes
    return d


def decide(inp: PolicyInput) -> Decision:
    """The actions that bring the node to the three-tier layout for `inp`; pure."""
    return _decide(inp)


def _decide(inp: PolicyInput, shortcut: bool = True, moving: bool = False) -> Decision:
    if not inp.pending and not moving:
        return _gate_only(inp)
    cfg, now = inp.config, inp.now
    gpus = {v.index: GpuState(v) for v in sorted(inp.gpus, key=lambda v: v.index)}
    actions: list[Action] = []
    notes: Notes = {}
    cpu_busy, held = place_leases(inp.running, now, cfg, gpus)
    usable = [i for i, st in gpus.items() if not st.view.lost and not st.outside()]

    ranked: Sequence[Ranked] = ()
    hold_only = shortcut and nothing_starts(inp, gpus, usable, cpu_busy)
    if hold_only:
        # a busy node: only the first multi-GPU step's reservation depends on the queue
        # (the kept order, brought up to date: cheaper than finding that step afresh)
        ranked = order_pending(inp.pending, held, inp.usage_by_owner, now, cfg)
        width = len(usable)
        wide = (
            next(
                (
                    r.pending
                    for r in ranked
                    if r.pending.type == "gpu" and not r.background and 1 < r.pending.gpus <= width
                ),
                None,
            )
            if waiting_needs(inp.pending).narrowest_wide <= width
            else None
        )
        if wide is not None:
            hold = reservation(gpus, usable, wide.gpus, [])
            for i in hold:
                gpus[i].reserved_for, gpus[i].reserved_gpus = wide.key, wide.gpus
                gpus[i].reserved_need = wide.gpu_memory or wide.memory_peak
            actions.append(Reserve(wide.key, tuple(hold)))
    else:
        ranked = order_pending(inp.pending, held, inp.usage_by_owner, now, cfg)
        granted: set[StepKey] = set()
        if not cfg.fifo:
            outrank(ranked, gpus, usable, cfg, now, actions, granted)
        first_wide_ranked: Ranked | None = None
        # only a GPU about to promote a guest asks (the scan is O(queue) per decision)
        promoting = any(gpus[i].primary is None and gpus[i].guests for i in usable)
        if promoting and not cfg.fifo:
            first_wide_ranked = next(
                (
                    r
                    for r in ranked
                    if r.pending.type == "gpu"
                    and not r.background
                    and 1 < r.pending.gpus <= len(usable)
                    and r.pending.key not in granted
                ),
                None,
            )
        promote(gpus, usable, actions, first_wide_ranked, cfg)
        needs = waiting_needs(inp.pending) if shortcut else None
        pa = Pass(gpus, usable, cfg, now, actions, notes, granted, shortcut, needs)
        place(ranked, pa, cpu_busy)
    move_to_idle(gpus, usable, cfg, actions)
    standby: dict[int, StepKey] = {}
    followers: dict[int, tuple[StepKey, ...]] = {}
    yield_to: dict[int, tuple[StepKey, ...]] = {}
    next_check = run_or_pause(gpus, usable, cfg, now, actions, standby, followers, yield_to)
    # a fast pass (shortcut) writes no notes: the reasons come from a full pass, on demand
    return _decision(
        tuple(actions), next_check, standby, followers, inp, yield_to, ranked, gpus, notes,
        shortcut,
    )  # fmt: skip


#: The last lease tuple's guests by GPU (in GPU order) and primaries by GPU, and the last
#: GPU view tuple's views by index: the simulator hands the same tuples again while
#: nothing there moved (a decision with nothing pending is ~80 % of its calls). Keyed by
#: identity, each memo holds its tuple (so the id stays that tuple's); the tuples and
#: their items are frozen, so a hit gives what a rebuild would. Never changed in place.
_hosting_memo: tuple[tuple[Running, ...], list[tuple[int, list[Running]]], dict[int, Running]]
_hosting_memo = ((), [], {})
_views_memo: tuple[tuple[GpuView, ...], dict[int, GpuView]] = ((), {})


def _hosting(
    running: tuple[Running, ...],
) -> tuple[list[tuple[int, list[Running]]], dict[int, Running]]:
    global _hosting_memo
    memo = _hosting_memo
    if memo[0] is running:
        return memo[1], memo[2]
    by_gpu: dict[int, list[Running]] = {}
    primary: dict[int, Running] = {}
    for r in running:
        role = r.role
        if role == "primary":
            for g in r.gpus:
                primary[g] = r
        elif role == "guest" and r.gpus:
            g = r.gpus[0]
            if g in by_gpu:
                by_gpu[g].append(r)
            else:
                by_gpu[g] = [r]
    hosted = sorted(by_gpu.items())
    _hosting_memo = (running, hosted, primary)
    return hosted, primary


def _views(gpus: tuple[GpuView, ...]) -> dict[int, GpuView]:
    global _views_memo
    memo = _views_memo
    if memo[0] is gpus:
        return memo[1]
    views = {v.index: v for v in gpus}
    _views_memo = (gpus, views)
    return views


def _idle_beside_guests(
    hosted: list[tuple[int, list[Running]]], primary: dict[int, Running], views: dict[int, GpuView]
) -> bool:
    """Whether a GPU holds nothing while a guest that has not computed waits behind a
    primary elsewhere (:func:`m27.policy._move.move_to_idle` may move it)."""
    busy = {i for i, _ in hosted} | primary.keys()
    if all(i in busy or v.lost or v.foreign_memory >= OUTSIDE_MEMORY_MIN for i, v in views.items()):
        return False
    return any(i in primary and not g.computed for i, leases in hosted for g in leases)


def _gate_only(inp: PolicyInput) -> Decision:
    """Nothing pending: only promotions and guest gating can change, and only on GPUs
    that host guests (most simulator decisions are this one, so it builds no Slot: it
    gates the leases themselves, ranked as their Slots would be)."""
    hosted, primary = _hosting(inp.running)
    if not hosted:
        return _decision((), None, {}, {}, inp, {})
    cfg, now = inp.config, inp.now
    views = _views(inp.gpus)
    if len(views) > len(primary) and _idle_beside_guests(hosted, primary, views):
        return _decide(inp, shortcut=False, moving=True)  # a guest may move there
    gated: list[tuple[int, GpuView, bool, Running | None, list[Running]]] = []
    actions: list[Action] = []
    for i, leases in hosted:
        view = views.get(i)
        if view is None or view.lost:
            continue
        if len(leases) > 1:
            leases = by_guest_rank(leases, now, cfg)
        prim = primary.get(i)
        if prim is None:
            actions.append(Promote(leases[0].key, i))
            gated.append((i, view, True, None, leases[1:]))
        else:
            gated.append((i, view, False, prim, leases))
    next_check: float | None = None
    standby: dict[int, StepKey] = {}
    followers: dict[int, tuple[StepKey, ...]] = {}
    yield_to: dict[int, tuple[StepKey, ...]] = {}
    for i, view, fresh, prim, order in gated:
        if order:
            next_check = gate(
                i, view, fresh, prim is not None and prim.io_waiting, order, cfg, now, actions,
                next_check, standby, followers,
            )  # fmt: skip
            if prim is not None:
                yielders(i, lease_eff(prim, now, cfg), order, cfg, now, standby, followers,
                         yield_to)  # fmt: skip
    return _decision(tuple(actions), next_check, standby, followers, inp, yield_to)
