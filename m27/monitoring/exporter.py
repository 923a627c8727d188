"""The Prometheus exporter: GPU metrics from the backend, work metrics from the event log.

Everything is computed at scrape time by :class:`M27Collector`: a scrape makes one batched
sampling pass over the GPUs (:class:`Sampler`), advances the log's read model by the events
appended since the previous pass (never a replay), and turns both into metric families.
A background pass (``m27 exporter --interval``) keeps energy and idle accounting going
between scrapes; passes are serialized by one lock.

Between two passes the sampler also accounts

- the **GPU idle seconds while work was queued** (the waste m27 exists to remove): a GPU
  that was not lost, whose utilization was below ``idle_util`` percent (or, when unknown,
  that nobody held), while at least one ``gpu``/``gpu_light`` step waited for a lease at
  both ends of the interval;
- **energy per step**: each GPU's energy-counter delta shared among the steps holding it
  (:mod:`m27.monitoring.energy`),
  recorded as ``StepEnergyMeasured`` when a step's lease is released.

An interval longer than ``max_gap_s`` (nobody looked for a long time) is not accounted.
On simulated GPUs the exporter mirrors the running steps' processes onto its own
simulator, so their utilization follows the real processes as the agent's does.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from m27.clock import Clock, SystemClock
from m27.events import Event, StepEnergyMeasured
from m27.gpu import GpuBackend, GpuSample
from m27.monitoring._metrics import families
from m27.monitoring.energy import EnergyMeter, StepKey
from m27.monitoring.readmodel import ReadModel
from m27.store import EventStore

__all__ = [
    "DEFAULT_LISTEN",
    "M27Collector",
    "Sampler",
    "Snapshot",
    "build_registry",
]

DEFAULT_LISTEN = "127.0.0.1:9427"


@dataclass
class Snapshot:
    """One sampling pass: what the collector turns into metrics."""

    time: float
    samples: list[GpuSample]
    lost: set[int]
    #: pid -> the step it belongs to, for the per-process series.
    process_steps: dict[int, StepKey]
    idle_while_queued_s: dict[int, float]
    pass_seconds: float
    pending_energy: dict[StepKey, float] = field(default_factory=dict)


class Sampler:
    """Owns the GPU backend, the read model and the accounting between passes."""

    def __init__(
        self,
        backend: GpuBackend,
        store: EventStore,
        *,
        clock: Clock | None = None,
        node: str | None = None,
        record_energy: bool = True,
        idle_util: float = 5.0,
        max_gap_s: float = 60.0,
        read_model: ReadModel | None = None,
    ) -> None:
        self.backend = backend
        self.store = store
        self.clock = clock or SystemClock()
        self.node = node or socket.gethostname()
        self.record_energy = record_energy
        self.idle_util = idle_util
        self.max_gap_s = max_gap_s
        self.model = read_model or ReadModel(store)
        self.meter = EnergyMeter()
        self.lock = threading.RLock()
        self.devices = {d.index: d for d in backend.devices()}
        self._last_time: float | None = None
        self._queued_before = False
        self._holders_before: dict[int, set[StepKey]] = {}
        self._idle_s: dict[int, float] = dict.fromkeys(self.devices, 0.0)
        self._mirrored: set[tuple[int, int]] = set()
        self.last: Snapshot | None = None
        # The first pass folds the whole log once; scrapes then apply only what is new.
        self.model.refresh()
        self.model.drain_released()

    # --- one pass ---------------------------------------------------------------------

    def tick(self) -> Snapshot:
        """Sample every GPU, apply new events, account the interval since the last pass."""
        with self.lock:
            started = time.perf_counter()
            now = self.clock.now()
            self.model.refresh()
            self._mirror_sim()
            samples = self.backend.sample(now)
            state = self.model.state
            holders_now = self._holders()
            process_steps = self._process_steps(samples)
            queued_now = self._gpu_work_waiting()
            dt = None if self._last_time is None else now - self._last_time
            if dt is not None and 0.0 <= dt <= self.max_gap_s:
                self._account_idle(samples, holders_now, dt, queued_now)
            holders = {
                gpu: self._holders_before.get(gpu, set()) | holders_now.get(gpu, set())
                for gpu in self.devices
            }
            # After a long gap the counter's delta is nobody's: observe only to re-baseline.
            accounted = dt is not None and dt <= self.max_gap_s
            self.meter.observe(
                samples,
                {gpu: _shares(keys, samples, gpu, process_steps) for gpu, keys in holders.items()}
                if accounted
                else {},
            )
            self._record_released(now)
            self._last_time = now
            self._queued_before = queued_now
            self._holders_before = holders_now
            self.last = Snapshot(
                time=now,
                samples=samples,
                lost={s.index for s in samples if s.lost} | set(state.lost_gpus),
                process_steps=process_steps,
                idle_while_queued_s=dict(self._idle_s),
                pass_seconds=time.perf_counter() - started,
                pending_energy=self.meter.pending_all(),
            )
            return self.last

    def tick_if_stale(self, interval: float) -> None:
        """A background pass, skipped when a scrape made one less than `interval` ago."""
        with self.lock:
            if self._last_time is None or self.clock.now() - self._last_time >= interval:
                self.tick()

    def close(self) -> None:
        with self.lock:
            self.backend.close()

    # --- pieces of a pass -------------------------------------------------------------

    def _holders(self) -> dict[int, set[StepKey]]:
        """Steps holding each GPU now: their leases, and guests on another's GPU."""
        state = self.model.state
        out: dict[int, set[StepKey]] = {}
        for key, gpus in state.leases.items():
            for gpu in gpus:
                out.setdefault(gpu, set()).add(key)
        for key, gpu in state.guests.items():
            out.setdefault(gpu, set()).add(key)
        return out

    def _gpu_work_waiting(self) -> bool:
        return any(
            n > 0 and b.state == "queued" and not b.leased and b.type in ("gpu", "gpu_light")
            for b, n in self.model.step_counts.items()
        )

    def _account_idle(
        self,
        samples: list[GpuSample],
        holders: Mapping[int, set[StepKey]],
        dt: float,
        queued_now: bool,
    ) -> None:
        if not (self._queued_before and queued_now):
            return
        lost = self.model.state.lost_gpus
        for s in samples:
            if s.lost or s.index in lost:
                continue
            if s.utilization_gpu is not None:
                idle = s.utilization_gpu < self.idle_util
            else:
                idle = not holders.get(s.index)
            if idle:
                self._idle_s[s.index] = self._idle_s.get(s.index, 0.0) + dt

    def _process_steps(self, samples: list[GpuSample]) -> dict[int, StepKey]:
        """Which running step each GPU process belongs to (its pid, or its process group)."""
        by_pid: dict[int, StepKey] = {}
        by_pgid: dict[int, StepKey] = {}
        for key in self.model.running:
            step = self.model.state.step(*key)
            if step is None:
                continue
            if step.pid:
                by_pid[step.pid] = key
            if step.pgid:
                by_pgid[step.pgid] = key
        out: dict[int, StepKey] = {}
        for s in samples:
            for proc in s.processes:
                found = by_pid.get(proc.pid)
                if found is None and by_pgid:
                    with contextlib.suppress(OSError):
                        found = by_pgid.get(os.getpgid(proc.pid))
                if found is not None:
                    out[proc.pid] = found
        return out

    def _record_released(self, now: float) -> None:
        released = self.model.drain_released()
        events: list[Event] = []
        for run_id, step in released:
            for gpu, joules in sorted(self.meter.take((run_id, step)).items()):
                if joules > 0.0:
                    events.append(
                        StepEnergyMeasured(at=now, run_id=run_id, step=step, gpu=gpu, joules=joules)
                    )
        if events and self.record_energy:
            self.store.append(events)
            self.model.refresh()  # our own events, so per-step totals never dip
            self.model.drain_released()

    def _mirror_sim(self) -> None:
        """On simulated GPUs, attach the running steps' processes to the GPUs they hold."""
        attach = getattr(self.backend, "attach", None)
        detach = getattr(self.backend, "detach", None)
        if self.backend.kind != "sim" or attach is None or detach is None:
            return
        state = self.model.state
        wanted: dict[tuple[int, int], int] = {}
        for key in self.model.running:
            step = state.step(*key)
            if step is None or not step.pid:
                continue
            gpus = state.leases.get(key, step.gpus)
            if step.guest_gpu is not None:
                gpus = (step.guest_gpu,)
            for gpu in gpus:
                if gpu in self.devices:
                    wanted[(gpu, step.pid)] = step.gpu_memory
        for gpu, pid in self._mirrored - wanted.keys():
            detach(gpu, pid)
        for (gpu, pid), memory in wanted.items():
            if (gpu, pid) not in self._mirrored:
                attach(gpu, pid, memory)
        self._mirrored = set(wanted)


def _shares(
    keys: set[StepKey], samples: list[GpuSample], gpu: int, process_steps: Mapping[int, StepKey]
) -> dict[StepKey, float | None]:
    """Each holder's SM utilization on `gpu` (the sum over its processes; 0 if none ran)."""
    shares: dict[StepKey, float | None] = dict.fromkeys(keys, 0.0)
    sample = next((s for s in samples if s.index == gpu), None)
    if sample is None:
        return shares
    for proc in sample.processes:
        key = process_steps.get(proc.pid)
        if key not in shares:
            continue
        value = shares[key]
        shares[key] = None if value is None or proc.sm_util is None else value + proc.sm_util
    return shares


class M27Collector(Collector):
    """A prometheus-client collector whose every scrape is one sampling pass."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def collect(self) -> Iterator[Metric]:
        with self.sampler.lock:
            snapshot = self.sampler.tick()
            metrics = list(families(self.sampler, snapshot))
        yield from metrics


def build_registry(sampler: Sampler) -> CollectorRegistry:
    """A fresh registry holding only m27's collector (no process or platform metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(M27Collector(sampler))
    return registry
