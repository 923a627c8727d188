"""Energy per step: counter deltas shared by utilization, never made up."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from m27 import events as ev
from m27._exceptions import M27Error
from m27.events.state import NodeState, fold
from m27.gpu import GpuSample
from m27.monitoring.energy import (
    EnergyMeter,
    apportion,
    energy_by_run,
    energy_by_step,
    format_energy,
    report_flops,
)
from m27.store.sqlite import SqliteEventStore

A, B = ("r1", "md"), ("r1", "analysis")


def sample(gpu: int, energy: float | None, *, lost: bool = False) -> GpuSample:
    return GpuSample(gpu, f"GPU-{gpu}", "test GPU", 0.0, lost=lost, energy_j=energy)


def test_energy_is_split_in_proportion_to_utilization() -> None:
    assert apportion(100.0, {A: 75.0, B: 25.0}) == {A: 75.0, B: 25.0}


def test_energy_is_split_equally_when_a_share_is_unknown_or_all_are_zero() -> None:
    assert apportion(90.0, {A: 80.0, B: None}) == {A: 45.0, B: 45.0}
    assert apportion(90.0, {A: 0.0, B: 0.0}) == {A: 45.0, B: 45.0}


def test_nobody_gets_energy_without_holders_or_without_a_positive_delta() -> None:
    assert apportion(100.0, {}) == {}
    assert apportion(0.0, {A: 50.0}) == {}
    assert apportion(-5.0, {A: 50.0}) == {}
    assert apportion(float("nan"), {A: 50.0}) == {}


@given(
    joules=st.floats(min_value=0.0, max_value=1e9),
    shares=st.dictionaries(
        st.integers(0, 20), st.one_of(st.none(), st.floats(0.0, 100.0)), max_size=8
    ),
)
@example(joules=1.5, shares={0: 5e-324})  # a subnormal share: 2.0 J came out of 1.5
def test_apportioning_conserves_the_energy_of_the_interval(
    joules: float, shares: dict[int, float | None]
) -> None:
    out = apportion(joules, shares)
    if shares and joules > 0:
        assert math.isclose(sum(out.values()), joules, rel_tol=1e-9, abs_tol=1e-9)
        assert set(out) == set(shares)
        assert all(v >= 0 for v in out.values())
    else:
        assert out == {}


def test_meter_accumulates_deltas_per_step_and_gpu_and_take_forgets_them() -> None:
    meter = EnergyMeter()
    assert meter.observe([sample(0, 1000.0), sample(1, 50.0)], {0: {A: 100.0}}) == {}
    used = meter.observe(
        [sample(0, 1300.0), sample(1, 80.0)], {0: {A: 60.0, B: 20.0}, 1: {A: None}}
    )
    assert used == {0: 300.0, 1: 30.0}
    assert meter.pending(A) == pytest.approx(225.0 + 30.0)
    assert meter.take(A) == pytest.approx({0: 225.0, 1: 30.0})
    assert meter.take(A) == {}
    assert meter.pending(B) == pytest.approx(75.0)


def test_meter_ignores_counter_resets_unknown_energy_and_lost_gpus() -> None:
    meter = EnergyMeter()
    holders = {0: {A: 100.0}}
    meter.observe([sample(0, 500.0)], holders)
    meter.observe([sample(0, 100.0)], holders)  # driver reloaded: counter went back
    assert meter.pending(A) == 0.0
    meter.observe([sample(0, 160.0)], holders)
    assert meter.pending(A) == pytest.approx(60.0)
    meter.observe([sample(0, None)], holders)
    meter.observe([sample(0, 1000.0, lost=True)], holders)
    meter.observe([sample(0, 2000.0)], holders)  # back, but no baseline since it was lost
    assert meter.pending(A) == pytest.approx(60.0)


def _measured_state() -> NodeState:
    return fold(
        [
            ev.RunSubmitted(at=1.0, run_id="r1", pipeline="p", spec_path="p.yaml", steps=("md",)),
            ev.RunSubmitted(at=1.0, run_id="r2", pipeline="p", spec_path="p.yaml", steps=("md",)),
            ev.StepEnergyMeasured(at=2.0, run_id="r1", step="md", gpu=0, joules=100.0),
            ev.StepEnergyMeasured(at=2.0, run_id="r1", step="md", gpu=1, joules=50.0),
            ev.StepEnergyMeasured(at=2.0, run_id="r1", step="prep", gpu=0, joules=5.0),
        ]
    )


def test_energy_by_step_and_run_sum_recorded_measurements() -> None:
    state = _measured_state()
    assert energy_by_step(state) == {("r1", "md"): 150.0, ("r1", "prep"): 5.0}
    assert energy_by_run(state) == {"r1": 155.0}


@pytest.mark.parametrize(
    ("joules", "text"),
    [(850.0, "850 J"), (12_345.0, "12.3 kJ"), (4_560_000.0, "4.56 MJ (1.27 kWh)")],
)
def test_energy_is_formatted_for_people(joules: float, text: str) -> None:
    assert format_energy(joules) == text


def test_report_flops_appends_an_event_for_the_current_step(
    m27_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("M27_RUN_ID", "r1")
    monkeypatch.setenv("M27_STEP", "md")
    report_flops(2.5e12, at=10.0)
    store = SqliteEventStore(m27_home / "events.db")
    try:
        (rec,) = store.read()
    finally:
        store.close()
    assert rec.event == ev.StepFlopsReported(at=10.0, run_id="r1", step="md", flops=2.5e12)


def test_report_flops_outside_a_step_or_with_a_bad_count_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("M27_RUN_ID", raising=False)
    with pytest.raises(M27Error, match="inside a step"):
        report_flops(1.0)
    monkeypatch.setenv("M27_RUN_ID", "r1")
    monkeypatch.setenv("M27_STEP", "md")
    with pytest.raises(M27Error, match=">= 0"):
        report_flops(-1.0)
