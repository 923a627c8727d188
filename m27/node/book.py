"""What the agent (and `m27 queue`) read from the log to ask the policy: its own small projection.

The node projection (:mod:`m27.events.state`) is keyed by runs and drops events for runs it never
saw submitted; the agent must serve any step that asks, so it keeps the few facts the
policy needs per step key, built only from events (a restarted agent rebuilds the same
book by replaying the log):

- pending requests (``StepRequested`` until granted or withdrawn);
- held leases: GPUs, tier, guest or primary, paused and how, the step's process, its
  channel file, and the request it answers;
- priority bumps, lost GPUs.

:func:`policy_input` turns a book plus GPU views into the :class:`~m27.policy.PolicyInput`
that :func:`m27.policy.decide` reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from m27 import events as ev
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
)

STEP_TYPES: frozenset[str] = frozenset({"cpu", "gpu", "gpu_light"})
TIERS: frozenset[str] = frozenset({"immediate", "ready", "background"})


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

    def apply(self, rec: Recorded | Event) -> None:
        e = rec.event if isinstance(rec, Recorded) else rec
        if isinstance(rec, Recorded):
            self.last_seq = rec.seq
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
        elif isinstance(e, ev.GuestStarted):
            if h := self.held.get((e.run_id, e.step)):
                h.guest, h.paused, h.how = True, False, ""
        elif isinstance(e, ev.GuestPaused):
            if h := self.held.get((e.run_id, e.step)):
                h.paused, h.how, h.paused_at = True, e.how, e.at
        elif isinstance(e, ev.GuestResumed):
            if h := self.held.get((e.run_id, e.step)):
                h.paused, h.how = False, ""
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
) -> PolicyInput:
    """The policy's input for this book; requests of an unknown step type are left out."""
    pending = tuple(
        Pending(
            key=key,
            type=cast(StepType, r.type),
            priority=r.priority,
            bump=book.bumps.get(key, 0),
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
                priority=req.priority if req else 0,
                bump=book.bumps.get(key, 0),
                owner=req.owner if req else "",
                queued_at=req.at if req else h.granted_at,
                started_at=h.started_at if h.started_at is not None else h.granted_at,
                time_limit=req.time_limit if req else None,
                io_waiting=role == "primary" and io_waiting(key),
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
