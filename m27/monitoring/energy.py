"""Energy per step: GPU energy-counter deltas shared out among the steps holding each GPU.

NVML's total-energy counter (``GpuSample.energy_j``) is the only first-hand measurement a
GPU gives; m27 turns it into joules per step without guessing:

- the energy of an interval is the counter's delta between two samples of one GPU;
- it goes to the steps that held that GPU during the interval (their leases, and guests),
  split by their per-process SM utilization, or equally when a share is unknown or all
  are zero (a step that holds a GPU while it waits on I/O still keeps it from others);
- an interval with no holder is nobody's (idle energy), and a counter that went back
  (driver reload, GPU reset) or is unknown yields nothing rather than a made-up number.

:func:`apportion` is the pure rule; :class:`EnergyMeter` applies it pass after pass and
hands out each step's total when its lease ends (the exporter records it then as
``StepEnergyMeasured``). :func:`energy_by_step` reads the recorded totals back from a
projection for ``m27 status`` and run summaries.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Iterable, Mapping
from typing import TypeVar

from m27._exceptions import M27Error
from m27.events.state import NodeState
from m27.gpu import GpuSample

__all__ = [
    "EnergyMeter",
    "StepKey",
    "apportion",
    "energy_by_run",
    "energy_by_step",
    "format_energy",
    "report_flops",
]

K = TypeVar("K", bound=Hashable)

#: (run id, step name)
StepKey = tuple[str, str]


def apportion(joules: float, shares: Mapping[K, float | None]) -> dict[K, float]:
    """Split `joules` among the keys of `shares` in proportion to their utilization.

    Equal split when any share is unknown (``None``) or all are zero: holding a GPU is
    what kept others off it. Negative or non-finite inputs count as nothing.
    """
    if not shares or not joules > 0.0 or joules == float("inf"):
        return {}
    values = list(shares.values())
    known = [v for v in values if v is not None]
    if len(known) == len(values):
        weights = [max(0.0, v) if v == v else 0.0 for v in known]  # v == v: not NaN
        total = sum(weights)
        if total > 0.0:
            # w / total first: `joules * w` of a subnormal share rounds (1.5 * 5e-324 is
            # 1e-323), and the shares then summed to 2.0 J of a 1.5 J interval
            return {k: joules * (w / total) for k, w in zip(shares, weights, strict=True)}
    each = joules / len(shares)
    return dict.fromkeys(shares, each)


class EnergyMeter:
    """Follows each GPU's energy counter and accumulates joules per (step, GPU).

    Call :meth:`observe` once per sampling pass with the steps that held each GPU since
    the previous pass; :meth:`take` hands out (and forgets) a step's totals when its lease
    ends. Not thread-safe: one sampler owns it.
    """

    def __init__(self) -> None:
        self._last: dict[int, float] = {}
        self._pending: dict[StepKey, dict[int, float]] = {}

    def observe(
        self,
        samples: Iterable[GpuSample],
        holders: Mapping[int, Mapping[StepKey, float | None]],
    ) -> dict[int, float]:
        """Account one pass; returns the joules each GPU used since its previous sample.

        ``holders[gpu]`` maps each step that held ``gpu`` during the interval to its SM
        utilization (``None`` when unknown).
        """
        used: dict[int, float] = {}
        for sample in samples:
            if sample.lost or sample.energy_j is None:
                self._last.pop(sample.index, None)
                continue
            previous = self._last.get(sample.index)
            self._last[sample.index] = sample.energy_j
            if previous is None or sample.energy_j < previous:
                continue  # first sight, or the counter was reset: no interval to share
            delta = sample.energy_j - previous
            used[sample.index] = delta
            for key, joules in apportion(delta, holders.get(sample.index, {})).items():
                per_gpu = self._pending.setdefault(key, {})
                per_gpu[sample.index] = per_gpu.get(sample.index, 0.0) + joules
        return used

    def pending(self, key: StepKey) -> float:
        """Joules accounted to `key` and not yet taken (its lease is still held)."""
        return sum(self._pending.get(key, {}).values())

    def pending_all(self) -> dict[StepKey, float]:
        return {key: sum(per_gpu.values()) for key, per_gpu in self._pending.items()}

    def take(self, key: StepKey) -> dict[int, float]:
        """The joules `key` used on each GPU since it was last taken; forgets them."""
        return self._pending.pop(key, {})


def energy_by_step(state: NodeState) -> dict[StepKey, float]:
    """Recorded joules per (run, step), for every step with a measurement."""
    return {
        (run.run_id, step.name): step.energy_j
        for run in state.runs.values()
        for step in run.steps.values()
        if step.energy_j > 0.0
    }


def energy_by_run(state: NodeState) -> dict[str, float]:
    """Recorded joules per run (the sum over its steps), for runs with a measurement."""
    totals: dict[str, float] = {}
    for (run_id, _), joules in energy_by_step(state).items():
        totals[run_id] = totals.get(run_id, 0.0) + joules
    return totals


def format_energy(joules: float) -> str:
    """``850 J``, ``12.3 kJ``, ``4.56 MJ``; above 3.6 MJ the kWh figure is added."""
    if joules < 1000:
        text = f"{joules:.0f} J"
    elif joules < 1e6:
        text = f"{joules / 1e3:.1f} kJ"
    else:
        text = f"{joules / 1e6:.2f} MJ"
    if joules >= 3.6e6:
        text += f" ({joules / 3.6e6:.2f} kWh)"
    return text


def report_flops(flops: float, *, at: float | None = None) -> None:
    """Record that this step did `flops` floating-point operations (adds up over calls).

    Called from inside a step started by m27 (it reads ``M27_RUN_ID``, ``M27_STEP`` and
    ``M27_HOME``); the Energy board divides them by the step's joules into TFLOPS/W.
    """
    import time

    from m27.config import m27_home
    from m27.events import StepFlopsReported
    from m27.store.sqlite import SqliteEventStore

    run_id, step = os.environ.get("M27_RUN_ID", ""), os.environ.get("M27_STEP", "")
    if not run_id or not step:
        raise M27Error("report_flops() works inside a step started by m27 (no M27_RUN_ID)")
    if not flops >= 0.0:
        raise M27Error(f"report_flops() needs a count >= 0, got {flops!r}", flops=flops)
    store = SqliteEventStore(m27_home() / "events.db")
    try:
        now = time.time() if at is None else at
        store.append([StepFlopsReported(at=now, run_id=run_id, step=step, flops=float(flops))])
    finally:
        store.close()
