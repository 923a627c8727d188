"""The exporter's GPU and process series, read from a fresh CollectorRegistry per test."""

from __future__ import annotations

import os

import pytest
from prometheus_client import generate_latest

from m27 import events as ev
from m27.gpu import THROTTLE_REASONS, GpuSample, ProcessSample
from m27.gpu.sim import BUSY_W, IDLE_W, SimBackend
from m27.monitoring.exporter import build_registry
from tests.unit.exporter_helpers import (
    NODE,
    T0,
    FixedBackend,
    granted,
    make_node,
    queued,
    started,
    submitted,
)


def test_idle_sim_gpus_export_every_gpu_series_with_their_labels() -> None:
    node = make_node(gpus=2)
    node.scrape()
    for index in (0, 1):
        labels = node.gpu(index)
        assert node.value("m27_gpu_utilization_ratio", **labels) == 0.0
        assert node.value("m27_gpu_memory_used_bytes", **labels) == 0.0
        assert node.value("m27_gpu_memory_total_bytes", **labels) == 80 * 1024**3
        assert node.value("m27_gpu_temperature_celsius", **labels) == 30.0
        assert node.value("m27_gpu_power_watts", **labels) == IDLE_W
        assert node.value("m27_gpu_energy_joules_total", **labels) is not None
        assert node.value("m27_gpu_sm_clock_hertz", **labels) == 345e6
        assert node.value("m27_gpu_lost", **labels) == 0.0
        assert node.value("m27_gpu_idle_while_queued_seconds_total", **labels) == 0.0
        for reason in THROTTLE_REASONS:
            expected = 1.0 if reason == "gpu_idle" else 0.0
            assert node.value("m27_gpu_throttle_reason", reason=reason, **labels) == expected


def test_energy_counter_integrates_power_between_scrapes() -> None:
    node = make_node(gpus=1)
    node.scrape()
    node.clock.advance(10)
    assert node.value("m27_gpu_energy_joules_total", **node.gpu(0)) == pytest.approx(10 * IDLE_W)


def test_unknown_fields_export_no_sample_rather_than_a_made_up_value() -> None:
    bare = GpuSample(0, "GPU-x", "Old GPU", T0, utilization_gpu=42.0)
    node = make_node(backend=FixedBackend([bare]))
    labels = {"gpu": "0", "uuid": "GPU-x", "model": "Old GPU", "node": NODE}
    assert node.value("m27_gpu_utilization_ratio", **labels) == pytest.approx(0.42)
    for name in (
        "m27_gpu_memory_used_bytes",
        "m27_gpu_memory_total_bytes",
        "m27_gpu_temperature_celsius",
        "m27_gpu_power_watts",
        "m27_gpu_energy_joules_total",
        "m27_gpu_sm_clock_hertz",
    ):
        assert node.value(name, **labels) is None, name
    assert node.value("m27_gpu_throttle_reason", reason="gpu_idle", **labels) is None
    assert node.value("m27_gpu_lost", **labels) == 0.0


def test_a_lost_gpu_says_so_and_exports_no_readings() -> None:
    backend = SimBackend(2)
    node = make_node(backend=backend)
    backend.lose(1)
    node.scrape()
    assert node.value("m27_gpu_lost", **node.gpu(1)) == 1.0
    assert node.value("m27_gpu_utilization_ratio", **node.gpu(1)) is None
    assert node.value("m27_gpu_lost", **node.gpu(0)) == 0.0


def test_a_gpu_the_log_reports_lost_is_lost_even_if_it_still_answers() -> None:
    node = make_node(gpus=2)
    node.append(ev.GpuLost(at=T0, gpu=0, reason="Xid 79"))
    assert node.value("m27_gpu_lost", **node.gpu(0)) == 1.0


def test_throttle_reasons_are_one_series_per_reason() -> None:
    hot = GpuSample(
        0, "GPU-h", "Hot GPU", T0, temperature_c=88.0, throttle_reasons=frozenset({"hw_thermal"})
    )
    node = make_node(backend=FixedBackend([hot]))
    labels = {"gpu": "0", "uuid": "GPU-h", "model": "Hot GPU", "node": NODE}
    node.scrape()
    values = {
        reason: node.value("m27_gpu_throttle_reason", reason=reason, **labels)
        for reason in THROTTLE_REASONS
    }
    assert values == {r: (1.0 if r == "hw_thermal" else 0.0) for r in THROTTLE_REASONS}


def test_a_running_steps_process_is_labelled_with_its_run_and_step() -> None:
    node = make_node(gpus=2)
    pid = os.getpid()
    node.append(
        submitted("r1", ("md",)),
        queued("r1", "md", T0),
        granted("r1", "md", T0, gpus=(1,)),
        started("r1", "md", T0, gpus=(1,), pid=pid),
    )
    node.scrape()
    labels = {"gpu": "1", "uuid": "GPU-sim-0001", "node": NODE, "pid": str(pid)}
    assert node.value("m27_gpu_process_utilization_ratio", run="r1", step="md", **labels) == 1.0
    assert node.value("m27_gpu_process_memory_used_bytes", run="r1", step="md", **labels) == 0.0
    assert node.value("m27_gpu_utilization_ratio", **node.gpu(1)) == 1.0
    assert node.value("m27_gpu_utilization_ratio", **node.gpu(0)) == 0.0
    node.clock.advance(1)
    assert node.value("m27_gpu_power_watts", **node.gpu(1)) == BUSY_W


def test_a_foreign_process_is_exported_without_run_and_step() -> None:
    proc = ProcessSample(pid=999_999, memory_used=2 * 1024**3, sm_util=30.0)
    busy = GpuSample(0, "GPU-b", "GPU", T0, utilization_gpu=30.0, processes=(proc,))
    node = make_node(backend=FixedBackend([busy]))
    labels = {"gpu": "0", "uuid": "GPU-b", "node": NODE, "pid": "999999", "run": "", "step": ""}
    assert node.value("m27_gpu_process_memory_used_bytes", **labels) == 2 * 1024**3
    assert node.value("m27_gpu_process_utilization_ratio", **labels) == pytest.approx(0.3)


def test_the_sim_mirror_detaches_a_step_when_it_ends() -> None:
    node = make_node(gpus=1)
    node.append(submitted("r1", ("md",)), granted("r1", "md", T0), started("r1", "md", T0))
    node.scrape()
    assert node.value("m27_gpu_utilization_ratio", **node.gpu(0)) == 1.0
    node.append(
        ev.StepSucceeded(at=T0 + 1, run_id="r1", step="md", attempt=1, duration_s=1.0),
        ev.LeaseReleased(at=T0 + 1, run_id="r1", step="md", gpus=(0,)),
    )
    node.clock.advance(1)
    assert node.value("m27_gpu_utilization_ratio", **node.gpu(0)) == 0.0


def test_the_text_exposition_is_valid_and_has_no_process_metrics() -> None:
    node = make_node(gpus=8)
    text = generate_latest(node.registry).decode()
    assert "m27_gpu_utilization_ratio{" in text
    assert "process_cpu_seconds_total" not in text
    assert text.count('m27_gpu_lost{gpu="') == 8


def test_a_fresh_registry_holds_only_m27_series() -> None:
    node = make_node(gpus=1)
    registry = build_registry(node.sampler)
    names = {m.name for m in registry.collect()}
    assert names and all(name.startswith("m27_") for name in names)
