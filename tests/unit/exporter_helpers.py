"""Building blocks for the exporter tests: a node with simulated GPUs, a log and a clock."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from m27 import events as ev
from m27.clock import FakeClock
from m27.events.state import RunState
from m27.gpu import GpuBackend, GpuInfo, GpuSample
from m27.gpu.sim import SimBackend
from m27.monitoring.exporter import Sampler, build_registry
from m27.monitoring.readmodel import ReadModel
from m27.store.memory import MemoryEventStore

NODE = "node-a"
T0 = 1_700_000_000.0


@dataclass
class Node:
    store: MemoryEventStore
    clock: FakeClock
    backend: GpuBackend
    sampler: Sampler
    registry: CollectorRegistry
    intervals: dict[str, dict[str, float]] = field(default_factory=dict)

    def append(self, *events: ev.Event) -> None:
        self.store.append(list(events))

    def scrape(self) -> None:
        """One scrape (a collect of every family), as Prometheus would do it."""
        list(self.registry.collect())

    def value(self, name: str, **labels: str) -> float | None:
        """A metric's value in a fresh scrape (None: no such series)."""
        return self.registry.get_sample_value(name, labels)

    def gpu(self, index: int) -> dict[str, str]:
        uuid = f"GPU-sim-{index:04d}"
        return {
            "gpu": str(index),
            "uuid": uuid,
            "model": "m27 simulated GPU (80 GiB)",
            "node": NODE,
        }


class FixedBackend:
    """A backend that returns the samples a test gives it."""

    kind = "fixed"

    def __init__(self, samples: list[GpuSample]) -> None:
        self.samples = samples

    def devices(self) -> list[GpuInfo]:
        return [GpuInfo(s.index, s.uuid, s.name, s.memory_total) for s in self.samples]

    def sample(self, now: float) -> list[GpuSample]:
        return self.samples

    def close(self) -> None:
        pass


def make_node(gpus: int = 2, backend: GpuBackend | None = None) -> Node:
    store = MemoryEventStore()
    clock = FakeClock(T0)
    intervals: dict[str, dict[str, float]] = {}

    def lookup(run: RunState) -> Mapping[str, float]:
        return intervals.get(run.run_id, {})

    backend = backend or SimBackend(gpus)
    model = ReadModel(store, intervals=lookup)
    sampler = Sampler(backend, store, clock=clock, node=NODE, read_model=model)
    return Node(store, clock, backend, sampler, build_registry(sampler), intervals)


def submitted(run: str = "r1", steps: tuple[str, ...] = ("prep", "md"), at: float = T0) -> ev.Event:
    return ev.RunSubmitted(at=at, run_id=run, pipeline="md", spec_path="md.yaml", steps=steps)


def queued(run: str, step: str, at: float, type: str = "gpu") -> ev.Event:
    return ev.StepQueued(at=at, run_id=run, step=step, type=type, gpus=1 if type != "cpu" else 0)


def granted(
    run: str, step: str, at: float, gpus: tuple[int, ...] = (0,), tier: str = "immediate"
) -> ev.Event:
    return ev.LeaseGranted(at=at, run_id=run, step=step, gpus=gpus, tier=tier)


def started(
    run: str, step: str, at: float, gpus: tuple[int, ...] = (0,), pid: int | None = None
) -> ev.Event:
    pid = os.getpid() if pid is None else pid
    return ev.StepStarted(
        at=at, run_id=run, step=step, attempt=1, pid=pid, pgid=pid, command=("x",), gpus=gpus
    )
