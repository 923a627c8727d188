"""What the agent (and `m27 queue`) read from the log to ask the policy: its own small projection.

The node projection (:mod:`m27.events.state`) is keyed by runs and drops events for runs it never
saw submitted; the agent must serve any step that asks, so it keeps the few facts the
policy needs per step key, built only from events (a restarted agent rebuilds the same
book by replaying the log):

- pending requests (``StepRequested`` until granted or withdrawn);
- held leases: GPUs, tier, guest or primary, paused and how, the step's process, its
  channel file, and the request it answers;
- priority bumps, lost GPUs;
- fair-share usage: recent GPU-seconds per owner (:class:`Usage`), so an agent restarted
  after an hour of one owner's work still knows that owner has had the GPUs.

:func:`policy_input` turns a book plus GPU views into the :class:`~m27.policy.PolicyInput`
that :func:`m27.policy.decide` reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

from m27 import events as ev
from m27.config import Settings
from m27.events import Event, Recorded
from m27.policy import (
    GpuView,
    Pending,
    PolicyConfig,
    PolicyInput,
    Role,
    Running,
    StepKey,
    StepType,
    Tier,
    bounded,
)

STEP_TYPES: frozenset[str] = frozenset({"cpu", "gpu", "gpu_light"})
TIERS: frozenset[str] = frozenset({"immediate", "ready", "background"})
#: fair share forgets GPU time with this half-life: an hour ago counts half
USAGE_HALF_LIFE_S = 3600.0
#: the lease events that can change which steps hold GPUs as primaries
_ROLE_EVENTS = (ev.LeaseGranted, ev.LeaseReleased, ev.GuestStarted, ev.Promoted)

#: The kinds :meth:`Book.apply` changes a book with (any other leaves it as it was, but
#: for ``last_seq``): after one of them a published queue is out of date (``m27 queue``).
BOOK_KINDS: frozenset[type[Event]] = frozenset(
    {
        ev.StepRequested, ev.LeaseGranted, ev.LeaseReleased, ev.StepStarted,
        ev.GuestStarted, ev.GuestPaused, ev.GuestResumed, ev.Promoted, ev.PriorityBumped,
        ev.GpuLost, ev.StepMemoryMeasured, ev.StepSucceeded, ev.StepSkipped,
        ev.StepCancelled, ev.StepFailed, ev.StepRequeued,
    }
)  # fmt: skip


@dataclass
class Held:
    """A lease the log says is held."""

    key: StepKey
    gpus: tuple[int, ...]
    tier: Tier
    granted_at: float
    request: ev.StepRequested | None
    channel: str = ""
    pid: int | None = None
    #: the step process's start time: a reused pid is not taken for the step
    pid_started: float | None = None
    pgid: int | None = None
    started_at: float | None = None
    guest: bool = False
    paused: bool = False
    how: str = ""
    paused_at: float | None = None
    #: the step's end is in the log (its runner may still have to release the lease)
    ended: bool = False
    #: the attempt its last StepStarted announced (a StepFailed for it names the same one)
    attempt: int = 0
    #: let compute since its grant (resumed as a guest, or a primary demoted to one): a
    #: guest that has is never moved to a free GPU (m27.policy.Move)
    computed: bool = False

    @property
    def type(self) -> StepType:
        kind = self.request.type if self.request is not None else ("gpu" if self.gpus else "cpu")
        return cast(StepType, kind if kind in STEP_TYPES else "gpu")

    @property
    def role(self) -> str:
        if not self.gpus:
            return "cpu"
        return "guest" if self.guest else "primary"


@dataclass
class Usage:
    """Recent GPU-seconds per owner: each primary's GPU time, decaying by half every
    `half_life` seconds, integrated exactly between the times the events carry.

    Folded from the lease events alone, so replaying the log gives the same numbers as
    having watched it live; a clock never reads into it except through :meth:`at`.
    """

    half_life: float = USAGE_HALF_LIFE_S
    #: owner -> decayed GPU-seconds as of `since`
    value: dict[str, float] = field(default_factory=dict)
    since: float | None = None
    #: primaries now: step -> (owner, GPUs held)
    holding: dict[StepKey, tuple[str, int]] = field(default_factory=dict)

    def _grown(self, now: float) -> tuple[dict[str, float], float]:
        """The values at `now` (not stored) and the time they are for."""
        if self.since is None or now <= self.since:
            return dict(self.value), self.since if self.since is not None else now
        rate = math.log(2) / self.half_life
        decay = math.exp(-(now - self.since) * rate)
        grown = {owner: v * decay for owner, v in self.value.items()}
        # each GPU held all along adds the integral of 2^-(now - t)/half_life over [since, now]
        gained = (1.0 - decay) / rate
        for owner, gpus in self.holding.values():
            grown[owner] = grown.get(owner, 0.0) + gained * gpus
        return grown, now

    def advance(self, now: float) -> None:
        """Account up to `now`; an event stamped earlier than the last one moves nothing."""
        self.value, self.since = self._grown(now)

    def hold(self, holding: dict[StepKey, tuple[str, int]]) -> None:
        self.holding = holding

    def at(self, now: float) -> dict[str, float]:
        """Owner -> recent GPU-seconds at `now`, for :class:`~m27.policy.PolicyInput`."""
        return self._grown(now)[0]


@dataclass
class Book:
    """The agent's view of requests and leases, changed only by :meth:`apply`."""

    requests: dict[StepKey, ev.StepRequested] = field(default_factory=dict)
    held: dict[StepKey, Held] = field(default_factory=dict)
    bumps: dict[StepKey, int] = field(default_factory=dict)
    lost_gpus: set[int] = field(default_factory=set)
    #: grants that answered no pending request (the request was withdrawn first)
    stale: set[StepKey] = field(default_factory=set)
    last_seq: int = 0
    #: pipeline step name -> the most GPU memory it held in a recorded run
    memory_peaks: dict[str, int] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)

    def apply(self, rec: Recorded | Event) -> None:
        e = rec.event if isinstance(rec, Recorded) else rec
        if isinstance(rec, Recorded):
            self.last_seq = rec.seq
        if isinstance(e, _ROLE_EVENTS):
            self.usage.advance(e.at)
            self._apply(e)
            self.usage.hold(
                {
                    k: (h.request.owner, len(h.gpus))
                    for k, h in self.held.items()
                    if h.role == "primary" and h.request is not None
                }
            )
        else:
            self._apply(e)

    def _apply(self, e: Event) -> None:
        if isinstance(e, ev.StepRequested):
            self.requests[(e.run_id, e.step)] = e
        elif isinstance(e, ev.LeaseGranted):
            k = (e.run_id, e.step)
            req = self.requests.pop(k, None)
            tier = cast(Tier, e.tier if e.tier in TIERS else "immediate")
            self.held[k] = Held(k, tuple(e.gpus), tier, e.at, req, e.channel)
            if req is None:
                self.stale.add(k)
            else:
                self.stale.discard(k)
        elif isinstance(e, ev.LeaseReleased):
            self.held.pop((e.run_id, e.step), None)
            self.stale.discard((e.run_id, e.step))
        elif isinstance(e, ev.StepStarted):
            if h := self.held.get((e.run_id, e.step)):
                h.pid, h.pgid, h.started_at, h.ended = e.pid, e.pgid or e.pid, e.at, False
                h.pid_started = e.pid_started
                h.attempt = e.attempt
        elif isinstance(e, ev.GuestStarted):
            if h := self.held.get((e.run_id, e.step)):
                # a demoted primary has run (a guest from its grant has not started yet)
                h.computed = h.computed or h.started_at is not None
                h.guest, h.paused, h.how = True, False, ""
        elif isinstance(e, ev.GuestPaused):
            if h := self.held.get((e.run_id, e.step)):
                h.paused, h.how, h.paused_at = True, e.how, e.at
        elif isinstance(e, ev.GuestResumed):
            if h := self.held.get((e.run_id, e.step)):
                # a gate opened before its process started let nothing through: a resumed
                # run's guest, let in beside a killed primary that looked idle, then paused
                # again before it started, was never moved to the GPU that freed
                h.paused, h.how = False, ""
                h.computed = h.computed or h.started_at is not None
        elif isinstance(e, ev.Promoted):
            if h := self.held.get((e.run_id, e.step)):
                h.guest, h.paused, h.how = False, False, ""
                if h.tier == "ready":
                    h.tier = "immediate"
        elif isinstance(e, ev.PriorityBumped):
            k = (e.run_id, e.step)
            self.bumps[k] = self.bumps.get(k, 0) + e.delta
        elif isinstance(e, ev.GpuLost):
            self.lost_gpus.add(e.gpu)
        elif isinstance(e, ev.StepMemoryMeasured):
            self.memory_peaks[e.step] = max(self.memory_peaks.get(e.step, 0), e.peak_bytes)
        elif isinstance(e, ev.StepSucceeded | ev.StepSkipped | ev.StepCancelled) or (
            isinstance(e, ev.StepFailed) and not e.will_retry
        ):
            k = (e.run_id, e.step)
            self.requests.pop(k, None)
            if h := self.held.get(k):
                h.ended = True
        elif isinstance(e, ev.StepRequeued) and (h := self.held.get((e.run_id, e.step))):
            h.ended = True  # stopped on a lost lease; it asks again

    def primaries(self) -> dict[int, Held]:
        """GPU index -> the lease that holds it as primary."""
        out: dict[int, Held] = {}
        for h in self.held.values():
            if h.role == "primary":
                for g in h.gpus:
                    out[g] = h
        return out


def fold_book(records: Iterable[Recorded | Event], book: Book | None = None) -> Book:
    book = Book() if book is None else book
    for rec in records:
        book.apply(rec)
    return book


def policy_input(
    book: Book,
    gpus: Sequence[GpuView],
    now: float,
    config: PolicyConfig,
    *,
    usage: Mapping[str, float] | None = None,
    io_waiting: Callable[[StepKey], bool] = lambda key: False,
    util_low_since: Callable[[StepKey], float | None] = lambda key: None,
    passed_gate: Callable[[StepKey], bool] = lambda key: False,
) -> PolicyInput:
    """The policy's input for this book; requests of an unknown step type are left out.
    `io_waiting` is a step's hint; `util_low_since` a guest's own low utilization (the
    agent's samples), for guests that give no hint; `passed_gate` whether a step went
    through its gate (a guest its primary's I/O let compute with no event in the log)."""
    pending = tuple(
        Pending(
            key=key,
            type=cast(StepType, r.type),
            priority=bounded(r.priority),
            bump=bounded(book.bumps.get(key, 0)),
            owner=r.owner,
            gpus=0 if r.type == "cpu" else max(1, r.gpus),
            gpu_memory=r.gpu_memory,
            queued_at=r.at,
            time_limit=r.time_limit,
            memory_peak=book.memory_peaks.get(key[1], 0),
        )
        for key, r in book.requests.items()
        if r.type in STEP_TYPES
    )
    running = []
    for key, h in book.held.items():
        req = h.request
        role = h.role
        running.append(
            Running(
                key=key,
                type=h.type,
                role=cast(Role, role),
                tier=h.tier,
                gpus=h.gpus,
                paused=h.paused if role == "guest" else False,
                gpu_memory=(req.gpu_memory or book.memory_peaks.get(key[1], 0)) if req else 0,
                priority=bounded(req.priority) if req else 0,
                bump=bounded(book.bumps.get(key, 0)),
                owner=req.owner if req else "",
                queued_at=req.at if req else h.granted_at,
                started_at=h.started_at if h.started_at is not None else h.granted_at,
                time_limit=req.time_limit if req else None,
                io_waiting=role != "cpu" and io_waiting(key),
                util_low_since=util_low_since(key) if role == "guest" else None,
                computed=role == "guest" and (h.computed or passed_gate(key)),
            )
        )
    return PolicyInput(
        pending=pending,
        running=tuple(running),
        gpus=tuple(gpus),
        now=now,
        config=config,
        usage_by_owner=dict(usage or {}),
    )


def policy_config(settings: Settings, **overrides: object) -> PolicyConfig:
    """The policy's tuning from the node's settings (``~/.m2config``)."""
    base = PolicyConfig(
        memory_overprovision=settings.memory_overprovision,
        io_timeout=settings.io_timeout,
        cpu_slots=settings.cpu_slots,
    )
    return replace(base, **overrides) if overrides else base  # type: ignore[arg-type]
