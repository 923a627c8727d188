"""Trace replay on a virtual clock, through the real :mod:`m27.policy`.

``compare(trace, policies)`` runs each policy on the same trace and returns the results
with their metrics; ``m27 simulate`` is a thin command over it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from m27.policy import PolicyConfig
from m27.sim.engine import SimResult, SimulationError, simulate
from m27.sim.metrics import Metrics, compute_metrics
from m27.sim.schedulers import POLICIES, make_scheduler
from m27.sim.trace import Job, Trace, load_trace, save_trace

__all__ = [
    "POLICIES",
    "Job",
    "Metrics",
    "SimResult",
    "SimulationError",
    "Trace",
    "compare",
    "compute_metrics",
    "load_trace",
    "make_scheduler",
    "save_trace",
    "simulate",
]


def compare(
    trace: Trace,
    policies: Sequence[str] = POLICIES,
    *,
    gpus: int | None = None,
    config: PolicyConfig | None = None,
    window: float | None = None,
    on_policy: Callable[[str, int], None] | None = None,
) -> list[tuple[SimResult, Metrics]]:
    """Every policy on the same trace, in the order given; `on_policy(name, i)` before
    the i-th (from 1), for a progress line: a large trace takes a minute."""
    out = []
    for i, name in enumerate(policies, 1):
        if on_policy is not None:
            on_policy(name, i)
        result = simulate(trace, make_scheduler(name, config), gpus)
        out.append((result, compute_metrics(result, window)))
    return out
