"""The most GPU memory each leased step held, from the samples, recorded at release.

A step that declares no ``gpu_memory`` can still be a guest next time: the agent keeps,
per lease and GPU, the largest per-process memory its process group showed (NVML
per-process memory; the simulated backend's modelled use) and appends
``StepMemoryMeasured`` when the lease is released. The book folds it per pipeline step
name (:attr:`m27.node.book.Book.memory_peaks`), and the policy admits the next run of
that step by it (:attr:`m27.policy.Pending.memory_peak`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from m27.events import StepMemoryMeasured
from m27.gpu import GpuSample
from m27.node.book import Held
from m27.policy import StepKey

__all__ = ["PeakMemory"]


class PeakMemory:
    def __init__(self) -> None:
        self._peak: dict[StepKey, dict[int, int]] = {}

    def observe(
        self,
        samples: Iterable[GpuSample],
        held: Mapping[StepKey, Held],
        pgid_of: Callable[[int], int | None],
    ) -> None:
        """Fold one sampling pass in: each GPU lease's processes' memory on its GPUs."""
        owners: dict[int, list[Held]] = {}
        for h in held.values():
            if h.pid is not None:
                for g in h.gpus:
                    owners.setdefault(g, []).append(h)
        for s in samples:
            leases = owners.get(s.index)
            if not leases or not s.processes:
                continue
            for h in leases:
                total = 0
                for p in s.processes:
                    if p.memory_used and (
                        p.pid == h.pid or (h.pgid is not None and pgid_of(p.pid) == h.pgid)
                    ):
                        total += p.memory_used
                if total > 0:
                    per_gpu = self._peak.setdefault(h.key, {})
                    per_gpu[s.index] = max(per_gpu.get(s.index, 0), total)

    def released(self, key: StepKey, at: float) -> list[StepMemoryMeasured]:
        """The events that record a released lease's peaks (none if nothing was seen)."""
        run_id, step = key
        return [
            StepMemoryMeasured(at=at, run_id=run_id, step=step, gpu=g, peak_bytes=peak)
            for g, peak in sorted(self._peak.pop(key, {}).items())
        ]
