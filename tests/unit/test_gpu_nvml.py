"""NvmlBackend against a fake pynvml module (this machine has no GPU).

The fake raises the real pynvml exception classes, so the wrapper's error handling is
tested against what NVML really throws.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from m27._exceptions import GpuError
from m27.gpu.nvml import NvmlBackend

GiB = 1024**3


class FakeDevice:
    """One fake GPU; tests flip its fields between passes."""

    def __init__(self, index: int) -> None:
        self.uuid = f"GPU-fake-{index}".encode()  # pynvml returns bytes or str by version
        self.name = "NVIDIA Fake H100"
        self.memory_total = 80 * GiB
        self.memory_used = 2 * GiB
        self.util = (55, 20)
        self.temperature = 61
        self.power_mw = 250_500
        self.energy_mj = 1_234_567
        self.sm_clock = 1755
        self.reasons = 0
        self.processes: list[tuple[int, int | None]] = [(4242, 1 * GiB)]
        self.util_samples: list[tuple[int, int, int]] = []  # (pid, timestamp us, sm util)
        self.unsupported: set[str] = set()
        self.failing: dict[str, type[pynvml.NVMLError]] = {}
        self.lost = False
        self.util_timestamps: list[int] = []
        self.near: list[int] = [0, 1, 2, 3, 64, 65]  # the cores of its NUMA node


class FakeNvml:
    """Just enough of the pynvml module; constants and exceptions are the real ones."""

    def __init__(self, count: int = 2, *, init_error: type[pynvml.NVMLError] | None = None):
        self.devices = [FakeDevice(i) for i in range(count)]
        self.init_error = init_error
        self.handle_errors: dict[int, type[pynvml.NVMLError]] = {}
        self.inits = 0
        self.shutdowns = 0
        self.shutdown_error: type[pynvml.NVMLError] | None = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("NVML", "nvmlClocks")):
            return getattr(pynvml, name)
        raise AttributeError(name)

    # -- library ----------------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error()
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1
        if self.shutdown_error is not None:
            raise self.shutdown_error()

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        if index in self.handle_errors:
            raise self.handle_errors[index]()
        return self.devices[index]

    # -- per device -------------------------------------------------------------------

    def _enter(self, dev: FakeDevice, fn: str) -> None:
        if dev.lost:
            raise pynvml.NVMLError_GpuIsLost()
        if fn in dev.unsupported:
            raise pynvml.NVMLError_NotSupported()
        if fn in dev.failing:
            raise dev.failing[fn]()

    def nvmlDeviceGetUUID(self, dev: FakeDevice) -> bytes:
        self._enter(dev, "uuid")
        return dev.uuid

    def nvmlDeviceGetName(self, dev: FakeDevice) -> str:
        self._enter(dev, "name")
        return dev.name

    def nvmlDeviceGetMemoryInfo(self, dev: FakeDevice) -> SimpleNamespace:
        self._enter(dev, "memory")
        free = dev.memory_total - dev.memory_used
        return SimpleNamespace(total=dev.memory_total, used=dev.memory_used, free=free)

    def nvmlDeviceGetUtilizationRates(self, dev: FakeDevice) -> SimpleNamespace:
        self._enter(dev, "utilization")
        return SimpleNamespace(gpu=dev.util[0], memory=dev.util[1])

    def nvmlDeviceGetTemperature(self, dev: FakeDevice, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        self._enter(dev, "temperature")
        return dev.temperature

    def nvmlDeviceGetPowerUsage(self, dev: FakeDevice) -> int:
        self._enter(dev, "power")
        return dev.power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, dev: FakeDevice) -> int:
        self._enter(dev, "energy")
        return dev.energy_mj

    def nvmlDeviceGetClockInfo(self, dev: FakeDevice, clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_SM
        self._enter(dev, "clock")
        return dev.sm_clock

    def nvmlDeviceGetCpuAffinity(self, dev: FakeDevice, words: int) -> list[int]:
        """NVML's mask: `words` 64-bit words, bit j of word i for CPU 64 * i + j."""
        self._enter(dev, "affinity")
        mask = [0] * words
        for cpu in dev.near:
            if cpu // 64 < words:
                mask[cpu // 64] |= 1 << (cpu % 64)
        return mask

    def nvmlDeviceGetCurrentClocksEventReasons(self, dev: FakeDevice) -> int:
        self._enter(dev, "reasons")
        return dev.reasons

    def nvmlDeviceGetComputeRunningProcesses(self, dev: FakeDevice) -> list[SimpleNamespace]:
        self._enter(dev, "processes")
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in dev.processes]

    def nvmlDeviceGetProcessUtilization(self, dev: FakeDevice, ts: int) -> list[SimpleNamespace]:
        self._enter(dev, "process_utilization")
        dev.util_timestamps.append(ts)
        fresh = [
            SimpleNamespace(pid=pid, timeStamp=t, smUtil=sm, memUtil=0, encUtil=0, decUtil=0)
            for pid, t, sm in dev.util_samples
            if t > ts
        ]
        if not fresh:
            raise pynvml.NVMLError_NotFound()
        return fresh


class OldFakeNvml(FakeNvml):
    """A pynvml from before the ClocksEvent rename: only the ThrottleReasons spelling."""

    def __getattr__(self, name: str) -> Any:
        if name == "nvmlDeviceGetCurrentClocksThrottleReasons":
            return self._throttle
        return super().__getattr__(name)

    def _throttle(self, dev: FakeDevice) -> int:
        return dev.reasons

    nvmlDeviceGetCurrentClocksEventReasons = None  # type: ignore[assignment]


# -- opening ------------------------------------------------------------------------------


def test_init_failure_becomes_gpu_error_with_nvml_reason() -> None:
    fake = FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound)
    with pytest.raises(GpuError, match="NVML Shared Library Not Found"):
        NvmlBackend(nvml=fake)


def test_devices_report_identity_and_memory_with_uuid_decoded() -> None:
    backend = NvmlBackend(nvml=FakeNvml(2))
    infos = backend.devices()
    assert [(i.index, i.uuid, i.name, i.memory_total) for i in infos] == [
        (0, "GPU-fake-0", "NVIDIA Fake H100", 80 * GiB),
        (1, "GPU-fake-1", "NVIDIA Fake H100", 80 * GiB),
    ]
    assert backend.kind == "nvml"


def test_device_whose_handle_fails_with_unknown_error_is_lost_from_the_start() -> None:
    fake = FakeNvml(2)
    fake.handle_errors[0] = pynvml.NVMLError_Unknown
    backend = NvmlBackend(nvml=fake)
    assert backend.devices()[0].uuid is None
    first, second = backend.sample(10.0)
    assert first.lost and first.utilization_gpu is None and first.processes == ()
    assert not second.lost and second.utilization_gpu == 55.0


# -- sampling -----------------------------------------------------------------------------


def test_sample_converts_units_from_nvml() -> None:
    fake = FakeNvml(1)
    fake.devices[0].util_samples = [(4242, 100, 80), (4242, 200, 60), (777, 150, 10)]
    (s,) = NvmlBackend(nvml=fake).sample(5.0)
    assert s.time == 5.0 and not s.lost
    assert (s.utilization_gpu, s.utilization_memory) == (55.0, 20.0)
    assert (s.memory_used, s.memory_total) == (2 * GiB, 80 * GiB)
    assert s.temperature_c == 61.0
    assert s.power_w == pytest.approx(250.5)
    assert s.energy_j == pytest.approx(1234.567)
    assert s.sm_clock_mhz == 1755.0
    assert s.throttle_reasons == frozenset()
    procs = {p.pid: p for p in s.processes}
    assert procs[4242].memory_used == GiB and procs[4242].sm_util == pytest.approx(70.0)
    # a process seen only in utilization samples (graphics, or just exited): memory unknown
    assert procs[777].memory_used is None and procs[777].sm_util == pytest.approx(10.0)


def test_unsupported_fields_are_none_and_the_rest_is_sampled() -> None:
    fake = FakeNvml(1)
    fake.devices[0].unsupported = {"power", "energy", "temperature", "reasons", "clock"}
    (s,) = NvmlBackend(nvml=fake).sample(1.0)
    assert not s.lost
    assert s.power_w is None and s.energy_j is None and s.temperature_c is None
    assert s.throttle_reasons is None and s.sm_clock_mhz is None
    assert s.utilization_gpu == 55.0 and s.memory_used == 2 * GiB


def test_any_nvml_error_on_a_field_is_unknown_not_a_crash() -> None:
    fake = FakeNvml(1)
    backend = NvmlBackend(nvml=fake)
    fake.devices[0].failing = {
        "utilization": pynvml.NVMLError_Unknown,
        "memory": pynvml.NVMLError_NoPermission,
        "processes": pynvml.NVMLError_Timeout,
    }
    (s,) = backend.sample(1.0)
    assert s.utilization_gpu is None and s.utilization_memory is None
    assert s.memory_used is None and s.memory_total == 80 * GiB  # known from opening
    assert s.power_w == pytest.approx(250.5)


def test_throttle_reasons_are_decoded_bit_by_bit() -> None:
    fake = FakeNvml(1)
    fake.devices[0].reasons = (
        pynvml.nvmlClocksEventReasonSwPowerCap
        | pynvml.nvmlClocksEventReasonHwThermalSlowdown
        | pynvml.nvmlClocksEventReasonGpuIdle
    )
    (s,) = NvmlBackend(nvml=fake).sample(1.0)
    assert s.throttle_reasons == {"sw_power_cap", "hw_thermal", "gpu_idle"}


def test_older_pynvml_throttle_reasons_function_is_used() -> None:
    fake = OldFakeNvml(1)
    fake.devices[0].reasons = pynvml.nvmlClocksThrottleReasonHwSlowdown
    (s,) = NvmlBackend(nvml=fake).sample(1.0)
    assert s.throttle_reasons == {"hw_slowdown"}


def test_gpu_lost_mid_run_is_flagged_and_other_gpus_still_sampled() -> None:
    fake = FakeNvml(3)
    backend = NvmlBackend(nvml=fake)
    assert not any(s.lost for s in backend.sample(1.0))
    fake.devices[1].lost = True
    samples = backend.sample(2.0)
    assert [s.lost for s in samples] == [False, True, False]
    lost = samples[1]
    assert (lost.index, lost.uuid) == (1, "GPU-fake-1")
    assert lost.memory_used is None and lost.power_w is None and lost.processes == ()
    assert samples[2].utilization_gpu == 55.0


def test_lost_gpu_stays_lost_even_if_nvml_answers_again() -> None:
    fake = FakeNvml(1)
    backend = NvmlBackend(nvml=fake)
    fake.devices[0].failing = {"process_utilization": pynvml.NVMLError_GpuIsLost}
    assert backend.sample(1.0)[0].lost
    fake.devices[0].failing = {}
    assert backend.sample(2.0)[0].lost


def test_process_utilization_asks_only_for_samples_since_the_last_one_seen() -> None:
    fake = FakeNvml(1)
    dev = fake.devices[0]
    backend = NvmlBackend(nvml=fake)
    dev.util_samples = [(4242, 1_000, 90)]
    assert backend.sample(1.0)[0].processes[0].sm_util == 90.0
    # no new samples: NVML answers NotFound, meaning nobody ran kernels: 0 %, not unknown
    assert backend.sample(2.0)[0].processes[0].sm_util == 0.0
    dev.util_samples.append((4242, 2_000, 30))
    assert backend.sample(3.0)[0].processes[0].sm_util == 30.0
    assert dev.util_timestamps == [0, 1_000, 1_000]


def test_process_utilization_error_leaves_sm_util_unknown() -> None:
    fake = FakeNvml(1)
    fake.devices[0].unsupported = {"process_utilization"}
    (s,) = NvmlBackend(nvml=fake).sample(1.0)
    assert s.processes[0].pid == 4242 and s.processes[0].sm_util is None
    assert s.processes[0].memory_used == GiB


# -- closing ------------------------------------------------------------------------------


def test_close_is_idempotent_and_shuts_nvml_down_once() -> None:
    fake = FakeNvml(1)
    backend = NvmlBackend(nvml=fake)
    backend.close()
    backend.close()
    assert (fake.inits, fake.shutdowns) == (1, 1)
    with pytest.raises(GpuError):
        backend.sample(1.0)


def test_shutdown_error_is_swallowed() -> None:
    fake = FakeNvml(1)
    fake.shutdown_error = pynvml.NVMLError_Uninitialized
    NvmlBackend(nvml=fake).close()
    assert fake.shutdowns == 1


def test_near_cpus_reads_nvmls_affinity_mask_and_is_none_when_it_cannot_say(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 128)  # two words of mask
    nvml = FakeNvml(3)
    nvml.devices[1].near = [5, 100]
    nvml.devices[2].unsupported.add("affinity")
    backend = NvmlBackend(nvml)
    assert backend.near_cpus(0) == (0, 1, 2, 3, 64, 65)
    assert backend.near_cpus(1) == (5, 100)
    assert backend.near_cpus(2) is None  # NotSupported: split as if near every core
    assert backend.near_cpus(7) is None
    nvml.devices[0].lost = True
    assert backend.near_cpus(0) is None
    backend.close()
