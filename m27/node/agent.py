"""The node agent: read the log, sample the GPUs, ask the policy, act, record what it did.

One agent serves a node (an fcntl lock on ``$M27_HOME/agent.lock``, see
:mod:`m27.node.embed`). It ticks every ``io_timeout`` (default 50 ms) and at once when
new events arrive:

1. new events from the log (the node's mailbox) update its :class:`~m27.node.book.Book`;
2. the GPU backend is sampled; the primary's own utilization and its channel's I/O hint
   tell the policy whether the primary computes;
3. :func:`m27.policy.decide` says what to do; the agent does it and appends what it did:
   ``LeaseGranted`` (with the step's channel file), ``GuestStarted``/``GuestPaused``,
   ``GuestResumed``, ``Promoted``, ``LeaseReleased``, ``GpuLost``; and, once per
   crossing, ``GpuOverheated``/``GpuThrottled`` (:mod:`m27.node.report`, which also
   writes the ``$M27_HOME/gpus.json`` snapshot that ``m27 gpus`` shows).

Pausing a guest closes its gate (``m27.gate()``); a guest that does not reach its gate
within ``gate_grace`` (it has no gate, or computes between gate calls) is stopped with
SIGSTOP on its process group, and continued with SIGCONT when it may compute again.

Everything the agent knows comes from the log, so a restarted agent (after ``kill -9``)
replays it, re-adopts the step processes that are still alive (keeps their leases, maps
their channels again) and releases the leases of steps whose process and requester are
both gone (see docs/agent.md for what "requeue" means then).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from m27 import liveness
from m27._exceptions import M27Error, StoreError
from m27.clock import Clock, SystemClock
from m27.events import (
    AgentStarted,
    Event,
    GpuLost,
    GuestPaused,
    GuestResumed,
    GuestStarted,
    LeaseGranted,
    LeaseReleased,
    Promoted,
    Recorded,
    StepFailed,
    StepStarted,
)
from m27.gpu import GpuBackend, GpuSample
from m27.gpu.cpus import step_cpus
from m27.node.book import Book, Held, policy_config, policy_input
from m27.node.follow import FollowControl, IoWatch
from m27.node.guests import GuestControl
from m27.node.memory import PeakMemory
from m27.node.outage import Outage, Repeats
from m27.node.report import (
    Health,
    Sampler,
    queue_rows,
    remove_snapshot,
    snapshot,
    write_snapshot,
)
from m27.node.views import ViewControl
from m27.paths import join_under
from m27.policy import (
    Decision,
    Demote,
    Grant,
    Move,
    PauseGuest,
    PolicyConfig,
    Promote,
    ResumeGuest,
    StartCpu,
    StepKey,
    decide,
)
from m27.step import Channel
from m27.store import EventStore

__all__ = ["Agent", "channel_path", "policy_config"]

log = logging.getLogger(__name__)

#: The soonest a changed book is published again (seconds): a busy node's events would
#: otherwise rewrite ``gpus.json`` at every tick.
REPUBLISH_S = 0.1


def channel_path(home: Path, key: StepKey) -> Path:
    """``$M27_HOME/channels/<run>/<step>.chan``."""
    run, step = (part.replace("/", "_") for part in key)
    return join_under(home, "channels", run, f"{step}.chan")


class Agent(ViewControl, GuestControl, FollowControl):
    """The node loop. ``start()`` replays the log; ``tick()`` is one pass; ``run(stop)``
    loops until `stop` is set. Not thread-safe: one thread drives it."""

    def __init__(
        self,
        store: EventStore,
        backend: GpuBackend,
        home: Path,
        *,
        config: PolicyConfig | None = None,
        clock: Clock | None = None,
        tick: float | None = None,
        gate_grace: float | None = None,
        start_grace: float = 1.0,
        check_every: float = 0.5,
        on_decision: Callable[[Decision, Sequence[Event]], None] | None = None,
        health: Health | None = None,
        snapshot_every: float | None = 1.0,
        cpu_shares: Mapping[int, tuple[int, ...]] | None = None,
    ) -> None:
        self.store = store
        self.backend = backend
        self.home = Path(home)
        self.config = config or PolicyConfig()
        self.clock = clock or SystemClock()
        self.tick_s = tick if tick is not None else self.config.io_timeout
        self.gate_grace = gate_grace if gate_grace is not None else 4 * self.config.io_timeout
        #: a guest whose step has not opened its channel yet is still starting (an
        #: interpreter, imports): it is not stopped by signal for that long
        self.start_grace = start_grace
        self.check_every = check_every
        self.on_decision = on_decision
        self.health = health or Health()
        self.snapshot_every = snapshot_every
        #: each GPU's cores (m27.gpu.cpus): a GPU step's lease names its GPUs' cores
        self.cpu_shares = dict(cpu_shares or {})
        self._snapshot_at = -math.inf
        self._published_seq = -1  # the book's last_seq in the last snapshot
        self._sampler = Sampler(backend)
        self.book = Book()
        self.started = False
        self._channels: dict[StepKey, Channel] = {}
        self._stopped: set[StepKey] = set()  # guests this agent holds with SIGSTOP
        self._attached: dict[StepKey, tuple[int, tuple[int, ...]]] = {}
        self._low: dict[int, tuple[StepKey, float]] = {}
        self._guest_low: dict[StepKey, float] = {}
        self._pgids: dict[int, int | None] = {}
        self._recent: dict[int, tuple[int | None, float]] = {}  # pid -> (pgid, last held)
        self._foreign: dict[int, int] = {}  # GPU -> bytes held outside m27, as last seen
        self._checked_at = -math.inf
        self._memory = {d.index: d.memory_total or 0 for d in backend.devices()}
        self._attach = getattr(backend, "attach", None)
        self._watch = IoWatch(self.config)
        self._peaks = PeakMemory()
        self._later: list[Event] = []  # appended with the next tick's batch
        self._told_lost: set[int] = set()  # GPUs this agent appended GpuLost for
        self._paused_now: dict[StepKey, bool] = {}
        self._standby: Mapping[int, StepKey] = {}  # the last decision's (m27.node.follow)
        self._followers: Mapping[int, tuple[StepKey, ...]] = {}  # the same
        self._yield_to: Mapping[int, tuple[StepKey, ...]] = {}  # the same
        self._due: dict[int, tuple[tuple[StepKey, float], float]] = {}
        self._armed: dict[int, float] = {}
        self._let_compute: dict[StepKey, float] = {}
        self._moving: dict[int, tuple[StepKey, float, float]] = {}
        self._shut: dict[StepKey, tuple[Path, ...]] = {}
        self._detach = getattr(backend, "detach", None)
        self._outage = Outage(self.clock)
        self._repeats = Repeats(log.warning, clock=self.clock)

    # -- life ---------------------------------------------------------------------------

    def start(self) -> None:
        """Replay the log, re-adopt live steps, release lost ones, say the agent started."""
        for rec in self.store.read():
            self.book.apply(rec)
        for key, h in self.book.held.items():
            self._open_channel(key, h)
            if liveness.alive(h.pid, h.pid_started):
                self._attach_step(key, h)
                if h.guest and h.paused and h.how == "signal":
                    self._stopped.add(key)
        now = self.clock.now()
        started = AgentStarted(
            at=now,
            pid=os.getpid(),
            host=socket.gethostname(),
            gpus=len(self._memory),
            backend=self.backend.kind,
        )
        batch = [started, *self._check_lost(now)]
        try:
            self.store.append(batch)
        except StoreError as exc:  # a full disk at start: run() appends it when it can
            self._outage.keep(batch)
            self._outage.failed(exc)
        self._checked_at = self.clock.monotonic()  # (a stepped wall clock must not stall it)
        self.started = True

    def run(self, stop: threading.Event) -> None:
        """Tick until `stop` is set (at once after new events, else every ``tick_s``); an
        event log that cannot be written pauses the decisions, not the agent (outage.py)."""
        if not self.started:
            self.start()
        outage = self._outage
        while not stop.is_set():
            try:
                if outage.unsaved:
                    self.store.append(outage.unsaved)
                    outage.recovered(len(outage.unsaved))
                    outage.unsaved = []
                self._wait(self.tick_s)
                if stop.is_set():
                    break
                self.tick()
                if outage.since is not None:  # (a read had failed: nothing was kept)
                    outage.recovered(0)
            except StoreError as exc:
                outage.failed(exc)
                stop.wait(outage.RETRY_S)

    def close(self) -> None:
        if self.snapshot_every is not None:
            remove_snapshot(self.home)
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
        self.backend.close()

    # -- one pass -----------------------------------------------------------------------

    def poll(self, timeout: float = 0.0) -> int:
        """Apply the events appended since the last pass; waits up to `timeout` for one."""
        if timeout > 0:
            records = self.store.follow(self.book.last_seq, timeout)
        else:
            records = self.store.read(self.book.last_seq)
        for rec in records:
            self._apply(rec)
        return len(records)

    def tick(self) -> Decision:
        """Sample, decide, act; the events of what was done are appended in one batch.

        The gates and signals come first, right after the decision (a guest waits on
        them); the bookkeeping that does not change the decision (memory peaks, health,
        lost processes) is done after, and its events go first in the same batch."""
        now = self.clock.now()
        samples = self._sampler.sample(now)
        views = self._views(samples, now)
        self._track_guests(samples, now)
        inp = policy_input(
            self.book,
            views,
            now,
            self.config,
            usage=self.book.usage.at(now),  # folded from the log: survives a restart
            io_waiting=self._io_waiting,
            util_low_since=self._guest_low.get,
            passed_gate=self._passed_gate,
        )
        decision = decide(inp)
        acted: set[StepKey] = set()
        done = self._act(decision, now, acted)
        self._follow(decision, now)
        out: list[Event] = self._later
        self._later = []
        self._peaks.observe(samples, self.book.held, self._pgid)
        out += self.health.check(samples, now)
        for s in samples:
            # (`_told_lost` too: a wait that ended early on an I/O change may not have read
            # last tick's GpuLost into the book yet; it is not appended twice)
            if s.lost and s.index not in self.book.lost_gpus and s.index not in self._told_lost:
                self._told_lost.add(s.index)
                out.append(GpuLost(at=now, gpu=s.index, uuid=s.uuid or "", reason="lost"))
        if self.clock.monotonic() - self._checked_at >= self.check_every:
            self._checked_at = self.clock.monotonic()
            out += self._check_lost(now)
        for key in sorted(self.book.stale):
            h = self.book.held.get(key)
            if h is not None and h.pid is None:
                # granted after its request was withdrawn: nobody will use it
                out.append(LeaseReleased(at=now, run_id=key[0], step=key[1], gpus=h.gpus))
        out += done
        out += self._escalate(now, acted, samples)
        if out:
            try:
                self.store.append(out)
            except StoreError:
                self._outage.keep(out)  # done, so recorded later: see run()
                raise
        if self.snapshot_every is not None and self._publish_due(now):
            self._snapshot_at, self._published_seq = now, self.book.last_seq
            self._publish(samples, now, decision)
        if self.on_decision is not None and (decision.actions or out):
            self.on_decision(decision, out)
        return decision

    def _publish_due(self, now: float) -> bool:
        """A snapshot every ``snapshot_every``, and sooner (at most every
        :data:`REPUBLISH_S`) when the book has changed: ``m27 queue`` waits for one that
        has every change the log holds (a bump, a new request)."""
        assert self.snapshot_every is not None
        since = now - self._snapshot_at
        changed = self.book.last_seq != self._published_seq
        return since >= self.snapshot_every or (changed and since >= REPUBLISH_S)

    def _publish(self, samples: list[GpuSample], now: float, decision: Decision) -> None:
        """``$M27_HOME/gpus.json`` for ``m27 gpus`` and ``m27 queue`` in other processes;
        never fatal."""
        queue = queue_rows(self.book, decision, now, self.config)
        try:
            write_snapshot(
                self.home,
                snapshot(
                    samples,
                    self.book,
                    self.backend.kind,
                    now,
                    queue=queue,
                    outside=self._foreign,
                    cores=self.cpu_shares,
                ),
            )
        except OSError as exc:
            self._repeats(f"m27 agent: cannot write the GPU snapshot: {exc}")

    # -- events in ----------------------------------------------------------------------

    def _apply(self, rec: Recorded) -> None:
        e = rec.event
        if isinstance(e, LeaseReleased):
            key = (e.run_id, e.step)
            self._later += self._peaks.released(key, e.at)
            self._detach_step(key)
            self._drop_channel(key, taken_back=bool(e.reason))
            self._stopped.discard(key)
        self.book.apply(rec)
        if isinstance(e, StepStarted):
            key = (e.run_id, e.step)
            h = self.book.held.get(key)
            if h is not None:
                self._attach_step(key, h)
        elif isinstance(e, LeaseGranted):
            key = (e.run_id, e.step)
            h = self.book.held.get(key)
            if h is not None and key not in self._channels:
                self._open_channel(key, h)

    def _open_channel(self, key: StepKey, h: Held) -> None:
        if not h.channel or key in self._channels:
            return
        # A channel file removed by hand: the step is paused by signal instead.
        with contextlib.suppress(M27Error):
            self._channels[key] = Channel.open(h.channel)

    def _attach_step(self, key: StepKey, h: Held) -> None:
        if self._attach is None or h.pid is None or not h.gpus:
            return
        self._detach_step(key)
        memory = h.request.gpu_memory if h.request else 0
        for g in h.gpus:
            try:
                self._attach(g, h.pid, memory, h.channel or None)
            except M27Error:
                self._attach(g, h.pid, memory, None)
        self._attached[key] = (h.pid, h.gpus)

    def _detach_step(self, key: StepKey) -> None:
        old = self._attached.pop(key, None)
        if old is not None and self._detach is not None:
            for g in old[1]:
                self._detach(g, old[0])

    # -- what the policy sees -----------------------------------------------------------

    def _io_waiting(self, key: StepKey) -> bool:
        ch = self._channels.get(key)
        return ch is not None and ch.io_waiting()

    def _passed_gate(self, key: StepKey) -> bool:
        ch = self._channels.get(key)
        return ch is not None and ch.passed_gate()

    def _hints(self, key: StepKey) -> bool:
        """Whether the step says when it waits on I/O (it has used ``io_wait()``)."""
        ch = self._channels.get(key)
        return ch is not None and ch.io_count() > 0

    # -- acting -------------------------------------------------------------------------

    def _act(self, d: Decision, now: float, acted: set[StepKey]) -> list[Event]:
        out: list[Event] = []
        self._paused_now = paused_now = {}
        primary_of: dict[int, StepKey] = {g: h.key for g, h in self.book.primaries().items()}
        for a in d.actions:
            if isinstance(a, Grant):
                as_guest = a.tier == "ready" or (
                    a.tier == "background" and any(g in primary_of for g in a.gpus)
                )
                path = channel_path(self.home, a.key)
                old = self._channels.pop(a.key, None)
                if old is not None:
                    old.close()
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    self._channels[a.key] = Channel.create(path, gate_open=not as_guest)
                except OSError as exc:  # a full disk: not granted now, decided again next tick
                    self._repeats(f"m27 agent: cannot create a step's channel: {exc}")
                    continue
                run_id, step = a.key
                cpus = step_cpus(a.gpus, self.cpu_shares)
                out.append(LeaseGranted(now, run_id, step, a.gpus, a.tier, str(path), cpus))
                if as_guest:
                    out.append(GuestStarted(at=now, run_id=run_id, step=step, gpu=a.gpus[0]))
                    out.append(GuestPaused(at=now, run_id=run_id, step=step, gpu=a.gpus[0]))
                else:
                    for g in a.gpus:
                        primary_of[g] = a.key
            elif isinstance(a, StartCpu):
                out.append(LeaseGranted(now, a.key[0], a.key[1], (), "background", ""))
            elif isinstance(a, PauseGuest | Demote):
                h = self.book.held.get(a.key)
                if h is None:
                    continue
                how = self._pause(a.key, h, now)
                paused_now[a.key] = True
                if isinstance(a, Demote):
                    primary_of.pop(a.gpu, None)
                    out.append(GuestStarted(at=now, run_id=a.key[0], step=a.key[1], gpu=a.gpu))
                out.append(GuestPaused(at=now, run_id=a.key[0], step=a.key[1], gpu=a.gpu, how=how))
            elif isinstance(a, ResumeGuest | Promote):
                h = self.book.held.get(a.key)
                if h is None:
                    continue
                self._resume(a.key, h)
                paused_now[a.key] = False
                cls = Promoted if isinstance(a, Promote) else GuestResumed
                out.append(cls(at=now, run_id=a.key[0], step=a.key[1], gpu=a.gpu))
                if isinstance(a, Promote):
                    primary_of[a.gpu] = a.key
            elif isinstance(a, Move) and (moved := self._move(a, now)) is not None:
                out.append(moved)
            else:
                continue  # Reserve: nothing to do but hold, which the next decision repeats
            acted.add(a.key)
        return out

    @staticmethod
    def _lost(h: Held) -> bool:
        """Whether the step process of `h` and the process that requested it are gone."""
        req_pid = h.request.pid if h.request is not None else 0
        req_started = h.request.pid_started if h.request is not None else None
        return not (
            liveness.alive(h.pid, h.pid_started)
            or req_pid <= 0
            or liveness.alive(req_pid, req_started)
        )

    def _check_lost(self, now: float) -> list[Event]:
        """Release leases whose step process and requester are both gone; drop requests
        whose requester is gone. The flow's retry (or ``m27 run --resume``) reruns them.

        The node service's crash watcher closes the run of such a step too (it stops the
        step's processes, then records `run crashed: ...`): the log is read again before a
        step is called lost, or its stale copy here recorded `lost` over that end."""
        if any(not h.ended and self._lost(h) for h in self.book.held.values()) or any(
            r.pid > 0 and not liveness.alive(r.pid, r.pid_started)
            for r in self.book.requests.values()
        ):
            self.poll()
        out: list[Event] = []
        for key, h in self.book.held.items():
            if not self._lost(h):
                continue
            req_pid = h.request.pid if h.request is not None else 0
            run_id, step = key
            out.append(LeaseReleased(at=now, run_id=run_id, step=step, gpus=h.gpus))
            if not h.ended:
                took = now - h.started_at if h.started_at is not None else 0.0
                why = f"lost: its process and its requester (pid {req_pid}) are gone"
                out.append(StepFailed(now, run_id, step, h.attempt, max(0.0, took), why))
        for key, r in self.book.requests.items():
            if r.pid > 0 and not liveness.alive(r.pid, r.pid_started):
                why = f"lost: the process that requested it (pid {r.pid}) is gone"
                out.append(StepFailed(now, key[0], key[1], 0, 0.0, why))
        return out
