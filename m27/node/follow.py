"""Guests that follow their primary's I/O hint directly, and the agent's fast wake-up.

A tick of the agent (sample, decide, append events) comes every ``io_timeout`` at most; a
primary's ``with m27.io_wait():`` is often shorter than that. Two things close the gap:

- *standby guests follow the primary's channel.* The policy names per GPU the guest that
  computes in the primary's next I/O wait (:attr:`m27.policy.Decision.standby`); when it
  pauses at its gate (``m27.gate()``) and its primary gives hints, the agent sets its
  gate to *follow* the primary's channel page (:meth:`m27.step.Channel.set_follow`). The
  guest's own ``gate()`` then opens the moment the primary enters ``io_wait()`` and stops
  it at its next call once the primary leaves it: no agent round trip either way. The
  agent's events (``GuestResumed``/``GuestPaused``) follow at its next tick.
- *behind a primary without hints, the standby guest's gate has a deadline*: the moment
  its primary's inferred I/O wait reaches ``io_timeout`` (the first idle sample +
  ``io_timeout``), set as soon as a sample shows the primary idle and taken back when one
  shows it computing; the guest starts then by itself, not after the agent's tick.
- *the agent wakes when an I/O state changes* (:class:`IoWatch`): while some GPU hosts
  guests, utilization is sampled every ``slice_s``, and a tick comes at once when a
  primary's hint flips, when the standby guest's own hint flips (it entered its own I/O
  wait: the next guest takes the gap), or exactly when a primary's inferred I/O wait
  reaches ``io_timeout``. That is what SIGSTOP-paused black-box guests, which cannot
  follow anything, rely on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

from m27.clock import Clock, SystemClock
from m27.gpu import GpuSample
from m27.node.book import Book, Held
from m27.node.report import Sampler
from m27.policy import Decision, GpuView, PolicyConfig, StepKey
from m27.step import Channel

__all__ = ["FollowControl", "IoWatch", "arm_standby"]


def arm_standby(
    standby: Mapping[int, StepKey],
    held: Mapping[StepKey, Held],
    primaries: Mapping[int, Held],
    channels: Mapping[StepKey, Channel],
    stopped: set[StepKey],
    paused_now: Mapping[StepKey, bool],
    hints: Callable[[StepKey], bool],
    due: Mapping[int, float] | None = None,
    followers: Mapping[int, tuple[StepKey, ...]] | None = None,
    yield_to: Mapping[int, tuple[StepKey, ...]] | None = None,
    yield_bound: float = 0.0,
) -> set[StepKey]:
    """Set each standby guest's gate to follow its primary; close it on the others.

    Only a gate user that is not held by SIGSTOP follows. Behind a primary that gives no
    hints it follows nothing (its gate stays closed, but it looks every 1 ms, so the
    agent's word on an inferred I/O wait reaches it at once); where that primary shows no
    compute, `due` (per GPU, a ``time.monotonic()`` value) is when its inferred I/O wait
    reaches ``io_timeout``, and the gate opens by itself then. A guest resumed on an
    *inferred* I/O wait (its primary is not inside ``io_wait()``) keeps its open gate:
    following would stop it at once.

    Behind a hinted primary and a standby that gives hints, the GPU's `followers` (the
    policy's order) follow too, each with the guests before it as the guests *ahead*
    (:meth:`m27.step.Channel.set_follow`): one computes when the primary and every guest
    ahead wait on I/O. The chain stops at the first follower that cannot follow (no hints,
    no gate, stopped by signal); one the agent let compute (its gate open) stays so and
    counts as ahead.

    A hinted primary that uses its gate *yields* (:meth:`m27.step.Channel.set_yield`, at
    most `yield_bound` seconds) to those of its following guests that the policy names in
    `yield_to`; every other primary's gate is plain open.

    Returns the guests whose follow it ended: each may be mid-compute (its gate was open
    while its primary was in I/O), so it gets ``gate_grace`` from now to reach its gate.
    """
    chosen: set[StepKey] = set()
    yield_paths: dict[StepKey, list[Path]] = {}  # per primary (a wide one: all its GPUs)
    for gpu, key in standby.items():
        h, prim = held.get(key), primaries.get(gpu)
        ch = channels.get(key)
        pch = channels.get(prim.key) if prim is not None else None
        if h is None or ch is None or key in stopped or not ch.uses_gate():
            continue
        if prim is None:
            # a GPU held free for a reservation: its guest computes alone, gate as decided
            # (not left following a primary that ended, which would stop it)
            if ch.following():
                ch.set_gate(not paused_now.get(key, h.paused))
            chosen.add(key)
            continue
        paused = paused_now.get(key, h.paused)
        if pch is None or not hints(prim.key):
            # a primary without hints: its I/O is inferred, and the agent opens the gate;
            # a paused standby waits on a follow with no target (closed, polled every 1 ms)
            if paused:
                ch.set_follow("", at=(due or {}).get(gpu))
                chosen.add(key)
            continue
        linked: set[StepKey] = set()
        if paused or pch.io_waiting():
            ch.set_follow(pch.path)
            linked.add(key)
        elif ch.following(pch.path):
            linked.add(key)  # let compute, by the agent or its follow: the primary left I/O
        if hints(key):
            linked |= _chain((followers or {}).get(gpu, ()), ch, pch, held, channels,
                             stopped, paused_now, hints)  # fmt: skip
        chosen |= linked
        to = [channels[k].path for k in (yield_to or {}).get(gpu, ()) if k in linked]
        if to and yield_bound > 0 and pch.uses_gate():
            yield_paths.setdefault(prim.key, []).extend(to)
    for prim in primaries.values():
        pch = channels.get(prim.key)
        if pch is None:
            continue
        if prim.key in yield_paths:
            pch.set_yield(tuple(yield_paths[prim.key]), yield_bound)
        elif pch.yields():
            pch.set_gate(True)
    closed: set[StepKey] = set()
    for key, ch in channels.items():
        if key not in chosen and ch.following():
            ch.set_gate(False)
            closed.add(key)
    return closed


def _chain(
    keys: tuple[StepKey, ...],
    first: Channel,
    primary: Channel,
    held: Mapping[StepKey, Held],
    channels: Mapping[StepKey, Channel],
    stopped: set[StepKey],
    paused_now: Mapping[StepKey, bool],
    hints: Callable[[StepKey], bool],
) -> set[StepKey]:
    """Chain the followers of one GPU behind `first` (the standby): see :func:`arm_standby`."""
    chained: set[StepKey] = set()
    ahead = [first.path]
    for key in keys:
        h, ch = held.get(key), channels.get(key)
        if h is None or ch is None or key in stopped or not ch.uses_gate() or not hints(key):
            break
        if paused_now.get(key, h.paused):
            ch.set_follow(primary.path, ahead=tuple(ahead))
            chained.add(key)
        ahead.append(ch.path)
    return chained


class IoWatch:
    """What the agent compares between ticks: per GPU hosting guests, whether its primary
    waits on I/O (hinted, or inferred for ``io_timeout``)."""

    def __init__(self, config: PolicyConfig, slice_s: float = 0.002) -> None:
        self.config = config
        self.slice_s = slice_s
        self.seen: dict[int, bool] = {}
        #: the standby guests inside their own ``io_wait()`` at the last tick
        self.guests_seen: frozenset[StepKey] = frozenset()

    def state(
        self,
        primaries: Mapping[int, Held],
        hosted: set[int],
        channels: Mapping[StepKey, Channel],
        hints: Callable[[StepKey], bool],
        low_since: Mapping[int, tuple[StepKey, float]],
        now: float,
    ) -> dict[int, bool]:
        out: dict[int, bool] = {}
        for gpu in hosted:
            prim = primaries.get(gpu)
            if prim is None:
                continue
            ch = channels.get(prim.key)
            hinted = ch is not None and hints(prim.key) and ch.io_waiting()
            low = low_since.get(gpu)
            inferred = (
                low is not None and low[0] == prim.key and now - low[1] >= self.config.io_timeout
            )
            out[gpu] = hinted or inferred
        return out

    @staticmethod
    def guests_io(
        standby: Mapping[int, StepKey],
        channels: Mapping[StepKey, Channel],
        hints: Callable[[StepKey], bool],
    ) -> frozenset[StepKey]:
        """The standby guests inside their own ``io_wait()``: when the one computing in its
        primary's gap enters its own, the next guest should take the gap at once."""
        return frozenset(
            k
            for k in standby.values()
            if (ch := channels.get(k)) is not None and hints(k) and ch.io_waiting()
        )

    def next_due(self, low_since: Mapping[int, tuple[StepKey, float]], hosted: set[int]) -> float:
        """The earliest time an inferred I/O wait on a hosting GPU reaches ``io_timeout``."""
        due = [since + self.config.io_timeout for g, (_, since) in low_since.items() if g in hosted]
        return min(due, default=float("inf"))


class FollowControl:
    """The agent between two ticks: the standby guests' gates and the wait that ends
    when an I/O state changes. Part of :class:`m27.node.agent.Agent` (mixed in, as
    :class:`m27.node.guests.GuestControl`); the attributes are the agent's own."""

    book: Book
    clock: Clock
    config: PolicyConfig
    _channels: dict[StepKey, Channel]
    _stopped: set[StepKey]
    _paused_now: dict[StepKey, bool]
    _standby: Mapping[int, StepKey]
    _followers: Mapping[int, tuple[StepKey, ...]]
    _yield_to: Mapping[int, tuple[StepKey, ...]]
    _due: dict[int, tuple[tuple[StepKey, float], float]]
    _armed: dict[int, float]
    _watch: IoWatch
    _low: dict[int, tuple[StepKey, float]]
    _sampler: Sampler
    #: when the agent last ended each guest's follow (:func:`arm_standby`), among others
    #: (m27.node.guests)
    _let_compute: dict[StepKey, float]

    def poll(self, timeout: float = 0.0) -> int:
        raise NotImplementedError

    def _views(self, samples: list[GpuSample], now: float) -> list[GpuView]:
        raise NotImplementedError

    def _hints(self, key: StepKey) -> bool:
        raise NotImplementedError

    def _follow(self, decision: Decision, now: float) -> None:
        """Standby guests follow their primary's hint; remember the I/O states now."""
        self._standby, self._followers = decision.standby, decision.followers
        self._yield_to = decision.yield_to
        self._arm()
        primaries, channels, hints = self.book.primaries(), self._channels, self._hints
        hosted = self._hosted()
        self._watch.seen = self._watch.state(primaries, hosted, channels, hints, self._low, now)
        self._watch.guests_seen = self._watch.guests_io(self._standby, channels, hints)

    def _arm(self) -> None:
        """Set the standby guests' gates (m27.node.follow.arm_standby)."""
        self._armed = due = self._dues()
        held, primaries, stopped = self.book.held, self.book.primaries(), self._stopped
        paused = self._paused_now
        closed = arm_standby(
            self._standby, held, primaries, self._channels, stopped, paused, self._hints, due,
            self._followers, self._yield_to, self.config.primary_yield,
        )  # fmt: skip
        if closed:
            now = self.clock.now()
            self._let_compute.update(dict.fromkeys(closed, now))

    def _dues(self) -> dict[int, float]:
        """Per GPU whose primary shows no compute: the ``time.monotonic()`` at which that
        has lasted ``io_timeout`` (a standby guest's gate deadline). Fixed once per idle
        spell; none with an injected clock (the step's process reads the real one)."""
        if not isinstance(self.clock, SystemClock):
            return {}
        kept: dict[int, tuple[tuple[StepKey, float], float]] = {}
        for gpu, low in self._low.items():
            old = self._due.get(gpu)
            if old is None or old[0] != low:
                at = time.monotonic() + low[1] + self.config.io_timeout - self.clock.now()
                old = (low, at)
            kept[gpu] = old
        self._due = kept
        return {gpu: at for gpu, (_, at) in kept.items()}

    def _hosted(self) -> set[int]:
        return {h.gpus[0] for h in self.book.held.values() if h.guest and h.gpus}

    def _wait(self, timeout: float) -> int:
        """Like :meth:`poll`, but while guests are hosted, return early (0) when a
        primary's I/O state changed since the last tick (m27.node.follow).

        Utilization is sampled every ``slice_s``; an inferred I/O wait is due exactly
        ``io_timeout`` after the first sample that saw its primary idle, and the wait
        ends at that moment, not at the next slice (the guest's reaction is then
        ``io_timeout`` plus one sampling slice at most, plus the tick)."""
        hosted = self._hosted()
        if not hosted:
            return self.poll(timeout)
        watch, primaries, clock = self._watch, self.book.primaries(), self.clock
        deadline = time.monotonic() + timeout
        sample_at = time.monotonic() + watch.slice_s  # the tick has just sampled
        while True:
            mono = time.monotonic()
            left = deadline - mono
            if left <= 0:
                return 0
            if mono >= sample_at:  # utilization, for inferred I/O waits
                now = clock.now()
                self._views(self._sampler.sample(now), now)
                if self._dues() != self._armed:  # a primary went idle, or computes again
                    self._arm()
                mono = time.monotonic()
                sample_at = mono + watch.slice_s
            now = clock.now()
            io = watch.state(primaries, hosted, self._channels, self._hints, self._low, now)
            if io != watch.seen:
                return 0
            if watch.guests_io(self._standby, self._channels, self._hints) != watch.guests_seen:
                return 0
            waiting = {g for g in hosted if not watch.seen.get(g, False)}
            due = watch.next_due(self._low, waiting) - now
            step = min(sample_at - mono, left, max(due, 0.0))
            n = self.poll(step) if step > 0 else 0
            if n:
                return n
