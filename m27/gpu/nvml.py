"""The NVML backend: a thin wrapper around nvidia-ml-py (the only module that imports pynvml).

Promises, in the spirit of nvitop:

- every field is read in its own ``try``; an ``NVMLError`` makes that field ``None``
  ("unknown") and never stops the pass;
- ``GpuIsLost`` on any call, or a device whose handle cannot be obtained, marks that GPU
  ``lost`` for the rest of the backend's life (a GPU that fell off the bus needs a reset,
  and a flapping GPU must not flap the agent's events); the other GPUs are still sampled;
- one ``sample()`` is one pass over every device; per-process utilization is read since
  the last pass's NVML timestamp, kept per device, and averaged over the samples in it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

import pynvml

from m27._exceptions import GpuError
from m27.gpu import BackendBase, GpuInfo, GpuSample, ProcessSample

__all__ = ["NvmlBackend"]

# (name in GpuSample.throttle_reasons, suffix of pynvml's nvmlClocksEventReason* or
# nvmlClocksThrottleReason* constant). Looked up on the module so old and new pynvml work.
_REASONS = (
    ("gpu_idle", "GpuIdle"),
    ("applications_clocks", "ApplicationsClocksSetting"),
    ("sw_power_cap", "SwPowerCap"),
    ("hw_slowdown", "HwSlowdown"),
    ("sync_boost", "SyncBoost"),
    ("sw_thermal", "SwThermalSlowdown"),
    ("hw_thermal", "HwThermalSlowdown"),
    ("hw_power_brake", "HwPowerBrakeSlowdown"),
    ("display_clocks", "DisplayClockSetting"),
    ("board_limit", "BoardLimit"),
    ("reliability", "Reliability"),
)


class _Lost(Exception):
    """Internal: the device answered GpuIsLost; the pass for this device stops."""


class NvmlBackend(BackendBase):
    """GPUs of this node through NVML. ``nvml`` is the pynvml module (tests pass a fake)."""

    kind = "nvml"
    label = "NVML"

    def __init__(self, nvml: Any = None) -> None:
        nvml = pynvml if nvml is None else nvml
        self._nvml = nvml
        super().__init__()
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise GpuError(str(exc) or type(exc).__name__) from exc
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            self._shutdown()
            raise GpuError(f"cannot count GPUs: {exc}") from exc
        self._handles: list[Any | None] = []
        self._lost: list[bool] = []
        self._last_seen: list[int] = [0] * count
        infos: list[GpuInfo] = []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError:
                # GpuIsLost, "Unknown Error" or no permission: the GPU is counted but unusable.
                self._handles.append(None)
                self._lost.append(True)
                infos.append(GpuInfo(index, None, None, None))
                continue
            self._handles.append(handle)
            self._lost.append(False)
            try:
                uuid = self._text(self._field(nvml.nvmlDeviceGetUUID, handle))
                name = self._text(self._field(nvml.nvmlDeviceGetName, handle))
                memory = self._field(nvml.nvmlDeviceGetMemoryInfo, handle)
            except _Lost:
                self._lost[index] = True
                infos.append(GpuInfo(index, None, None, None))
                continue
            total = int(memory.total) if memory is not None else None
            infos.append(GpuInfo(index, uuid, name, total))
        self._infos = infos
        self._reasons_fn: Callable[[Any], int] | None = getattr(
            nvml, "nvmlDeviceGetCurrentClocksEventReasons", None
        ) or getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        self._reason_bits = self._reason_table()

    def devices(self) -> list[GpuInfo]:
        return list(self._infos)

    def _sample_all(self, now: float) -> list[GpuSample]:
        return [self._sample_one(info, now) for info in self._infos]

    def near_cpus(self, index: int) -> tuple[int, ...] | None:
        """The logical CPUs NVML names nearest GPU `index` (its NUMA node's), or None when
        it cannot say (a lost GPU, a driver without the call): m27.gpu.cpus splits the
        node's cores among the GPUs near them."""
        handle = self._handles[index] if 0 <= index < len(self._handles) else None
        fn = getattr(self._nvml, "nvmlDeviceGetCpuAffinity", None)
        if handle is None or fn is None:
            return None
        words = ((os.cpu_count() or 1) + 63) // 64
        with self._lock:
            try:
                mask = self._field(fn, handle, words)
            except _Lost:
                return None
        if mask is None:
            return None
        cpus = tuple(
            64 * w + bit for w, word in enumerate(mask) for bit in range(64) if int(word) >> bit & 1
        )
        return cpus or None

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._shutdown()

    # -- one device -------------------------------------------------------------------

    def _sample_one(self, info: GpuInfo, now: float) -> GpuSample:
        lost = GpuSample(info.index, info.uuid, info.name, now, lost=True)
        handle = self._handles[info.index]
        if self._lost[info.index] or handle is None:
            return lost
        nvml = self._nvml
        try:
            memory = self._field(nvml.nvmlDeviceGetMemoryInfo, handle)
            rates = self._field(nvml.nvmlDeviceGetUtilizationRates, handle)
            temperature = self._field(
                nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
            )
            power_mw = self._field(nvml.nvmlDeviceGetPowerUsage, handle)
            energy_mj = self._field(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
            clock = self._field(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM)
            reasons = self._field(self._reasons_fn, handle) if self._reasons_fn else None
            processes = self._processes(info.index, handle)
        except _Lost:
            self._lost[info.index] = True
            return lost
        return GpuSample(
            index=info.index,
            uuid=info.uuid,
            name=info.name,
            time=now,
            utilization_gpu=_num(rates, "gpu"),
            utilization_memory=_num(rates, "memory"),
            memory_used=_int(memory, "used"),
            memory_total=_int(memory, "total") or info.memory_total,
            temperature_c=None if temperature is None else float(temperature),
            power_w=None if power_mw is None else float(power_mw) / 1000.0,
            energy_j=None if energy_mj is None else float(energy_mj) / 1000.0,
            sm_clock_mhz=None if clock is None else float(clock),
            throttle_reasons=None if reasons is None else self._decode_reasons(int(reasons)),
            processes=processes,
        )

    def _processes(self, index: int, handle: Any) -> tuple[ProcessSample, ...]:
        nvml = self._nvml
        running = self._field(nvml.nvmlDeviceGetComputeRunningProcesses, handle)
        memory: dict[int, int | None] = {}
        for proc in running or ():
            used = getattr(proc, "usedGpuMemory", None)
            memory[int(proc.pid)] = None if used is None else int(used)
        utils = self._process_utilization(index, handle)
        pids = sorted(set(memory) | set(utils or ()))
        return tuple(
            ProcessSample(
                pid=pid,
                memory_used=memory.get(pid),
                # NVML lists only processes that ran kernels since the timestamp: a process
                # absent from a successful answer was idle (0 %), not unknown.
                sm_util=None if utils is None else utils.get(pid, 0.0),
            )
            for pid in pids
        )

    def _process_utilization(self, index: int, handle: Any) -> dict[int, float] | None:
        nvml = self._nvml
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, self._last_seen[index])
        except nvml.NVMLError_GpuIsLost as exc:
            raise _Lost from exc
        except nvml.NVMLError_NotFound:
            return {}  # no process ran on the GPU since the last pass
        except nvml.NVMLError:
            return None
        sums: dict[int, list[float]] = {}
        for item in samples:
            sums.setdefault(int(item.pid), []).append(float(item.smUtil))
            self._last_seen[index] = max(self._last_seen[index], int(item.timeStamp))
        return {pid: sum(values) / len(values) for pid, values in sums.items()}

    # -- helpers ----------------------------------------------------------------------

    def _field(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args), or None when NVML cannot answer; _Lost when the GPU is gone."""
        try:
            return fn(*args)
        except self._nvml.NVMLError_GpuIsLost as exc:
            raise _Lost from exc
        except self._nvml.NVMLError:
            return None

    @staticmethod
    def _text(value: Any) -> str | None:
        if value is None:
            return None
        return value.decode() if isinstance(value, bytes) else str(value)

    def _reason_table(self) -> list[tuple[str, int]]:
        table = []
        for name, suffix in _REASONS:
            bit = getattr(self._nvml, f"nvmlClocksEventReason{suffix}", None)
            if bit is None:
                bit = getattr(self._nvml, f"nvmlClocksThrottleReason{suffix}", None)
            if bit:
                table.append((name, int(bit)))
        return table

    def _decode_reasons(self, mask: int) -> frozenset[str]:
        return frozenset(name for name, bit in self._reason_bits if mask & bit)

    def _shutdown(self) -> None:
        # an error here means the driver went away: nothing is left to release
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


def _num(obj: Any, attr: str) -> float | None:
    value = getattr(obj, attr, None) if obj is not None else None
    return None if value is None else float(value)


def _int(obj: Any, attr: str) -> int | None:
    value = getattr(obj, attr, None) if obj is not None else None
    return None if value is None else int(value)
