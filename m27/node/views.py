"""What the policy sees of each GPU, from the agent's samples and its book.

Per GPU: memory, whether it is lost, its primary's own utilization and since when it has
been low (an I/O wait inferred without a hint), and the memory that processes m27 did not
start hold on it (:attr:`m27.policy.GpuView.foreign_memory`): another user's node, a
notebook, a job run by hand, which a GPU is then left to.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping

from m27.gpu import GpuSample
from m27.node.book import Book, Held
from m27.policy import OUTSIDE_MEMORY_MIN, GpuView, PolicyConfig, StepKey
from m27.step import Channel

#: seconds a step's process still counts as m27's after its lease ended (see _own_processes)
OWN_PROCESS_GRACE_S = 5.0


def foreign_memory(s: GpuSample, own: Callable[[int], bool]) -> int:
    """What the processes on the GPU of `s` that are not m27's own (`own(pid)` false) hold.
    NVML may not tell a process's memory (another user's, without privileges): then it is
    what the GPU holds beyond the memory of m27's own processes."""
    foreign, mine, unknown = 0, 0, False
    for p in s.processes:
        if own(p.pid):
            mine += p.memory_used or 0
        elif p.memory_used is None:
            unknown = True
        else:
            foreign += p.memory_used
    if unknown and s.memory_used is not None:
        foreign = max(foreign, s.memory_used - mine)
    return foreign


def outside_m27(samples: Iterable[GpuSample], held: Iterable[Held]) -> dict[int, int]:
    """Per GPU, the memory of processes m27 did not start, once it reaches
    :data:`~m27.policy.OUTSIDE_MEMORY_MIN` (else 0): what a command without the agent
    (`m27 queue`, `m27 gpus`) knows of another user's work. The steps of the leases the
    log holds (`held`, by pid or process group) are m27's own."""
    held = list(held)
    pids = {h.pid for h in held if h.pid is not None}
    groups = {h.pgid for h in held if h.pgid is not None}

    def own(pid: int) -> bool:
        if pid in pids:
            return True
        try:
            return os.getpgid(pid) in groups
        except OSError:
            return False

    out = {}
    for s in samples:
        memory = foreign_memory(s, own)
        out[s.index] = memory if memory >= OUTSIDE_MEMORY_MIN else 0
    return out


class ViewControl:
    """The agent's part that builds :class:`~m27.policy.GpuView` (a mixin of Agent)."""

    book: Book
    config: PolicyConfig
    _channels: Mapping[StepKey, Channel]
    _low: dict[int, tuple[StepKey, float]]
    _pgids: dict[int, int | None]
    _recent: dict[int, tuple[int | None, float]]
    _memory: dict[int, int]
    #: per GPU, what processes m27 did not start hold when it reaches OUTSIDE_MEMORY_MIN
    #: (else 0), for ``gpus.json``
    _foreign: dict[int, int]

    def _views(self, samples: list[GpuSample], now: float) -> list[GpuView]:
        primaries = self.book.primaries()
        mine = self._own_processes(now)
        views = []
        for s in samples:
            h = primaries.get(s.index)
            util = self._util(s, h) if h is not None and h.pid is not None else None
            since: float | None = None
            # a primary waiting at its gate for a guest's phase (yield) is no I/O wait:
            # the guest already computes, by the primary's leave
            ch = self._channels.get(h.key) if h is not None else None
            yielding = ch is not None and ch.yielding()
            low = util is not None and util < self.config.io_util_threshold and not yielding
            if h is not None and low:
                old = self._low.get(s.index)
                since = old[1] if old is not None and old[0] == h.key else now
                self._low[s.index] = (h.key, since)
            else:
                self._low.pop(s.index, None)
            total = s.memory_total or self._memory.get(s.index, 0)
            lost = s.lost or s.index in self.book.lost_gpus
            foreign = self._foreign_memory(s, mine)
            self._foreign[s.index] = foreign if foreign >= OUTSIDE_MEMORY_MIN else 0
            views.append(GpuView(s.index, total, s.memory_used, lost, util, since, foreign))
        return views

    def _foreign_memory(self, s: GpuSample, mine: tuple[set[int], set[int | None]]) -> int:
        """What processes m27 did not start hold on the GPU of `s` (see :func:`foreign_memory`)."""
        return foreign_memory(s, lambda pid: pid in mine[0] or self._pgid(pid) in mine[1])

    def _own_processes(self, now: float) -> tuple[set[int], set[int | None]]:
        """The pids and process groups of m27's steps: those that hold a lease, and for a
        few seconds those that just gave theirs back (a real GPU lists a process until
        its memory is freed); any other process on a GPU is someone else's work."""
        for h in self.book.held.values():
            if h.pid is not None:
                self._recent[h.pid] = (h.pgid, now)
        for pid, (_, seen) in list(self._recent.items()):
            if now - seen > OWN_PROCESS_GRACE_S:
                del self._recent[pid]
        return set(self._recent), {g for g, _ in self._recent.values()} - {None}

    def _util(self, s: GpuSample, h: Held) -> float | None:
        """The primary's own SM utilization on this GPU (its process group's processes)."""
        if s.utilization_gpu is None:
            return None
        total = 0.0
        for p in s.processes:
            if p.pid == h.pid or (h.pgid is not None and self._pgid(p.pid) == h.pgid):
                if p.sm_util is None:
                    return None
                total += p.sm_util
        return total

    def _pgid(self, pid: int) -> int | None:
        if pid not in self._pgids:
            try:
                self._pgids[pid] = os.getpgid(pid)
            except OSError:
                self._pgids[pid] = None
            if len(self._pgids) > 4096:
                self._pgids.clear()
        return self._pgids.get(pid)
