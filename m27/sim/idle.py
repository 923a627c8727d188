"""Why a GPU sat idle while GPU work waited: the simulator, instrumented.

:func:`idle_reasons` replays a trace like :func:`m27.sim.simulate` and, between any two
instants, puts each GPU that computes nothing while GPU work waits (a pending GPU step, or
a paused guest anywhere) in one bucket:

- ``free, reserved``: no primary, held for a multi-GPU step;
- ``free, only guests elsewhere wait``: no primary and nothing pending: the waiting work
  is loaded as guests on other GPUs and cannot move here;
- ``free, pending does not start``: no primary, steps pending, none started (the rule
  that kept them out is the policy's, e.g. fifo order);
- ``primary in I/O, no guest``: the primary waits on I/O and nobody is loaded beside it
  (split by why no guest was admitted: ``slots full`` cannot happen here, so: ``no
  candidate fits`` / ``reserved`` / ``background primary`` / ``multi-GPU primary``);
- ``primary in I/O, guests in their own I/O``: every guest is itself waiting on I/O;
- ``primary in I/O, guests paused``: guests could compute but are held (I/O not yet
  inferred, or another rule);
- ``primary in I/O, guest computing elsewhere``: cannot happen (a guest is on one GPU);

``python -m m27.sim.idle lab:seed=0,load=1.3`` prints the table for m27.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Sequence

from m27.policy import Action
from m27.sim.engine import Scheduler, _Engine
from m27.sim.trace import Trace

__all__ = ["idle_reasons"]


class _Tracked(_Engine):
    def __init__(self, trace: Trace, scheduler: Scheduler, gpus: int) -> None:
        super().__init__(trace, scheduler, gpus)
        self.reasons: dict[str, float] = defaultdict(float)
        self._last: tuple[float, list[str]] | None = None
        self._reserved: set[int] = set()

    def track_queue(self, now: float, closing: bool = False) -> None:
        super().track_queue(now, closing)
        hi = self.st.trace.window or float("inf")
        if self._last is not None:
            t0, buckets = self._last
            for b in buckets:
                self.reasons[b] += max(0.0, min(now, hi) - min(t0, hi))
        self._last = None if closing else (now, self._classify())

    def _classify(self) -> list[str]:
        st = self.st
        pending = [lv for lv in st.pending.values() if lv.job.type != "cpu"]
        paused = any(st.running[g].paused for gs in st.guests for g in gs)
        if not pending and not paused:
            return []
        out = []
        for g in range(st.gpus):
            prim_id = st.primary[g]
            guests = [st.running[x] for x in st.guests[g]]
            if prim_id is None:
                if any(not x.paused and not x.in_io for x in guests):
                    continue  # a guest computes alone on a GPU held for a reservation
                if g in self._reserved:
                    out.append("free, reserved for a multi-GPU step")
                elif not pending:
                    out.append("free, only guests on other GPUs wait")
                else:
                    out.append("free, pending steps not started")
                continue
            prim = st.running[prim_id]
            if not prim.in_io:
                continue
            computing = [x for x in guests if not x.paused and not x.in_io]
            if computing:
                continue
            if not guests:
                if prim.tier == "background":
                    why = "background primary"
                elif len(prim.gpus) > 1:
                    why = "multi-GPU primary"
                elif g in self._reserved:
                    why = "reserved"
                elif not pending:
                    why = "nothing pending"
                else:
                    why = "no pending step admitted"
                out.append(f"primary in I/O, no guest ({why})")
            elif all(x.in_io for x in guests if not x.paused) and any(not x.paused for x in guests):
                out.append("primary in I/O, the running guest in its own I/O")
            else:
                out.append("primary in I/O, guests paused")
        return out

    def apply(self, actions: Sequence[Action], now: float) -> bool:
        from m27.policy import Reserve

        reserves = [a for a in actions if isinstance(a, Reserve)]
        if reserves or any(not isinstance(a, Reserve) for a in actions):
            self._reserved = {g for a in reserves for g in a.gpus}
        return super().apply(actions, now)


def idle_reasons(trace: Trace, scheduler: Scheduler) -> dict[str, float]:
    """GPU-seconds idle while work waited, by reason (see the module docstring)."""
    eng = _Tracked(trace, scheduler, trace.gpus)
    eng.run()
    return dict(sorted(eng.reasons.items(), key=lambda kv: -kv[1]))


def _main(argv: list[str]) -> int:
    from m27.sim.lab import lab_week
    from m27.sim.schedulers import make_scheduler

    opts = dict(kv.split("=") for kv in argv[0].partition(":")[2].split(",") if kv)
    trace = lab_week(seed=int(opts.get("seed", 0)), load=float(opts.get("load", 1.0)))
    policy = argv[1] if len(argv) > 1 else "m27"
    from m27.policy import PolicyConfig

    slots = int(argv[2]) if len(argv) > 2 else PolicyConfig().guests_per_gpu
    reasons = idle_reasons(trace, make_scheduler(policy, PolicyConfig(guests_per_gpu=slots)))
    total = trace.gpus * (trace.window or 1.0)
    print(f"{trace.name}, {policy}: GPU time idle while work waited, by reason")
    for why, s in reasons.items():
        print(f"  {100 * s / total:5.2f} %  {why}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
