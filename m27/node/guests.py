"""Pausing and resuming guests: the gate first, SIGSTOP/SIGCONT where it must.

Part of the node agent (:class:`m27.node.agent.Agent` mixes it in), apart because it is
one concern: a guest is paused at its gate (``m27.gate()``); one that does not reach its
gate within ``gate_grace`` (it has none, or computes between gate calls) is stopped with
SIGSTOP on its process group, and continued with SIGCONT when it may compute again. A
guest whose step has not opened its channel yet is still starting and is left alone for
``start_grace``; a following guest (m27.node.follow) computes only in its primary's I/O.

A guest that gives no I/O hint (``gmx``) may be waiting on its own I/O: the agent keeps
since when its own utilization has stayed low while it was let compute
(:meth:`GuestControl._track_guests`, reported as ``Running.util_low_since``), and the
policy lets another guest fill the gap. Such a guest, paused while its own utilization
is low, is not stopped while that lasts (stopping it would stop its I/O too): only when a
sample shows it computing again (``_escalate``), as the simulator models it.
"""

from __future__ import annotations

from pathlib import Path

from m27 import liveness
from m27.events import Event, GuestPaused, LeaseReleased
from m27.gpu import GpuSample
from m27.node import procs as proc
from m27.node.book import Book, Held
from m27.policy import Move, PolicyConfig, StepKey
from m27.step import Channel

__all__ = ["MOVE_HOLD_S", "GuestControl"]

#: How long a GPU a guest was moved to is kept from further moves while that step has not
#: asked again (it stops first: mdrun writes its checkpoint). Pending steps may still
#: take the GPU meanwhile; a step that never asks again (cancelled) holds it no longer.
MOVE_HOLD_S = 60.0


class GuestControl:
    """The agent's guest pausing; the attributes are the agent's own."""

    book: Book
    config: PolicyConfig
    gate_grace: float
    start_grace: float
    _channels: dict[StepKey, Channel]
    _stopped: set[StepKey]
    _paused_now: dict[StepKey, bool]
    #: guests without hints whose own utilization is low, and since when (see the module)
    _guest_low: dict[StepKey, float]
    #: the last time each paused guest was seen starting, in its own I/O or at its gate,
    #: let compute by its follow (its primary in I/O), or had its follow ended
    #: (m27.node.follow): it may compute from then on, so its ``gate_grace`` to reach its
    #: gate counts from that, not from when it was paused
    _let_compute: dict[StepKey, float]
    #: GPU -> (the guest moved there, when, until when no other guest is moved there)
    _moving: dict[int, tuple[StepKey, float, float]]
    #: the channel files of leases the agent took back, kept shut until the step's release
    _shut: dict[StepKey, tuple[Path, ...]]

    def _drop_channel(self, key: StepKey, taken_back: bool) -> None:
        """Close the channel of a lease that ended, and remove its files; but while the
        agent took the lease back (a move) and the step may still run, its gate is shut
        and the files stay until the step's own release. Without the file, a step not at
        its first gate yet found no channel, took itself for one run outside the agent
        and computed, ungated, on the GPU it was moved from."""
        ch = self._channels.pop(key, None)
        paths = self._shut.pop(key, ())
        if ch is not None:
            paths = (ch.path, ch.follow_path, ch.yield_path)
            if taken_back:
                ch.set_gate(False)  # also ends a follow of its primary's I/O
                self._shut[key] = paths
            ch.close()
            if taken_back:
                return
        for path in paths:
            path.unlink(missing_ok=True)

    def _move(self, a: Move, now: float) -> Event | None:
        """The lease of the guest `a` moves, taken back (the step stops, asks again and is
        granted the free GPU); None while an earlier move to that GPU has not landed: until
        its step asks again the GPU still looks idle, and each decision would move one
        more guest there, to be granted back as a guest elsewhere."""
        earlier = self._moving.get(a.to)
        if earlier is not None:
            key, at, until = earlier
            h = self.book.held.get(key)
            landed = key in self.book.requests or (h is not None and h.granted_at > at)
            if now < until and not landed:
                return None
        held = self.book.held.get(a.key)
        if held is None:
            return None
        self._moving[a.to] = (a.key, now, now + MOVE_HOLD_S)
        why = f"moved to GPU {a.to}, which is free"
        return LeaseReleased(now, a.key[0], a.key[1], held.gpus, reason=why)

    def _util(self, s: GpuSample, h: Held) -> float | None:
        raise NotImplementedError

    def _hints(self, key: StepKey) -> bool:
        raise NotImplementedError

    def _track_guests(self, samples: list[GpuSample], now: float) -> None:
        """Since when each guest that gives no hint shows low utilization of its own.

        The clock starts only while the guest may compute (a paused one shows none
        because it is paused) and is kept while it is paused (it has not computed since);
        a sample showing it compute, or no per-process figure, ends it. Primaries are
        followed too (the policy reads only the guests'): a background primary demoted in
        its own I/O keeps its time, as the simulator's phase does."""
        by_gpu = {s.index: s for s in samples}
        low = self._guest_low
        seen: set[StepKey] = set()
        for key, h in self.book.held.items():
            if not h.gpus or h.pid is None or self._hints(key):
                continue
            s = by_gpu.get(h.gpus[0])
            util = self._util(s, h) if s is not None else None
            if util is None or util >= self.config.io_util_threshold:
                continue
            if key in low:
                seen.add(key)
            elif not self._paused_now.get(key, h.paused) and key not in self._stopped:
                low[key] = now
                seen.add(key)
        for key in [k for k in low if k not in seen]:
            del low[key]

    def _lends(self, guest: Held, ch: Channel) -> bool:
        """Whether the guest's primary lets it compute now: inside ``io_wait()``, waiting
        for it at its gate (yield), or past the follow's deadline."""
        if ch.follow_due():
            return True
        prim = self.book.primaries().get(guest.gpus[0]) if guest.gpus else None
        pch = self._channels.get(prim.key) if prim is not None else None
        return pch is not None and (pch.io_waiting() or (pch.yielding() and ch.borrowing()))

    def _pause(self, key: StepKey, h: Held, now: float) -> str:
        ch = self._channels.get(key)
        if ch is not None and not ch.following():
            # a following gate is already shut while its primary computes, except for a
            # phase the primary yields to; the agent's follow pass, right after, re-sets
            # or closes it (m27.node.follow)
            ch.set_gate(False)
        gateless = ch is None or not ch.uses_gate()
        settled = h.started_at is not None and now - h.started_at >= self.gate_grace
        settled = settled and not self._starting(ch, h, now)
        may_stop = h.pid is not None and gateless and (settled or ch is None)
        may_stop = may_stop and key not in self._guest_low  # its I/O goes on (module doc)
        # in its own io_wait() (reading its input before its first gate call): its I/O
        # goes on; if it computes after it without reaching a gate, _escalate stops it
        may_stop = may_stop and not (ch is not None and ch.io_waiting())
        if may_stop and key not in self._stopped and proc.stop(h.pgid, h.pid):
            self._stopped.add(key)
            return "signal"
        return "signal" if key in self._stopped else "gate"

    def _starting(self, ch: Channel | None, h: Held, now: float) -> bool:
        young = h.started_at is not None and now - h.started_at < self.start_grace
        return young and ch is not None and ch.pid() is None

    def _resume(self, key: StepKey, h: Held) -> None:
        ch = self._channels.get(key)
        if ch is not None:
            ch.set_gate(True)
        if key in self._stopped:
            proc.cont(h.pgid, h.pid)
            self._stopped.discard(key)

    def _busy(self, h: Held, samples: list[GpuSample]) -> bool:
        for s in samples:
            if h.gpus and s.index == h.gpus[0]:
                util = self._util(s, h)
                return util is not None and util >= self.config.io_util_threshold
        return False

    def _escalate(self, now: float, acted: set[StepKey], samples: list[GpuSample]) -> list[Event]:
        """Stop by signal the paused guests that keep computing past ``gate_grace``."""
        out: list[Event] = []
        for key in [k for k in self._let_compute if k not in self.book.held]:
            del self._let_compute[key]
        for key, h in self.book.held.items():
            if not (h.guest and h.paused) or key in acted or key in self._stopped:
                continue
            if not liveness.alive(h.pid, h.pid_started):
                continue
            ch = self._channels.get(key)
            if ch is not None and (ch.at_gate() or ch.io_waiting()):
                # not computing now: when it leaves its I/O it gets gate_grace from here
                # to reach its gate (it was SIGSTOPped between the two before)
                self._let_compute[key] = now
                continue
            if ch is not None and ch.following() and self._lends(h, ch):
                self._let_compute[key] = now
                continue  # a following guest computes in its primary's I/O wait
            if self._starting(ch, h, now):
                self._let_compute[key] = now  # its grace counts from its channel's opening
                continue
            since = max(h.paused_at or 0.0, h.started_at or 0.0, self._let_compute.get(key, 0.0))
            # A guest that never used its gate and shows compute is stopped at once; a gate
            # user gets gate_grace to reach its gate (it may be between two gate calls).
            gateless_busy = (ch is None or not ch.uses_gate()) and self._busy(h, samples)
            if (now - since < self.gate_grace or key in self._guest_low) and not gateless_busy:
                continue
            if proc.stop(h.pgid, h.pid):
                self._stopped.add(key)
                gpu = h.gpus[0] if h.gpus else -1
                out.append(GuestPaused(at=now, run_id=key[0], step=key[1], gpu=gpu, how="signal"))
        return out
