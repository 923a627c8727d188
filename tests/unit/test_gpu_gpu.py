"""NvmlBackend on a real NVIDIA GPU (marked ``gpu``; skipped only where there is no NVIDIA GPU:
on a GPU machine, NVML failing to load fails them)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from m27._exceptions import GpuError
from m27.gpu import THROTTLE_REASONS, detect
from m27.gpu.nvml import NvmlBackend
from tests.services import no_gpu

pytestmark = pytest.mark.gpu


@pytest.fixture
def backend() -> Iterator[NvmlBackend]:
    try:
        b = NvmlBackend()
    except GpuError as exc:
        no_gpu(f"NVML does not initialise: {exc}")
    if not b.devices():
        b.close()
        no_gpu("NVML initialised but lists no GPU")
    yield b
    b.close()


def test_real_gpus_have_identity_and_memory(backend: NvmlBackend) -> None:
    for info in backend.devices():
        assert info.uuid is not None and info.uuid.startswith(("GPU-", "MIG-"))
        assert info.name and info.memory_total and info.memory_total > 2**30


def test_real_sample_has_sane_values(backend: NvmlBackend) -> None:
    backend.sample(time.time())
    for s in backend.sample(time.time()):
        assert not s.lost
        assert s.utilization_gpu is None or 0 <= s.utilization_gpu <= 100
        assert s.memory_used is not None and s.memory_total is not None
        assert 0 <= s.memory_used <= s.memory_total
        assert s.temperature_c is None or 0 < s.temperature_c < 120
        assert s.power_w is None or 0 < s.power_w < 2000
        assert s.throttle_reasons is None or s.throttle_reasons <= THROTTLE_REASONS


def test_energy_counter_does_not_go_back(backend: NvmlBackend) -> None:
    first = backend.sample(time.time())
    time.sleep(0.2)
    second = backend.sample(time.time())
    for a, b in zip(first, second, strict=True):
        if a.energy_j is not None and b.energy_j is not None:
            assert b.energy_j >= a.energy_j


def test_detect_prefers_nvml_on_a_gpu_node(backend: NvmlBackend) -> None:
    detected = detect({})
    try:
        assert detected.kind == "nvml"
        assert [d.uuid for d in detected.devices()] == [d.uuid for d in backend.devices()]
    finally:
        detected.close()


def test_nvml_names_cores_near_each_gpu_that_this_machine_has(backend: NvmlBackend) -> None:
    """The cores m27.gpu.cpus splits among the GPUs near them: NVML's CPU affinity of each
    GPU, a set of this machine's logical CPUs (None only where the driver cannot say)."""
    import os

    count = os.cpu_count() or 1
    for info in backend.devices():
        near = backend.near_cpus(info.index)
        if near is not None:
            assert near and all(0 <= cpu < count for cpu in near), near
