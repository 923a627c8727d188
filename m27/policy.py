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
  the primary ends the best guest is promoted in place, without a restart.
- background: ``cpu`` steps on CPU slots; ``gpu_light`` and low-priority GPU work on GPUs
  nobody above wants (demoted to a paused guest when someone does), or as the last guests.

Order: effective priority (base + bump + whole points of aging, capped), then fair share
(the owner holding fewer GPUs, then with less recent GPU time), then queue time, then key.
A multi-GPU step that cannot start reserves the GPUs that free first, so it cannot starve.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial

from m27._policy_explain import explain
from m27._policy_model import (
    Action,
    Demote,
    GpuView,
    Grant,
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
    key_text,
)
from m27._policy_state import GpuState, Ranked, Slot, effective_priority, order_pending

#: A reason fragment: text, or a function that builds it when someone asks.
Note = str | Callable[[], str]
Notes = dict[StepKey, list[Note]]

__all__ = [
    "Action",
    "Decision",
    "Demote",
    "GpuView",
    "Grant",
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
    step) to one line a person can read; it is built on first access.
    """

    actions: tuple[Action, ...]
    next_check: float | None = None
    _inp: PolicyInput | None = field(default=None, repr=False, compare=False)
    _ranked: Sequence[Ranked] = field(default=(), repr=False, compare=False)
    _gpus: Mapping[int, GpuState] = field(default_factory=dict, repr=False, compare=False)
    _notes: Mapping[StepKey, list[Note]] = field(default_factory=dict, repr=False, compare=False)

    @cached_property
    def reasons(self) -> dict[StepKey, str]:
        if self._inp is None:
            return {}
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


def decide(inp: PolicyInput) -> Decision:
    """The actions that bring the node to the three-tier layout for `inp`; pure."""
    cfg, now = inp.config, inp.now
    gpus = {v.index: GpuState(v) for v in sorted(inp.gpus, key=lambda v: v.index)}
    actions: list[Action] = []
    notes: Notes = {}
    cpu_busy = 0
    held: Counter[str] = Counter()
    for r in inp.running:
        if r.role == "cpu":
            cpu_busy += 1
            continue
        slot = Slot.of_running(r, now, cfg)
        if r.role == "primary":
            held[r.owner] += len(r.gpus)
            for g in r.gpus:
                if g in gpus:
                    gpus[g].primary = slot
        elif r.gpus and r.gpus[0] in gpus:
            gpus[r.gpus[0]].guests.append(slot)
    usable = [i for i, st in gpus.items() if not st.view.lost]

    # A primary that ended: its best guest takes over in place, before anyone new.
    for i in usable:
        st = gpus[i]
        if st.primary is None and st.guests:
            best = min(st.guests, key=Slot.guest_rank)
            st.guests.remove(best)
            best.fresh = True
            best.paused = False
            if best.tier == "ready":
                best.tier = "immediate"
            st.primary = best
            actions.append(Promote(best.key, i))

    ranked = order_pending(inp.pending, held, inp.usage_by_owner, now, cfg)
    cpu_q = [r for r in ranked if r.pending.type == "cpu"]
    gpu_q = [r for r in ranked if r.pending.type != "cpu" and not r.background]
    bg_q = [r for r in ranked if r.pending.type != "cpu" and r.background]

    granted: set[StepKey] = set()
    _immediate(gpu_q, gpus, usable, cfg, actions, notes, granted)
    if not cfg.fifo:
        _background_on_free(bg_q, gpus, usable, actions, granted)
        # gpu_light steps are natural guests: they compete for guest slots by rank (as
        # background guests), but never take a GPU from a gpu step.
        bg_max = cfg.background_priority_max
        guest_q = [
            r
            for r in ranked
            if r.pending.type != "cpu"
            and (not r.background or (r.pending.type == "gpu_light" and r.eff >= bg_max))
        ]
        _guests(guest_q, gpus, usable, cfg, actions, notes, granted)
        _guests(bg_q, gpus, usable, cfg, actions, notes, granted)
    free_cpu = cfg.cpu_slots - cpu_busy
    for c in cpu_q:
        if free_cpu <= 0:
            break
        actions.append(StartCpu(c.pending.key))
        granted.add(c.pending.key)
        free_cpu -= 1
    next_check = _run_or_pause(gpus, usable, cfg, now, actions)
    return Decision(tuple(actions), next_check, inp, ranked, gpus, notes)


def _fits(st: GpuState, memory: int, cfg: PolicyConfig) -> bool:
    cap = st.view.memory_total * cfg.memory_overprovision
    return cap > 0 and memory > 0 and st.used_memory() + memory <= cap


def _immediate(
    queue: list[Ranked],
    gpus: dict[int, GpuState],
    usable: list[int],
    cfg: PolicyConfig,
    actions: list[Action],
    notes: Notes,
    granted: set[StepKey],
) -> None:
    reserved = False
    free = [i for i in usable if gpus[i].primary is None]
    bg_hosts = [] if cfg.fifo else [i for i in usable if _is_bg_host(gpus[i], cfg)]
    for r in queue:
        p = r.pending
        k = max(1, p.gpus)
        if k > len(usable):
            notes[p.key] = [f"needs {k} GPUs, this node has {len(usable)} usable"]
            continue
        # Nothing can start now; only the first multi-GPU step may still need a hold.
        if not free and not bg_hosts and (reserved or cfg.fifo or k == 1):
            if cfg.fifo:
                break
            continue
        avail = [i for i in free if gpus[i].reserved_for in (None, p.key)] if reserved else free
        demote: list[int] = []
        if len(avail) < k and bg_hosts:
            demote = [i for i in bg_hosts if _room_beside(gpus[i], p.gpu_memory, cfg)]
        if len(avail) + len(demote) >= k:
            take = (avail + demote)[:k]
            for i in take:
                st = gpus[i]
                if st.primary is not None:
                    bg = st.primary
                    bg.paused, bg.fresh = True, True
                    st.guests.append(bg)
                    actions.append(Demote(bg.key, i))
                    bg_hosts.remove(i)
                else:
                    free.remove(i)
                st.primary = Slot.of_pending(p, r.eff, "immediate")
                st.reserved_for = None
            actions.append(Grant(p.key, tuple(take), "immediate"))
            granted.add(p.key)
            continue
        if k > 1 and not reserved and not cfg.fifo:
            hold = _reservation(gpus, usable, k, free)
            for i in hold:
                gpus[i].reserved_for = p.key
                gpus[i].reserved_gpus = k
            actions.append(Reserve(p.key, tuple(hold)))
            reserved = True
            notes[p.key] = [f"holds GPU {', '.join(map(str, hold))} until all {k} are free"]
        if cfg.fifo:
            notes[p.key] = [f"fifo: at the head, needs {k} free GPUs"]
            break


def _is_bg_host(st: GpuState, cfg: PolicyConfig) -> bool:
    """A GPU whose background primary could step aside as a guest."""
    bg = st.primary
    return (
        bg is not None
        and bg.tier == "background"
        and bg.gpus == 1
        and not bg.fresh
        and len(st.guests) + 1 <= cfg.guests_per_gpu
    )


def _room_beside(st: GpuState, memory: int, cfg: PolicyConfig) -> bool:
    if st.reserved_for is not None:
        return False
    cap = st.view.memory_total * cfg.memory_overprovision
    return cap > 0 and st.used_memory() + memory <= cap


def _reservation(
    gpus: dict[int, GpuState], usable: list[int], k: int, free: list[int]
) -> list[int]:
    """The k GPUs expected to be free first: free ones, then by the primary's declared end."""

    def expected_free(i: int) -> tuple[float, int]:
        prim = gpus[i].primary
        if prim is None or i in free:
            return (float("-inf"), i)
        if prim.time_limit is None:
            return (float("inf"), i)
        return (prim.started_at + prim.time_limit, i)

    candidates = [i for i in usable if gpus[i].reserved_for is None or i in free]
    return sorted(sorted(candidates, key=expected_free)[:k])


def _guests(
    queue: list[Ranked],
    gpus: dict[int, GpuState],
    usable: list[int],
    cfg: PolicyConfig,
    actions: list[Action],
    notes: Notes,
    granted: set[StepKey],
) -> None:
    hosts = [
        i
        for i in usable
        if gpus[i].primary is not None
        and gpus[i].primary.tier == "immediate"  # type: ignore[union-attr]
        and gpus[i].reserved_for is None
        and len(gpus[i].guests) < cfg.guests_per_gpu
    ]
    for r in queue:
        if not hosts:
            return
        p = r.pending
        if p.key in granted:
            continue
        if max(1, p.gpus) > 1:
            notes.setdefault(p.key, []).append("multi-GPU steps do not run as guests")
            continue
        if p.gpu_memory <= 0:
            notes.setdefault(p.key, []).append("declares no gpu_memory, so it cannot be a guest")
            continue
        fitting = [i for i in hosts if _fits(gpus[i], p.gpu_memory, cfg)]
        if not fitting:
            seen = tuple((i, gpus[i].used_memory(), gpus[i].view.memory_total) for i in hosts)
            notes.setdefault(p.key, []).append(partial(_no_fit_text, p.gpu_memory, seen))
            continue
        i = max(fitting, key=lambda j: (gpus[j].free_memory(cfg), -j))
        tier: Tier = "background" if r.background else "ready"
        gpus[i].guests.append(Slot.of_pending(p, r.eff, tier, paused=True))
        if len(gpus[i].guests) >= cfg.guests_per_gpu:
            hosts.remove(i)
        actions.append(Grant(p.key, (i,), tier))
        granted.add(p.key)


def _no_fit_text(memory: int, seen: tuple[tuple[int, int, int], ...]) -> str:
    beside = ", ".join(f"GPU {i} ({_gib(used)} of {_gib(total)})" for i, used, total in seen)
    return f"as a guest its {_gib(memory)} does not fit beside {beside}"


def _background_on_free(
    queue: list[Ranked],
    gpus: dict[int, GpuState],
    usable: list[int],
    actions: list[Action],
    granted: set[StepKey],
) -> None:
    """Background work on GPUs that no gpu step took (nor holds by reservation)."""
    free = [i for i in usable if gpus[i].primary is None and gpus[i].reserved_for is None]
    for r in queue:
        if not free:
            return
        p = r.pending
        k = max(1, p.gpus)
        if len(free) >= k:
            take, free = free[:k], free[k:]
            for i in take:
                gpus[i].primary = Slot.of_pending(p, r.eff, "background")
            actions.append(Grant(p.key, tuple(take), "background"))
            granted.add(p.key)


def _run_or_pause(
    gpus: dict[int, GpuState],
    usable: list[int],
    cfg: PolicyConfig,
    now: float,
    actions: list[Action],
) -> float | None:
    """Let the best guest compute while its primary waits on I/O; pause all others."""
    next_check: float | None = None
    for i in usable:
        st = gpus[i]
        prim = st.primary
        if prim is None or not st.guests:
            continue
        low_since = st.view.util_low_since
        util_low = st.view.primary_util is None or st.view.primary_util < cfg.io_util_threshold
        inferred = low_since is not None and util_low and now - low_since >= cfg.io_timeout
        io = not prim.fresh and (prim.io_waiting or inferred)
        if not io and not prim.fresh and low_since is not None and util_low:
            due = low_since + cfg.io_timeout
            next_check = due if next_check is None else min(next_check, due)
        best = min(st.guests, key=Slot.guest_rank) if io else None
        for g in sorted(st.guests, key=Slot.guest_rank):
            if g is best and g.paused:
                actions.append(ResumeGuest(g.key, i))
                g.paused = False
            elif g is not best and not g.paused:
                actions.append(PauseGuest(g.key, i))
                g.paused = True
    return next_check


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"
