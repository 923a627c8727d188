"""The exporter's metric families, built from one sampling pass and the read model.

Names follow Prometheus conventions (base units: seconds, bytes, joules, hertz, ratios
0-1). A value a GPU does not report is left out: no sample rather than a made-up one.
docs/monitoring.md lists every series.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from m27.gpu import THROTTLE_REASONS, GpuSample
from m27.monitoring.readmodel import TIERS, Histogram

if TYPE_CHECKING:  # the exporter imports this module: its types only, never at run time
    from m27.monitoring.exporter import Sampler, Snapshot

GPU_LABELS = ["gpu", "uuid", "model", "node"]
PROCESS_LABELS = ["gpu", "uuid", "node", "pid", "run", "step"]
STEP_LABELS = ["run", "pipeline", "step"]


def families(sampler: Sampler, snap: Snapshot) -> Iterator[Metric]:
    yield from _gpu_families(sampler, snap)
    yield from _process_families(sampler, snap)
    yield from _work_families(sampler)
    yield from _energy_families(sampler, snap)
    yield from _checkpoint_families(sampler)
    yield from _exporter_families(sampler, snap)


def _gpu_id(sampler: Sampler, s: GpuSample) -> list[str]:
    info = sampler.devices.get(s.index)
    uuid = s.uuid or (info.uuid if info else None) or ""
    model = s.name or (info.name if info else None) or ""
    return [str(s.index), uuid, model, sampler.node]


def _gpu_families(sampler: Sampler, snap: Snapshot) -> Iterator[Metric]:
    def gauge(name: str, doc: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=GPU_LABELS)

    util = gauge("m27_gpu_utilization_ratio", "GPU busy fraction over the last interval (0-1).")
    mem_util = gauge("m27_gpu_memory_utilization_ratio", "Memory-controller busy fraction (0-1).")
    used = gauge("m27_gpu_memory_used_bytes", "GPU memory in use.")
    total = gauge("m27_gpu_memory_total_bytes", "GPU memory size.")
    temp = gauge("m27_gpu_temperature_celsius", "GPU core temperature.")
    power = gauge("m27_gpu_power_watts", "GPU power draw.")
    clock = gauge("m27_gpu_sm_clock_hertz", "SM clock.")
    lost = gauge("m27_gpu_lost", "1 when the GPU fell off the bus or the log says it was lost.")
    energy = CounterMetricFamily(
        "m27_gpu_energy_joules", "Energy used since the driver loaded.", labels=GPU_LABELS
    )
    idle = CounterMetricFamily(
        "m27_gpu_idle_while_queued_seconds",
        "Seconds the GPU sat idle while GPU work waited for a lease: the waste m27 removes.",
        labels=GPU_LABELS,
    )
    throttle = GaugeMetricFamily(
        "m27_gpu_throttle_reason",
        "1 while the GPU clocks down for this reason (one series per NVML reason).",
        labels=[*GPU_LABELS, "reason"],
    )
    for s in snap.samples:
        labels = _gpu_id(sampler, s)
        is_lost = s.lost or s.index in snap.lost
        lost.add_metric(labels, 1.0 if is_lost else 0.0)
        idle.add_metric(labels, snap.idle_while_queued_s.get(s.index, 0.0))
        if is_lost:
            continue
        for family, value, scale in (
            (util, s.utilization_gpu, 0.01),
            (mem_util, s.utilization_memory, 0.01),
            (used, s.memory_used, 1.0),
            (total, s.memory_total, 1.0),
            (temp, s.temperature_c, 1.0),
            (power, s.power_w, 1.0),
            (clock, s.sm_clock_mhz, 1e6),
            (energy, s.energy_j, 1.0),
        ):
            if value is not None:
                family.add_metric(labels, float(value) * scale)
        if s.throttle_reasons is not None:
            for reason in sorted(THROTTLE_REASONS):
                throttle.add_metric([*labels, reason], 1.0 if reason in s.throttle_reasons else 0.0)
    yield from (util, mem_util, used, total, temp, power, clock, energy, throttle, lost, idle)


def _process_families(sampler: Sampler, snap: Snapshot) -> Iterator[Metric]:
    memory = GaugeMetricFamily(
        "m27_gpu_process_memory_used_bytes",
        "GPU memory of one process; run and step are set when it is an m27 step.",
        labels=PROCESS_LABELS,
    )
    util = GaugeMetricFamily(
        "m27_gpu_process_utilization_ratio",
        "SM fraction one process used over the last interval (0-1).",
        labels=PROCESS_LABELS,
    )
    for s in snap.samples:
        if s.lost:
            continue
        gpu, uuid, _, node = _gpu_id(sampler, s)
        for proc in s.processes:
            run, step = snap.process_steps.get(proc.pid, ("", ""))
            labels = [gpu, uuid, node, str(proc.pid), run, step]
            if proc.memory_used is not None:
                memory.add_metric(labels, float(proc.memory_used))
            if proc.sm_util is not None:
                util.add_metric(labels, proc.sm_util / 100.0)
    yield from (memory, util)


def _work_families(sampler: Sampler) -> Iterator[Metric]:
    model = sampler.model
    state = model.state
    steps = GaugeMetricFamily(
        "m27_steps",
        "Steps by state, tier (the lease's, or the tier a waiting step queues for) and type.",
        labels=["state", "tier", "type"],
    )
    by_state: dict[tuple[str, str, str], int] = {}
    queue = dict.fromkeys(TIERS, 0)
    for bucket, n in model.step_counts.items():
        if n <= 0:
            continue
        where = (bucket.state, bucket.tier, bucket.type)
        by_state[where] = by_state.get(where, 0) + n
        if bucket.state == "queued" and not bucket.leased:
            queue[bucket.tier] = queue.get(bucket.tier, 0) + n
    for where, n in sorted(by_state.items()):
        steps.add_metric(list(where), float(n))
    yield steps

    depth = GaugeMetricFamily(
        "m27_queue_depth", "Steps waiting for a lease, by the tier they queue for.", labels=["tier"]
    )
    for tier, n in sorted(queue.items()):
        depth.add_metric([tier], float(n))
    yield depth

    leases = GaugeMetricFamily("m27_leases", "Leases held, by tier.", labels=["tier"])
    lease_counts = dict.fromkeys(TIERS, 0)
    for tier in state.lease_tiers.values():
        lease_counts[tier] = lease_counts.get(tier, 0) + 1
    for tier, n in sorted(lease_counts.items()):
        leases.add_metric([tier], float(n))
    yield leases

    guests = GaugeMetricFamily(
        "m27_guests", "Guest steps on another step's GPU, running or paused.", labels=["state"]
    )
    paused = 0
    for key in state.guests:
        step = state.step(*key)
        paused += 1 if step is not None and step.paused else 0
    guests.add_metric(["running"], float(len(state.guests) - paused))
    guests.add_metric(["paused"], float(paused))
    yield guests

    runs = GaugeMetricFamily("m27_runs_running", "Pipeline runs not yet ended.")
    runs.add_metric([], float(model.run_states.get("running", 0)))
    yield runs
    outcomes = CounterMetricFamily(
        "m27_runs", "Pipeline runs ended, by outcome.", labels=["outcome"]
    )
    for outcome, n in sorted(model.run_outcomes.items()):
        outcomes.add_metric([outcome], float(n))
    yield outcomes

    yield _histogram(
        "m27_dispatch_latency_seconds",
        "From a step attempt queueing until its process started, by lease tier.",
        "tier",
        model.dispatch_latency,
    )


def _energy_families(sampler: Sampler, snap: Snapshot) -> Iterator[Metric]:
    model = sampler.model
    pending_by_where: dict[tuple[str, str], float] = {}
    for (run_id, step), joules in snap.pending_energy.items():
        where = (model.pipeline_of(run_id), step)
        pending_by_where[where] = pending_by_where.get(where, 0.0) + joules
    total = CounterMetricFamily(
        "m27_step_energy_joules",
        "GPU energy used by steps, summed over runs (includes steps still holding GPUs).",
        labels=["pipeline", "step"],
    )
    for where in sorted(model.energy_total.keys() | pending_by_where.keys()):
        joules = model.energy_total.get(where, 0.0) + pending_by_where.get(where, 0.0)
        total.add_metric(list(where), joules)
    yield total
    flops_total = CounterMetricFamily(
        "m27_step_flops", "FLOPs steps reported, summed over runs.", labels=["pipeline", "step"]
    )
    for where, flops in sorted(model.flops_total.items()):
        flops_total.add_metric(list(where), flops)
    yield flops_total

    per_step = GaugeMetricFamily(
        "m27_run_step_energy_joules",
        "GPU energy of one step of a recent or live run.",
        labels=STEP_LABELS,
    )
    per_run = GaugeMetricFamily(
        "m27_run_energy_joules", "GPU energy of a recent or live run.", labels=["run", "pipeline"]
    )
    step_flops = GaugeMetricFamily(
        "m27_run_step_flops", "FLOPs one step of a recent or live run reported.", labels=STEP_LABELS
    )
    for run_id in model.shown_runs():
        run = model.state.runs.get(run_id)
        if run is None:
            continue
        run_joules = 0.0
        for step_state in run.steps.values():
            key = (run_id, step_state.name)
            joules = step_state.energy_j + snap.pending_energy.get(key, 0.0)
            labels = [run_id, run.pipeline, step_state.name]
            if joules > 0.0:
                per_step.add_metric(labels, joules)
                run_joules += joules
            if key in model.flops:
                step_flops.add_metric(labels, model.flops[key])
        if run_joules > 0.0:
            per_run.add_metric([run_id, run.pipeline], run_joules)
    yield from (per_step, per_run, step_flops)


def _checkpoint_families(sampler: Sampler) -> Iterator[Metric]:
    model = sampler.model
    yield _histogram(
        "m27_checkpoint_duration_seconds",
        "Time to commit a checkpoint, by pipeline.",
        "pipeline",
        model.checkpoint_duration,
    )
    yield _histogram(
        "m27_checkpoint_bytes",
        "Bytes a checkpoint wrote (changed chunks only), by pipeline.",
        "pipeline",
        model.checkpoint_bytes,
    )
    interval = GaugeMetricFamily(
        "m27_step_checkpoint_interval_seconds",
        "The checkpoint interval a running step declared.",
        labels=STEP_LABELS,
    )
    newest = GaugeMetricFamily(
        "m27_step_last_checkpoint_timestamp_seconds",
        "When a running step last checkpointed (its start, until the first checkpoint).",
        labels=STEP_LABELS,
    )
    for key in sorted(model.running):
        every = model.checkpoint_interval(key)
        at = model.last_checkpoint_at.get(key)
        if every is None or at is None:
            continue
        labels = [key[0], model.pipeline_of(key[0]), key[1]]
        interval.add_metric(labels, every)
        newest.add_metric(labels, at)
    yield from (interval, newest)


def _exporter_families(sampler: Sampler, snap: Snapshot) -> Iterator[Metric]:
    seq = GaugeMetricFamily("m27_log_last_seq", "Newest event of the log the exporter applied.")
    seq.add_metric([], float(sampler.model.last_seq))
    applied = CounterMetricFamily(
        "m27_exporter_events_applied", "Events the exporter's read model applied."
    )
    applied.add_metric([], float(sampler.model.events_applied))
    duration = GaugeMetricFamily(
        "m27_exporter_pass_seconds", "How long the latest sampling pass took."
    )
    duration.add_metric([], snap.pass_seconds)
    yield from (seq, applied, duration)


def _histogram(name: str, doc: str, label: str, hists: dict[str, Histogram]) -> Metric:
    family = HistogramMetricFamily(name, doc, labels=[label])
    for value, hist in sorted(hists.items()):
        family.add_metric([value], hist.cumulative(), hist.sum)
    return family
