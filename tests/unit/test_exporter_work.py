"""The exporter's work series: from the event log through the read model, never a replay."""

from __future__ import annotations

import pytest

from m27 import events as ev
from m27.gpu import GpuSample, ProcessSample
from m27.gpu.sim import BUSY_W
from m27.store.memory import MemoryEventStore
from tests.unit.exporter_helpers import (
    T0,
    FixedBackend,
    granted,
    make_node,
    queued,
    started,
    submitted,
)


def test_steps_are_counted_by_state_tier_and_type() -> None:
    node = make_node()
    node.append(
        submitted("r1", ("prep", "md", "analysis", "train")),
        queued("r1", "prep", T0, type="cpu"),
        queued("r1", "md", T0),
        queued("r1", "train", T0),
        granted("r1", "train", T0, gpus=(1,)),
        started("r1", "train", T0, gpus=(1,)),
    )
    assert node.value("m27_steps", state="pending", tier="none", type="unknown") == 1.0
    assert node.value("m27_steps", state="queued", tier="background", type="cpu") == 1.0
    assert node.value("m27_steps", state="queued", tier="ready", type="gpu") == 1.0
    assert node.value("m27_steps", state="running", tier="immediate", type="gpu") == 1.0
    assert node.value("m27_queue_depth", tier="ready") == 1.0
    assert node.value("m27_queue_depth", tier="background") == 1.0
    assert node.value("m27_queue_depth", tier="immediate") == 0.0
    assert node.value("m27_leases", tier="immediate") == 1.0
    assert node.value("m27_runs_running") == 1.0


def test_a_granted_step_leaves_the_queue_before_its_process_starts() -> None:
    node = make_node()
    node.append(submitted("r1", ("md",)), queued("r1", "md", T0), granted("r1", "md", T0))
    assert node.value("m27_queue_depth", tier="ready") == 0.0
    assert node.value("m27_steps", state="queued", tier="immediate", type="gpu") == 1.0


def test_guests_are_counted_running_or_paused() -> None:
    node = make_node()
    node.append(
        submitted("r1", ("a", "b")),
        granted("r1", "a", T0, gpus=(0,), tier="ready"),
        granted("r1", "b", T0, gpus=(0,), tier="ready"),
        ev.GuestStarted(at=T0, run_id="r1", step="a", gpu=0),
        ev.GuestStarted(at=T0, run_id="r1", step="b", gpu=0),
        ev.GuestPaused(at=T0, run_id="r1", step="b", gpu=0),
    )
    assert node.value("m27_guests", state="running") == 1.0
    assert node.value("m27_guests", state="paused") == 1.0
    assert node.value("m27_leases", tier="ready") == 2.0
    node.append(ev.Promoted(at=T0, run_id="r1", step="a", gpu=0))
    assert node.value("m27_guests", state="running") == 0.0
    assert node.value("m27_leases", tier="immediate") == 1.0


def test_run_outcomes_are_counted_from_zero() -> None:
    node = make_node()
    assert node.value("m27_runs_total", outcome="failed") == 0.0
    node.append(
        submitted("r1"),
        submitted("r2"),
        submitted("r3"),
        submitted("r4"),
        ev.RunSucceeded(at=T0 + 5, run_id="r1", duration_s=5.0),
        ev.RunFailed(at=T0 + 5, run_id="r2", duration_s=5.0, failed_steps=("md",)),
        ev.RunCrashed(at=T0 + 6, run_id="r4", reason="flow run process 7 on vm died"),
    )
    assert node.value("m27_runs_total", outcome="succeeded") == 1.0
    # a crash is not a failed step: its own outcome, as `m27 runs` and Prefect show it
    assert node.value("m27_runs_total", outcome="failed") == 1.0
    assert node.value("m27_runs_total", outcome="crashed") == 1.0
    assert node.value("m27_runs_total", outcome="cancelled") == 0.0
    assert node.value("m27_runs_running") == 1.0


def test_dispatch_latency_runs_from_queueing_to_the_process_start_by_tier() -> None:
    node = make_node()
    node.append(
        submitted("r1", ("md",)),
        queued("r1", "md", T0),
        granted("r1", "md", T0 + 1.5),
        started("r1", "md", T0 + 2.0),
        ev.StepFailed(
            at=T0 + 10, run_id="r1", step="md", attempt=1, duration_s=8, reason="x", will_retry=True
        ),
        started("r1", "md", T0 + 40.0),
    )
    name = "m27_dispatch_latency_seconds"
    assert node.value(f"{name}_count", tier="immediate") == 2.0
    assert node.value(f"{name}_sum", tier="immediate") == pytest.approx(32.0)
    assert node.value(f"{name}_bucket", tier="immediate", le="2.5") == 1.0
    assert node.value(f"{name}_bucket", tier="immediate", le="30") == 2.0
    assert node.value(f"{name}_bucket", tier="immediate", le="+Inf") == 2.0


def test_checkpoint_durations_and_sizes_are_histograms_by_pipeline() -> None:
    node = make_node()
    written = [
        ev.CheckpointWritten(
            at=T0 + i,
            run_id="r1",
            step="md",
            path=f"/c/{i}",
            sim_step=i,
            bytes_written=size,
            bytes_total=10 * size,
            duration_s=seconds,
        )
        for i, (size, seconds) in enumerate([(512, 0.002), (3 * 1024**2, 0.4)])
    ]
    node.append(submitted("r1", ("md",)), *written)
    assert node.value("m27_checkpoint_duration_seconds_count", pipeline="md") == 2.0
    assert node.value("m27_checkpoint_duration_seconds_bucket", pipeline="md", le="0.005") == 1.0
    assert node.value("m27_checkpoint_duration_seconds_sum", pipeline="md") == pytest.approx(0.402)
    assert node.value("m27_checkpoint_bytes_bucket", pipeline="md", le="1024") == 1.0
    assert node.value("m27_checkpoint_bytes_bucket", pipeline="md", le="4194304") == 2.0


def test_a_running_step_exports_its_checkpoint_interval_and_newest_checkpoint_time() -> None:
    node = make_node()
    node.intervals["r1"] = {"md": 300.0}
    node.append(submitted("r1", ("prep", "md")), granted("r1", "md", T0), started("r1", "md", T0))
    labels = {"run": "r1", "pipeline": "md", "step": "md"}
    assert node.value("m27_step_checkpoint_interval_seconds", **labels) == 300.0
    assert node.value("m27_step_last_checkpoint_timestamp_seconds", **labels) == T0
    node.append(
        ev.CheckpointWritten(
            at=T0 + 290,
            run_id="r1",
            step="md",
            path="/c",
            sim_step=1,
            bytes_written=1,
            bytes_total=1,
            duration_s=0.1,
        )
    )
    assert node.value("m27_step_last_checkpoint_timestamp_seconds", **labels) == T0 + 290
    node.append(ev.StepSucceeded(at=T0 + 300, run_id="r1", step="md", attempt=1, duration_s=300))
    assert node.value("m27_step_checkpoint_interval_seconds", **labels) is None


def test_gpu_idle_while_gpu_work_waits_is_accumulated_per_gpu() -> None:
    node = make_node(gpus=2)
    node.append(
        submitted("r1", ("busy", "waiting")),
        granted("r1", "busy", T0, gpus=(0,)),
        started("r1", "busy", T0, gpus=(0,)),
        queued("r1", "waiting", T0),
    )
    node.scrape()
    node.clock.advance(12)
    node.scrape()
    assert node.value("m27_gpu_idle_while_queued_seconds_total", **node.gpu(1)) == 12.0
    assert node.value("m27_gpu_idle_while_queued_seconds_total", **node.gpu(0)) == 0.0
    # The queue empties: idle time stops counting.
    node.append(ev.StepCancelled(at=T0 + 12, run_id="r1", step="waiting"))
    node.clock.advance(30)
    assert node.value("m27_gpu_idle_while_queued_seconds_total", **node.gpu(1)) == 12.0


def test_idle_gpus_without_queued_gpu_work_are_not_waste() -> None:
    node = make_node(gpus=1)
    node.append(submitted("r1", ("prep",)), queued("r1", "prep", T0, type="cpu"))
    node.scrape()
    node.clock.advance(30)
    assert node.value("m27_gpu_idle_while_queued_seconds_total", **node.gpu(0)) == 0.0


def test_an_interval_longer_than_the_gap_limit_is_not_accounted() -> None:
    node = make_node(gpus=1)
    node.append(submitted("r1", ("md",)), queued("r1", "md", T0))
    node.scrape()
    node.clock.advance(3600)
    node.scrape()
    node.clock.advance(5)
    assert node.value("m27_gpu_idle_while_queued_seconds_total", **node.gpu(0)) == 5.0


def test_a_steps_energy_is_recorded_when_its_lease_is_released() -> None:
    node = make_node(gpus=2)
    node.append(submitted("r1", ("md",)), granted("r1", "md", T0), started("r1", "md", T0))
    node.scrape()
    node.clock.advance(10)
    node.scrape()
    labels = {"run": "r1", "pipeline": "md", "step": "md"}
    assert node.value("m27_run_step_energy_joules", **labels) == pytest.approx(10 * BUSY_W)
    node.append(
        ev.StepSucceeded(at=T0 + 10, run_id="r1", step="md", attempt=1, duration_s=10),
        ev.LeaseReleased(at=T0 + 10, run_id="r1", step="md", gpus=(0,)),
    )
    node.scrape()
    measured = [r.event for r in node.store.read() if isinstance(r.event, ev.StepEnergyMeasured)]
    assert measured == [
        ev.StepEnergyMeasured(at=T0 + 10, run_id="r1", step="md", gpu=0, joules=10 * BUSY_W)
    ]
    assert node.value("m27_run_step_energy_joules", **labels) == pytest.approx(10 * BUSY_W)
    assert node.value("m27_run_energy_joules", run="r1", pipeline="md") == pytest.approx(3000.0)
    assert node.value("m27_step_energy_joules_total", pipeline="md", step="md") == 3000.0
    node.clock.advance(10)  # energy after the release is nobody's
    assert node.value("m27_step_energy_joules_total", pipeline="md", step="md") == 3000.0


def test_two_steps_on_one_gpu_share_its_energy_by_utilization() -> None:
    def gpu(energy: float) -> GpuSample:
        procs = (ProcessSample(1001, 0, 75.0), ProcessSample(1002, 0, 25.0))
        return GpuSample(0, "GPU-f", "GPU", T0, energy_j=energy, processes=procs)

    backend = FixedBackend([gpu(1000.0)])
    node = make_node(backend=backend)
    node.append(
        submitted("r1", ("a", "b")),
        granted("r1", "a", T0),
        granted("r1", "b", T0),
        started("r1", "a", T0, pid=1001),
        started("r1", "b", T0, pid=1002),
    )
    node.scrape()
    backend.samples = [gpu(1400.0)]
    node.clock.advance(2)
    node.scrape()
    a = node.value("m27_run_step_energy_joules", run="r1", pipeline="md", step="a")
    b = node.value("m27_run_step_energy_joules", run="r1", pipeline="md", step="b")
    assert a == pytest.approx(300.0)
    assert b == pytest.approx(100.0)


def test_flops_reports_add_up_per_step_and_pipeline() -> None:
    node = make_node()
    node.append(
        submitted("r1", ("md",)),
        ev.StepFlopsReported(at=T0, run_id="r1", step="md", flops=1e12),
        ev.StepFlopsReported(at=T0, run_id="r1", step="md", flops=2e12),
    )
    assert node.value("m27_run_step_flops", run="r1", pipeline="md", step="md") == 3e12
    assert node.value("m27_step_flops_total", pipeline="md", step="md") == 3e12


class CountingStore(MemoryEventStore):
    def __init__(self) -> None:
        super().__init__()
        self.reads: list[int] = []

    def read(self, after: int = 0, limit: int | None = None) -> list[ev.Recorded]:
        self.reads.append(after)
        return super().read(after, limit)


def test_a_scrape_reads_only_the_events_after_the_last_one_applied() -> None:
    from m27.gpu.sim import SimBackend
    from m27.monitoring.exporter import Sampler, build_registry

    store = CountingStore()
    store.append([submitted(f"r{i}") for i in range(50)])
    sampler = Sampler(SimBackend(1), store, node="n")
    registry = build_registry(sampler)
    assert sampler.model.events_applied == 50
    store.reads.clear()
    store.append([ev.RunSucceeded(at=T0, run_id="r3", duration_s=1.0)])
    list(registry.collect())
    assert store.reads[0] == 50
    assert sampler.model.events_applied == 51
    assert registry.get_sample_value("m27_runs_total", {"outcome": "succeeded"}) == 1.0
