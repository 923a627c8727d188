"""What the agent reports besides leases: GPU health alerts, its live GPU snapshot for
`m27 gpus`, and surviving a GPU backend that fails."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pytest

from m27 import events as ev
from m27._exceptions import GpuError
from m27.cli.commands import gpus
from m27.clock import FakeClock
from m27.gpu import GpuInfo, GpuSample
from m27.gpu.sim import SimBackend
from m27.node.book import Book
from m27.node.report import SNAPSHOT_NAME, read_snapshot, snapshot, write_snapshot
from tests.unit.agent_helpers import GiB, Node, make_node, run_step_leased, step_argv
from tests.waiting import wait_until


def _hand_node(home: Path, gpus: int = 2) -> tuple[Node, FakeClock]:
    node = make_node(home, gpus=gpus)
    clock = FakeClock()
    node.agent.clock = clock
    node.agent.start()
    return node, clock


def _tick(node: Node, clock: FakeClock, seconds: float = 1.0) -> None:
    clock.advance(seconds)
    node.agent.poll()
    node.agent.tick()


def test_a_hot_gpu_is_reported_once_per_crossing_of_the_threshold(m27_home: Path) -> None:
    node, clock = _hand_node(m27_home)
    sim = node.backend
    _tick(node, clock)
    assert node.of(ev.GpuOverheated) == []  # 30 °C idle
    sim.set_temperature(1, 86.0)
    for _ in range(3):
        _tick(node, clock)
    sim.set_temperature(1, 78.0)  # below 80, but within the 5 °C hysteresis: not re-armed
    _tick(node, clock)
    sim.set_temperature(1, 81.0)
    _tick(node, clock)
    hot = node.of(ev.GpuOverheated)
    assert [(e.gpu, e.temperature_c, e.threshold_c) for e in hot] == [(1, 86.0, 80.0)]  # type: ignore[attr-defined]
    assert hot[0].uuid == "GPU-sim-0001"  # type: ignore[attr-defined]
    sim.set_temperature(1, 60.0)  # cooled down: the next crossing alerts again
    _tick(node, clock)
    sim.set_temperature(1, 90.0)
    _tick(node, clock)
    assert [e.temperature_c for e in node.of(ev.GpuOverheated)] == [86.0, 90.0]  # type: ignore[attr-defined]
    node.close()


def test_thermal_or_power_throttling_is_reported_once_and_idling_is_not(m27_home: Path) -> None:
    node, clock = _hand_node(m27_home)
    sim = node.backend
    for _ in range(2):
        _tick(node, clock)  # idle GPUs say "gpu_idle": normal, no alert
    sim.set_throttle(0, {"hw_thermal", "sw_power_cap"})
    for _ in range(3):
        _tick(node, clock)
    (first,) = node.of(ev.GpuThrottled)
    assert (first.gpu, first.reasons) == (0, ("hw_thermal", "sw_power_cap"))  # type: ignore[attr-defined]
    sim.set_throttle(0, None)
    _tick(node, clock, 10)
    sim.set_throttle(0, {"sw_power_cap"})  # back within a minute: the same episode
    _tick(node, clock)
    assert len(node.of(ev.GpuThrottled)) == 1
    sim.set_throttle(0, None)
    _tick(node, clock, 1)
    _tick(node, clock, 61)  # a minute clear: re-armed
    sim.set_throttle(0, {"hw_slowdown"})
    _tick(node, clock)
    assert [e.reasons for e in node.of(ev.GpuThrottled)] == [  # type: ignore[attr-defined]
        ("hw_thermal", "sw_power_cap"),
        ("hw_slowdown",),
    ]
    with pytest.raises(GpuError, match="unknown throttle"):
        sim.set_throttle(0, {"too_hot"})
    node.close()


class _Flaky(SimBackend):
    """A backend whose whole sampling pass fails while `broken` is set (a driver error)."""

    broken = False

    def sample(self, now: float) -> list[GpuSample]:
        if self.broken:
            raise GpuError("NVML: Unknown Error")
        return super().sample(now)


def test_the_agent_survives_a_failing_backend_with_fields_unknown(m27_home: Path) -> None:
    from m27.node.agent import Agent
    from m27.policy import PolicyConfig
    from m27.store.sqlite import SqliteEventStore

    store = SqliteEventStore(m27_home / "events.db")
    backend = _Flaky(1, memory_total=16 * GiB)
    clock = FakeClock()
    agent = Agent(store, backend, m27_home, config=PolicyConfig(), clock=clock, tick=0.01)
    agent.start()
    backend.broken = True
    store.append([ev.StepRequested(at=clock.now(), run_id="r", step="s", type="gpu", gpus=1)])
    agent.poll()
    agent.tick()  # no exception: the request is still served
    grants = [r.event for r in store.read() if isinstance(r.event, ev.LeaseGranted)]
    assert [(g.step, g.gpus) for g in grants] == [("s", (0,))]
    assert not any(isinstance(r.event, ev.GpuLost) for r in store.read())
    snap = read_snapshot(m27_home, now=clock.now())
    assert snap is not None
    (row,) = snap["gpus"]
    assert row["utilization_gpu"] is None and row["temperature_c"] is None
    assert row["memory_total"] == 16 * GiB and row["lost"] is False
    backend.broken = False
    clock.advance(2)
    agent.poll()
    agent.tick()
    snap = read_snapshot(m27_home, now=clock.now())
    assert snap is not None and snap["gpus"][0]["temperature_c"] is not None
    agent.close()
    store.close()


def _gpus_json(capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    assert gpus.run(argparse.Namespace(json=True, watch=None, count=0)) == 0
    rows: list[dict[str, object]] = json.loads(capsys.readouterr().out)
    return rows


def test_m27_gpus_shows_the_agents_live_utilization_and_steps(
    m27_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = make_node(m27_home, gpus=2)
    node.agent.snapshot_every = 0.0  # every tick, so the test need not wait a second
    node.start()
    lease = node.lease()
    flag = tmp_path / "finish"
    step = run_step_leased(
        lease,
        "r1",
        "md",
        step_argv(tmp_path / "o.txt", compute=0.05, io=0.0, until=flag),
        gpu_memory=3 * GiB,
    )
    wait_until(lambda: bool(node.of(ev.StepStarted)))
    (grant,) = node.of(ev.LeaseGranted)
    gpu = grant.gpus[0]  # type: ignore[attr-defined]

    def computing() -> bool:
        snap = read_snapshot(m27_home)
        return snap is not None and snap["gpus"][gpu]["utilization_gpu"] == 100.0

    wait_until(computing)
    rows = _gpus_json(capsys)
    assert rows[gpu]["primary"] == ["r1/md"] and rows[gpu]["memory_used"] == 3 * GiB
    assert rows[gpu]["utilization_gpu"] == 100.0 and rows[1 - gpu]["utilization_gpu"] == 0.0
    assert gpus.run(argparse.Namespace(json=False, watch=0.0, count=2)) == 0
    out = capsys.readouterr().out
    assert out.count("live from the agent") == 2 and out.count("r1/md") == 2
    flag.write_text("done")
    result = step.wait()
    assert result is not None and result.ok
    lease.close()
    node.close()
    # a cleanly stopped agent takes its snapshot away: m27 gpus samples the GPUs itself
    assert not (m27_home / SNAPSHOT_NAME).exists()
    rows = _gpus_json(capsys)
    assert [r["utilization_gpu"] for r in rows] == [0.0, 0.0]


def test_a_stale_snapshot_or_one_from_a_dead_agent_is_not_shown(m27_home: Path) -> None:
    info = GpuInfo(0, "GPU-x", "x", GiB)
    samples = [GpuSample(info.index, info.uuid, info.name, 0.0, utilization_gpu=55.0)]
    now = time.time()
    write_snapshot(m27_home, snapshot(samples, Book(), "sim", now))
    assert read_snapshot(m27_home, now=now) is not None
    assert read_snapshot(m27_home, now=now + 60) is None  # the agent stopped writing
    write_snapshot(m27_home, snapshot(samples, Book(), "sim", now, pid=2**22 + 12345))
    assert read_snapshot(m27_home, now=now) is None  # its writer is gone (kill -9)
    reused = dict(snapshot(samples, Book(), "sim", now), pid_started=1.0)
    write_snapshot(m27_home, reused)
    assert read_snapshot(m27_home, now=now) is None  # its pid now names another process
    (m27_home / SNAPSHOT_NAME).write_text("{half a fi")
    assert read_snapshot(m27_home, now=now) is None


def test_m27_gpus_without_an_agent_shows_who_holds_each_gpu_from_the_running_runs_alone(
    m27_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With no agent (say it crashed) the steps on each GPU come from the log, and from
    the events of the runs it has as running only, not the node's whole history."""
    from m27.store.sqlite import SqliteEventStore, open_store

    monkeypatch.setenv("M27_GPUS", "sim:2")
    now = time.time()
    old = [ev.RunSubmitted(at=now, run_id=f"old{i}", pipeline="p", spec_path="p.yaml",
                           steps=("s",)) for i in range(30)]  # fmt: skip
    for i in range(30):
        old += [
            ev.LeaseGranted(at=now, run_id=f"old{i}", step="s", gpus=(i % 2,), tier="immediate"),
            ev.LeaseReleased(at=now, run_id=f"old{i}", step="s", gpus=(i % 2,)),
            ev.RunSucceeded(at=now, run_id=f"old{i}", duration_s=1.0),
        ]
    store = open_store(m27_home)
    store.append(old)
    store.append(
        [
            ev.RunSubmitted(at=now, run_id="r1", pipeline="p", spec_path="p.yaml",
                            steps=("md", "light")),
            ev.LeaseGranted(at=now, run_id="r1", step="md", gpus=(1,), tier="immediate"),
            ev.LeaseGranted(at=now, run_id="r1", step="light", gpus=(1,), tier="ready"),
            ev.GuestStarted(at=now, run_id="r1", step="light", gpu=1),
        ]
    )  # fmt: skip
    store.close()

    def whole_log(*args: object, **kwargs: object) -> None:
        raise AssertionError("m27 gpus read the whole log")

    monkeypatch.setattr(SqliteEventStore, "read", whole_log)
    rows = _gpus_json(capsys)
    assert [(r["primary"], r["guests"]) for r in rows] == [([], []), (["r1/md"], ["r1/light"])]
