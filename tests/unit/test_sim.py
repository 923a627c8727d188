"""The trace simulator: hand-computed schedules on tiny traces, for every policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from m27 import events as ev
from m27._exceptions import SpecError
from m27.policy import PolicyConfig, PolicyInput, decide
from m27.sim import compare, compute_metrics, load_trace, make_scheduler, save_trace, simulate
from m27.sim.alibaba import load_alibaba, scale_to_node
from m27.sim.engine import SimState
from m27.sim.eventlog import trace_from_events
from m27.sim.lab import lab_week
from m27.sim.metrics import Metrics, p95
from m27.sim.report import table
from m27.sim.schedulers import PolicyScheduler
from m27.sim.trace import GIB, Job, Trace

DATA = Path(__file__).parent / "data"


def job(id: str, arrival: float, *phases: tuple[str, float], **kw: object) -> Job:
    kw.setdefault("gpu_memory", 8 * GIB)
    return Job(id=f"{id}/main", arrival=arrival, phases=tuple(phases), **kw)  # type: ignore[arg-type]


def times(trace: Trace, policy: str) -> dict[str, tuple[float | None, float | None]]:
    result = simulate(trace, make_scheduler(policy))
    return {lv.job.id.split("/")[0]: (lv.started_at, lv.finished_at) for lv in result.jobs}


IO_THEN_SHORT = Trace(
    jobs=(
        job("a", 0, ("compute", 10), ("io", 10), ("compute", 10), priority=10),
        job("b", 0, ("compute", 10)),
    ),
    gpus=1,
    cpu_slots=1,
)


def test_fifo_runs_jobs_exclusively_and_leaves_io_gaps_idle() -> None:
    assert times(IO_THEN_SHORT, "fifo") == {"a": (0, 30), "b": (30, 40)}
    m = compute_metrics(simulate(IO_THEN_SHORT, make_scheduler("fifo")))
    assert (m.busy_pct, m.idle_queued_pct, m.makespan_s) == (75.0, 25.0, 40.0)


def test_m27_runs_the_guest_in_the_primarys_io_gap() -> None:
    assert times(IO_THEN_SHORT, "m27") == {"a": (0, 30), "b": (0, 20)}
    m = compute_metrics(simulate(IO_THEN_SHORT, make_scheduler("m27")))
    assert (m.busy_pct, m.idle_queued_pct, m.makespan_s) == (100.0, 0.0, 30.0)


def test_m27_infers_io_after_io_timeout_when_the_step_gives_no_hint() -> None:
    trace = Trace(
        jobs=(
            job("a", 0, ("compute", 10), ("io", 10), ("compute", 10), priority=10, io_hint=False),
            job("b", 0, ("compute", 5)),
        ),
        gpus=1,
    )
    _, b_end = times(trace, "m27")["b"]
    assert b_end == pytest.approx(15.05)


def test_guest_is_promoted_without_restart_when_the_primary_ends() -> None:
    trace = Trace(
        jobs=(
            job("a", 0, ("compute", 10), ("io", 5), priority=10),
            job("b", 0, ("compute", 10)),
        ),
        gpus=1,
    )
    result = simulate(trace, make_scheduler("m27"))
    b = next(lv for lv in result.jobs if lv.job.id == "b/main")
    # b computed 5 s as a guest during a's I/O, then the rest as primary from t=15.
    assert (b.started_at, b.finished_at, b.role, b.tier) == (0, 20, "primary", "immediate")


def test_backfill_starts_a_short_job_that_ends_before_the_head_reservation() -> None:
    trace = Trace(
        jobs=(
            job("long", 0, ("compute", 100), time_limit=100.0),
            job("big", 1, ("compute", 10), gpus=2, time_limit=50.0),
            job("short", 2, ("compute", 30), time_limit=40.0),
            job("late", 3, ("compute", 30), time_limit=200.0),
        ),
        gpus=2,
    )
    t = times(trace, "backfill")
    assert t["short"] == (2, 32)
    assert t["big"] == (100, 110)
    assert t["late"] == (110, 140)
    assert times(trace, "fifo")["short"] == (110, 140)


def test_m27_backfills_a_short_step_into_a_gpu_held_for_a_multi_gpu_step() -> None:
    trace = Trace(
        jobs=(
            job("long", 0, ("compute", 100), time_limit=100.0),
            job("big", 1, ("compute", 10), gpus=2, time_limit=50.0, priority=10),
            job("short", 2, ("compute", 30), time_limit=40.0),
            job("late", 3, ("compute", 30), time_limit=200.0),
        ),
        gpus=2,
    )
    t = times(trace, "m27")
    # big holds both GPUs from t=1 until long's declared end (100); short ends by 42, so it
    # runs on the held GPU 1; late would end after 100, so it is no primary there: it is
    # loaded at once as a guest of long (it fits beside big), stays paused while long and
    # then big compute, and is promoted when big ends.
    assert t["short"] == (2, 32)
    assert t["big"] == (100, 110)
    assert t["late"] == (3, 140)


def test_manual_starts_jobs_after_a_delay_in_working_hours_only() -> None:
    trace = Trace(jobs=(job("a", 0, ("compute", 10)), job("b", 0, ("compute", 10))), gpus=1)
    t = times(trace, "manual")
    assert t["a"] == (9 * 3600, 9 * 3600 + 10)
    assert t["b"] == (9 * 3600 + 10 + 1800, 9 * 3600 + 20 + 1800)


def test_a_step_starts_only_after_its_upstream_step() -> None:
    trace = Trace(
        jobs=(
            Job("p/prep", 0, (("compute", 5),), type="cpu"),
            Job("p/md", 0, (("compute", 10),), depends_on=("p/prep",), gpu_memory=GIB),
        ),
        gpus=1,
    )
    result = simulate(trace, make_scheduler("m27"))
    md = next(lv for lv in result.jobs if lv.job.id == "p/md")
    assert (md.queued_at, md.started_at, md.finished_at) == (5, 5, 15)


def test_simulator_asks_the_real_policy_and_gets_the_same_decision() -> None:
    state = SimState(IO_THEN_SHORT, 1, primary=[None], guests=[[]])
    for j in IO_THEN_SHORT.jobs:
        from m27.sim.engine import Live

        state.pending[j.id] = Live(j, 0.0)
        state.by_key[j.key] = j.id
    sched = PolicyScheduler(PolicyConfig(cpu_slots=1))
    actions, _ = sched.step(state)
    direct = decide(
        PolicyInput(
            tuple(lv.pending for lv in state.pending.values()),
            (),
            sched.last_input.gpus if sched.last_input else (),
            0.0,
            PolicyConfig(cpu_slots=1),
        )
    )
    assert tuple(actions) == direct.actions


def test_every_policy_finishes_every_job_of_the_lab_week() -> None:
    trace = lab_week(seed=1, load=0.3)
    for result, m in compare(trace):
        assert m.unfinished == 0, result.policy
        assert 0.0 < m.busy_pct <= 100.0
        assert m.busy_pct + m.idle_queued_pct <= 100.0 + 1e-9


def test_lab_week_is_reproducible_from_its_seed() -> None:
    assert lab_week(seed=3) == lab_week(seed=3)
    assert lab_week(seed=3) != lab_week(seed=4)
    week = lab_week(seed=3)
    assert week.gpus == 4 and week.window == 72 * 3600
    assert {j.type for j in week.jobs} == {"cpu", "gpu", "gpu_light"}


def test_trace_file_round_trips_and_bad_lines_name_their_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    save_trace(IO_THEN_SHORT, path)
    assert load_trace(path) == IO_THEN_SHORT
    path.write_text(path.read_text() + '{"id": "x"}\n')
    with pytest.raises(SpecError) as err:
        load_trace(path)
    assert err.value.context["line"] == 4


def test_alibaba_rows_map_qos_to_classes_and_gpu_share_to_io_gaps() -> None:
    jobs = load_alibaba(DATA / "openb_pod_list_sample.csv")
    assert jobs and all(j.gpus >= 1 for j in jobs)
    assert {j.klass for j in jobs} == {"high", "normal", "low"}
    shared = next(j for j in jobs if len(j.phases) > 1)
    share = shared.phases[0][1] / (shared.phases[0][1] + shared.phases[1][1])
    assert 0.0 < share < 1.0
    assert shared.gpu_memory == pytest.approx(32 * GIB * share, rel=0.01)
    trace = scale_to_node(jobs, gpus=8, load=0.9)
    span = max(j.arrival for j in trace.jobs)
    work = sum(j.duration_s * j.gpus for j in trace.jobs)
    assert work / (8 * span) == pytest.approx(0.9)


def test_event_log_becomes_a_trace_of_what_ran() -> None:
    log = [
        ev.RunSubmitted(at=100.0, run_id="r1", pipeline="p", spec_path="p.yaml",
                        steps=("prep", "md"), owner="ann", priority=7),
        ev.StepQueued(at=100.0, run_id="r1", step="prep", type="cpu"),
        ev.StepQueued(at=100.0, run_id="r1", step="md", type="gpu", gpus=1,
                      gpu_memory=4 * GIB, depends_on=("prep",)),
        ev.StepSucceeded(at=130.0, run_id="r1", step="prep", attempt=1, duration_s=30.0),
        ev.StepRequested(at=130.0, run_id="r1", step="md", type="gpu", gpus=1,
                         owner="ann", time_limit=600.0),
        ev.StepStarted(at=130.0, run_id="r1", step="md", attempt=1, pid=1, pgid=1,
                       command=("md",), gpus=(0,)),
        ev.GuestPaused(at=140.0, run_id="r1", step="md", gpu=0),
        ev.GuestResumed(at=150.0, run_id="r1", step="md", gpu=0),
        ev.StepSucceeded(at=230.0, run_id="r1", step="md", attempt=1, duration_s=100.0),
    ]  # fmt: skip
    trace = trace_from_events(log, gpus=2)
    md = next(j for j in trace.jobs if j.id == "r1/md")
    assert (md.arrival, md.phases, md.depends_on) == (0.0, (("compute", 90.0),), ("r1/prep",))
    assert (md.owner, md.priority, md.gpu_memory) == ("ann", 7, 4 * GIB)
    assert md.time_limit == 600.0  # the step's declared timeout, for backfill
    assert simulate(trace, make_scheduler("fifo")).end == 120.0


def test_p95_is_nearest_rank() -> None:
    assert p95([]) == 0.0
    assert p95([float(i) for i in range(1, 101)]) == 95.0
    assert p95([3.0]) == 3.0


def test_simulate_command_prints_json_and_writes_a_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from m27.cli import main

    path = tmp_path / "t.jsonl"
    save_trace(IO_THEN_SHORT, path)
    report = tmp_path / "r.html"
    assert (
        main(["simulate", str(path), "--json", "--policy", "fifo,m27", "--report", str(report)])
        == 0
    )
    import json

    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(x["policy"], x["busy_pct"]) for x in lines] == [("fifo", 75.0), ("m27", 100.0)]
    assert "<svg" in report.read_text()
    assert main(["simulate", str(path), "--policy", "nope"]) == 2
    assert main(["simulate", str(tmp_path / "missing.jsonl")]) == 2


def test_the_simulators_lease_views_and_inputs_equal_the_real_constructors() -> None:
    """The simulator fills frozen inputs without their generated ``__init__`` (speed): each
    must carry every field, with the value the real constructor gives, defaults included."""
    from dataclasses import fields

    from m27.policy import Running
    from m27.sim.engine import Live
    from m27.sim.schedulers import _running

    j = job("a", 3.0, ("io", 5), ("compute", 10), priority=7, owner="ann", io_hint=True)
    lv = Live(j, 3.0)
    lv.role, lv.tier, lv.gpus, lv.paused, lv.started_at = "guest", "ready", (1,), True, 4.0
    built = _running(lv)
    real = Running(
        key=j.key, type="gpu", role="guest", tier="ready", gpus=(1,), paused=True,
        gpu_memory=8 * GIB, priority=7, owner="ann", queued_at=3.0, started_at=4.0,
        time_limit=None, io_waiting=True,
    )  # fmt: skip
    assert built == real and hash(built) == hash(real)
    assert set(vars(built)) == {f.name for f in fields(Running)}
    from m27.policy import GpuView
    from m27.sim.schedulers import _io_view

    view, real_view = _io_view(2, 8 * GIB, 5.0), GpuView(2, 8 * GIB, None, False, 0.0, 5.0)
    assert view == real_view and hash(view) == hash(real_view)
    assert set(vars(view)) == {f.name for f in fields(GpuView)}
    sched = PolicyScheduler(PolicyConfig(cpu_slots=1))
    state = SimState(IO_THEN_SHORT, 1, primary=[None], guests=[[]])
    sched.step(state)
    inp = sched.last_input
    assert inp is not None
    assert set(vars(inp)) == {f.name for f in fields(PolicyInput)}
    assert inp == PolicyInput((), (), inp.gpus, 0.0, PolicyConfig(cpu_slots=1), {})
    # decide() builds its Decision the same way: every field, as the constructor would
    from m27.policy import Decision

    d = decide(inp)
    assert set(vars(d)) == {f.name for f in fields(Decision)}
    assert d == Decision((), None) and d.reasons == {} and d.standby == {}


def test_the_table_shows_short_times_in_their_own_unit() -> None:
    """A lab week reads in hours; a replayed log of short steps read `0.0h/0.0h`."""
    week = Metrics("m27", 4, 72 * 3600.0, 81.8, 4.0, 71.6 * 3600, 118, 118, 0)
    week.jct["high"] = {"mean_s": 4.9 * 3600, "p95_s": 10.1 * 3600}
    short = Metrics("fifo", 2, 3600.0, 0.5, 0.0, 5.5 * 3600, 391, 391, 0)
    short.jct["high"] = {"mean_s": 0.661, "p95_s": 3.0}
    rows = {line.split()[0]: line.split() for line in table([week, short]).splitlines()[1:]}
    assert rows["m27"][3] == "71.6h" and rows["m27"][5] == "4.9h/10.1h"
    assert rows["fifo"][5] == "661ms/3.0s"
