"""The step side of the agent protocol: ask for a lease, wait for it, give it back.

Everything goes through the node's event log, the mailbox between processes:

1. :meth:`AgentLease.acquire` appends ``StepRequested`` (with this process's pid, so a
   restarted agent can tell whether the requester still lives) and waits for the agent's
   ``LeaseGranted`` for the same (run, step);
2. the caller starts the step with ``M27_CHANNEL`` set to :attr:`Granted.channel` (a guest
   finds its gate closed there: it loads its data and waits in ``m27.gate()``);
3. :meth:`AgentLease.release` appends ``LeaseReleased`` when the step has ended.

One follower thread per :class:`AgentLease` reads the log for every waiter of the process,
marks a lease ``lost`` when one of its GPUs is lost (or the agent took it back), and, while
anything waits or runs, retries the node's agent lock so that an agent keeps serving the
node after the process that embedded it has ended.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from m27 import events as ev
from m27 import liveness
from m27.clock import Clock, SystemClock
from m27.events.holds import Hold
from m27.executors.local import StepLaunch, StepResult, record_cancelled, run_step, wait_retry
from m27.store import EventStore

__all__ = ["WAIT_TOLD_S", "AgentLease", "Granted", "either", "lease_wanted", "run_leased"]

log = logging.getLogger(__name__)

StepKey = tuple[str, str]

#: How long a step waits for its lease before `m27 run` and its Prefect task log say what
#: it waits for (a step that waited for a busy GPU said nothing until it started); long
#: enough that a free node's grant (milliseconds) is never told.
WAIT_TOLD_S = 3.0


def lease_wanted(gpus: int) -> str:
    """What a request for `gpus` GPUs waits for, as a message says it: "a CPU slot",
    "a GPU", "2 GPUs"."""
    return "a CPU slot" if gpus == 0 else ("a GPU" if gpus == 1 else f"{gpus} GPUs")


@dataclass
class Granted:
    """A lease the agent granted: GPUs, tier (immediate, ready, background) and the channel
    file for ``M27_CHANNEL``. ``lost`` is set when a GPU of the lease is lost or the agent
    released the lease: the step should stop and ask again."""

    gpus: tuple[int, ...]
    tier: str
    channel: str = ""
    #: the cores the step runs on (its GPUs' share of the node's; empty: not confined)
    cpus: tuple[int, ...] = ()
    lost: threading.Event = field(default_factory=threading.Event)
    #: why `lost` was set (`GPU 0 lost`), for the step's StepRequeued
    why: str = ""
    #: its holds as a guest (GuestPaused to GuestResumed/Promoted): the time its
    #: `timeout:` does not count
    hold: Hold = field(default_factory=Hold)


class _Either(threading.Event):
    """An event that reads as set when the run's cancel or the lease's loss is (the runner
    only calls is_set), and says which (a loss is a requeue, not a cancel)."""

    def __init__(self, cancel: threading.Event, granted: Granted) -> None:
        super().__init__()
        self._cancel = cancel
        self._granted = granted

    def is_set(self) -> bool:
        return super().is_set() or self._cancel.is_set() or self._granted.lost.is_set()

    def requeue_reason(self) -> str | None:
        """`GPU 0 lost` when the lease was lost and the run was not cancelled."""
        if self._cancel.is_set() or not self._granted.lost.is_set():
            return None
        return self._granted.why or "its lease was lost"


def either(cancel: threading.Event, granted: Granted) -> threading.Event:
    """A stop flag for the runner that trips on the run's cancel or the lease's loss."""
    return _Either(cancel, granted)


class AgentLease:
    """Leases from the node agent for the steps of this process (thread-safe)."""

    def __init__(
        self,
        store: EventStore,
        home: Path,
        *,
        embed: bool = True,
        poll: float = 0.1,
        clock: Clock | None = None,
    ) -> None:
        self.store = store
        self.home = Path(home)
        self.embed = embed
        self.poll = poll
        self.clock = clock or SystemClock()
        self._cond = threading.Condition()
        self._waiting: set[StepKey] = set()
        self._granted: dict[StepKey, Granted] = {}
        self._held: dict[StepKey, Granted] = {}
        self._after = store.last_seq()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the public calls ---------------------------------------------------------------

    def acquire(
        self,
        run_id: str,
        step: str,
        type: str,
        *,
        gpus: int = 0,
        gpu_memory: int = 0,
        priority: int = 0,
        owner: str = "",
        cancelled: Callable[[], bool] = lambda: False,
        time_limit: float | None = None,
        on_wait: Callable[[], None] | None = None,
    ) -> Granted | None:
        """Ask the agent and wait; None (and the request withdrawn) if `cancelled()` first.

        `time_limit` is the step's declared hard limit (seconds): the policy may then
        backfill it onto GPUs held for a wider step it will not delay. `on_wait` is called
        once, in the caller's thread, when no lease has come after WAIT_TOLD_S."""
        key = (run_id, step)
        self._start()
        with self._cond:
            self._waiting.add(key)
            self._granted.pop(key, None)
        request = ev.StepRequested(
            at=self.clock.now(),
            run_id=run_id,
            step=step,
            type=type,
            priority=priority,
            gpus=gpus,
            gpu_memory=gpu_memory,
            owner=owner,
            pid=os.getpid(),
            time_limit=time_limit,
            pid_started=liveness.own_start_time(),
        )
        self.store.append([request])
        self._keep_agent()
        tell_at = request.at + WAIT_TOLD_S
        with self._cond:
            while key not in self._granted:
                if cancelled() or self._closed.is_set():
                    self._waiting.discard(key)
                    break
                if on_wait is not None and self.clock.now() >= tell_at:
                    tell, on_wait = on_wait, None
                    self._cond.release()  # the grant is recorded meanwhile, not held up
                    try:
                        tell()
                    finally:
                        self._cond.acquire()
                    continue
                self._cond.wait(self.poll)
            got = self._granted.pop(key, None)
            self._waiting.discard(key)
            if got is not None:
                self._held[key] = got
                return got
        # Withdraw in one batch: the request ends, and a grant that raced it is given back
        # (a grant appended after this is stale, and the agent takes it back itself).
        now = self.clock.now()
        self.store.append(
            [
                ev.StepCancelled(at=now, run_id=run_id, step=step, reason="cancelled"),
                ev.LeaseReleased(at=now, run_id=run_id, step=step),
            ]
        )
        return None

    def release(self, run_id: str, step: str, granted: Granted) -> None:
        with self._cond:
            self._held.pop((run_id, step), None)
        self.store.append(
            [ev.LeaseReleased(at=self.clock.now(), run_id=run_id, step=step, gpus=granted.gpus)]
        )

    def close(self, wait: bool = True) -> None:
        """Stop following the log; with `wait`, until the follower has ended (it notices
        at its next event or poll: a run appends its end first, so it need not wait)."""
        self._closed.set()
        with self._cond:
            self._cond.notify_all()
        if wait and self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)

    # -- the follower -------------------------------------------------------------------

    def _start(self) -> None:
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._follow, name="m27-lease", daemon=True)
                self._thread.start()

    def _follow(self) -> None:
        while not self._closed.is_set():
            try:
                records = self.store.follow(self._after, timeout=self.poll)
            except Exception as exc:  # the log closed or broke: waiters give up, not hang
                if not self._closed.is_set():
                    log.warning("m27: lease follower stopped: %s", exc)
                self._closed.set()
                with self._cond:
                    self._cond.notify_all()
                return
            with self._cond:
                for rec in records:
                    self._after = rec.seq
                    self._dispatch(rec.event)
                self._cond.notify_all()
                busy = bool(self._waiting or self._held)
            if busy:
                self._keep_agent()

    def _dispatch(self, e: ev.Event) -> None:
        if isinstance(e, ev.LeaseGranted):
            key = (e.run_id, e.step)
            if key in self._waiting:
                self._granted[key] = Granted(tuple(e.gpus), e.tier, e.channel, tuple(e.cpus))
        elif isinstance(e, ev.GuestPaused | ev.GuestResumed | ev.Promoted):
            key = (e.run_id, e.step)
            if (g := self._held.get(key) or self._granted.get(key)) is not None:
                g.hold.apply(e)
        elif isinstance(e, ev.GpuLost):
            # A grant its step's thread has not picked up yet is lost too: its step would
            # start on the lost GPU and never learn it (a guest there waits at its gate
            # for good)
            for g in (*self._held.values(), *self._granted.values()):
                if e.gpu in g.gpus:
                    g.why = g.why or f"GPU {e.gpu} lost"
                    g.lost.set()
        elif isinstance(e, ev.LeaseReleased):
            key = (e.run_id, e.step)
            mine = self._held.get(key) or self._granted.get(key)
            if mine is not None:
                # released by someone else (the agent): the step must stop
                mine.why = mine.why or e.reason or "the node agent took its lease back"
                mine.lost.set()

    def _keep_agent(self) -> None:
        if not self.embed:
            return
        from m27.node.embed import ensure_agent

        try:
            ensure_agent(self.home)
        except Exception as exc:  # the next poll tries again; waiting steps must not die
            log.warning("m27: cannot start an agent here: %s", exc)


def _held_now(granted: Granted, clock: Clock) -> float:
    return granted.hold.seconds(clock.now())


def run_leased(
    lease: AgentLease,
    launch: StepLaunch,
    type: str,
    *,
    cancel: threading.Event,
    gpu_memory: int = 0,
    priority: int = 0,
    owner: str = "",
    gpus: int = 0,
    on_lines: Callable[[str, list[str]], None] | None = None,
    resume_from: Callable[[], str | None] | None = None,
    supervise: Callable[[Callable[[], StepResult]], StepResult] = lambda f: f(),
    time_limit: float | None = None,
    on_wait: Callable[[], None] | None = None,
) -> StepResult | None:
    """Lease, run the step with its channel and GPUs, release; again if its GPU was lost.

    A failed attempt with retries left and a ``retry_delay`` gives its lease back for the
    delay (its GPUs serve other steps meanwhile) and asks again for the next attempt.
    None when `cancel` was set before a lease came. `supervise` runs the step (the flow
    runs it on a worker thread and registers checkpoints meanwhile); `on_wait` is called
    when a request (each attempt's, after a retry_delay) has waited WAIT_TOLD_S.
    """
    launch = replace(launch, delay_outside=launch.retry_delay > 0)
    attempts = 0  # before this lease: the retries after a retry_delay go on counting
    while True:
        if attempts and cancel.is_set():
            return record_cancelled(launch, lease.store, lease.clock, attempts, 0.0)
        granted = lease.acquire(
            launch.run_id,
            launch.step,
            type,
            gpus=gpus,
            gpu_memory=gpu_memory,
            priority=priority,
            owner=owner,
            cancelled=cancel.is_set,
            time_limit=time_limit,
            on_wait=on_wait,
        )
        if granted is None:
            if attempts:
                return record_cancelled(launch, lease.store, lease.clock, attempts, 0.0)
            return None
        env = dict(launch.env)
        if granted.channel:
            env["M27_CHANNEL"] = granted.channel
        leased = replace(
            launch, gpus=granted.gpus, cpus=granted.cpus, env=env, first_attempt=attempts + 1
        )
        stop = either(cancel, granted)
        try:
            result = supervise(
                partial(
                    run_step,
                    leased,
                    lease.store,
                    on_lines=on_lines,
                    cancel=stop,
                    resume_from=resume_from,
                    held=partial(_held_now, granted, lease.clock),
                )
            )
        finally:
            lease.release(launch.run_id, launch.step, granted)
        if result.cancelled and granted.lost.is_set() and not cancel.is_set():
            # Its GPU was lost: ask again (StepRequeued says so); the step resumes from its
            # last checkpoint.
            continue
        if result.will_retry:
            attempts = result.attempts
            wait_retry(lease.clock, launch.retry_delay, cancel)  # a cancel is seen above
            continue
        return result
