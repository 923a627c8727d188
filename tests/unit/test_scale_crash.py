"""Crash truth: a run whose process died is found, its orphans stopped, and the log closed."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

from m27 import events as ev
from m27 import liveness
from m27.clock import FakeClock
from m27.events.state import fold
from m27.node import crash
from m27.store.memory import MemoryEventStore

HOST = socket.gethostname()


def started_run(
    store: MemoryEventStore,
    pid: int,
    step_pid: int = 4242,
    flow_run_id: str | None = "0b6f6b5e-2f4b-4c2a-9a57-5d2b1c7e9f00",
) -> None:
    store.append(
        [
            ev.RunSubmitted(
                at=1.0,
                run_id="r",
                pipeline="p",
                spec_path="",
                steps=("md", "an"),
                flow_run_id=flow_run_id,
                pid=pid,
                host=HOST,
            ),
            ev.LeaseGranted(at=2.0, run_id="r", step="md", gpus=(0,)),
            ev.StepStarted(
                at=2.0,
                run_id="r",
                step="md",
                attempt=1,
                pid=step_pid,
                pgid=step_pid,
                command=("md",),
            ),
            ev.StepRequested(at=2.0, run_id="r", step="an", type="gpu_light"),
        ]
    )


def test_a_running_run_with_a_dead_pid_on_this_host_is_found() -> None:
    store = MemoryEventStore()
    started_run(store, pid=111)
    found = crash.dead_runs(fold(store.read()), HOST, is_alive=lambda pid, _started: pid != 111)
    assert [f.run_id for f in found] == ["r"]
    assert found[0].flow_run_id is not None


def test_live_runs_other_hosts_and_busy_runs_are_left_alone() -> None:
    store = MemoryEventStore()
    started_run(store, pid=111)
    state = fold(store.read())
    assert crash.dead_runs(state, HOST, is_alive=lambda pid, _started: True) == []
    assert crash.dead_runs(state, "other-host", is_alive=lambda pid, _started: False) == []
    assert crash.dead_runs(state, HOST, lambda pid, _s: False, is_busy=lambda r: r == "r") == []


def test_an_admitted_run_whose_worker_died_before_it_started_is_found() -> None:
    store = MemoryEventStore()
    store.append(
        [
            ev.RunAdmitted(
                at=1.0, run_id="a", flow_run_id="f", tier="ready", host=HOST, worker_pid=222
            )
        ]
    )
    found = crash.dead_runs(fold(store.read()), HOST, is_alive=lambda pid, _started: False)
    assert [f.run_id for f in found] == ["a"]
    crash.finalize(store, "a", found[0].reason)
    assert fold(store.read()).admitted == {}


def test_finalize_stops_orphans_releases_leases_and_records_the_crash() -> None:
    store = MemoryEventStore()
    started_run(store, pid=111)
    stopped: list[tuple[int, int]] = []

    def stop(pgid: int, pid: int, grace: float, clock: Any) -> int:
        stopped.append((pgid, pid))
        return 15

    out = crash.finalize(store, "r", "gone", clock=FakeClock(10.0), stop=stop)
    assert stopped == [(4242, 4242)]
    assert [type(e).__name__ for e in out] == [
        "StepFailed",
        "StepCancelled",
        "LeaseReleased",
        "RunCrashed",
    ]
    state = fold(store.read())
    run = state.runs["r"]
    assert run.status == "failed" and run.reason == "crashed: gone"
    assert run.steps["md"].status == "failed" and run.steps["md"].signal == 15
    assert run.failed_steps == ("md",)
    assert state.leases == {} and state.requests == {}
    assert crash.finalize(store, "r", "again", stop=stop) == []  # idempotent


def test_finalize_as_cancelled_ends_in_run_cancelled() -> None:
    store = MemoryEventStore()
    started_run(store, pid=111)
    out = crash.finalize(
        store, "r", "cancelled from Prefect", outcome="cancelled", stop=lambda *a: 15
    )
    assert isinstance(out[-1], ev.RunCancelled)
    assert fold(store.read()).runs["r"].steps["md"].status == "cancelled"


def test_finalize_cancels_a_slurm_step_and_never_signals_process_group_0() -> None:
    """A Slurm step runs elsewhere (pid 0 in the log): scancel it; killpg(0) would stop
    the caller's own process group (the node service)."""
    store = MemoryEventStore()
    started_run(store, pid=111, step_pid=0)
    conf = "/site/cluster-b/slurm.conf"  # not the one in this process's environment
    store.append([ev.SlurmJobSubmitted(2.5, "r", "md", job_id="4711", attempt=1, slurm_conf=conf)])
    stopped: list[tuple[int, int]] = []
    cancelled: list[tuple[str, str]] = []

    def stop(pgid: int, pid: int, grace: float, clock: Any) -> int:
        stopped.append((pgid, pid))
        return 15

    out = crash.finalize(
        store,
        "r",
        "gone",
        outcome="cancelled",
        stop=stop,
        cancel_job=lambda job, conf: cancelled.append((job, conf)),
    )
    assert cancelled == [("4711", conf)] and stopped == []
    assert [type(e).__name__ for e in out][:2] == ["StepCancelled", "StepCancelled"]
    assert fold(store.read()).runs["r"].status == "cancelled"


def test_a_step_without_pid_or_job_is_closed_without_any_signal() -> None:
    store = MemoryEventStore()
    started_run(store, pid=111, step_pid=0)
    stopped: list[int] = []

    def stop(pgid: int, pid: int, grace: float, clock: Any) -> int:
        stopped.append(pgid)
        return 15

    out = crash.finalize(store, "r", "gone", stop=stop)
    assert stopped == [] and isinstance(out[-1], ev.RunCrashed)


def test_stop_group_kills_a_real_process_group(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        sig = crash._stop_group(proc.pid, proc.pid, 5.0, FakeClock(0.0))
        proc.wait(timeout=5)
        assert sig is not None and proc.returncode is not None
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_reused_pid_does_not_keep_a_dead_run_running() -> None:
    """The flow process died and a stranger got its pid: the start time tells them apart."""
    store = MemoryEventStore()
    me = os.getpid()
    mine = liveness.own_start_time()
    assert mine is not None
    for run_id, started in (("gone", mine - 3600.0), ("mine", mine), ("old-log", None)):
        store.append(
            [
                ev.RunSubmitted(
                    at=1.0,
                    run_id=run_id,
                    pipeline="p",
                    spec_path="",
                    steps=(),
                    pid=me,
                    host=HOST,
                    pid_started=started,
                )
            ]
        )
    found = crash.dead_runs(fold(store.read()), HOST)
    assert [f.run_id for f in found] == ["gone"]  # a log without start times trusts the pid


class FakePrefect:
    def __init__(self) -> None:
        self.set: list[tuple[Any, Any]] = []

    async def read_flow_run(self, flow_run_id: Any) -> Any:
        from prefect.states import Running

        class FR:
            state = Running()

        return FR()

    async def set_flow_run_state(self, flow_run_id: Any, state: Any, force: bool) -> None:
        self.set.append((flow_run_id, state))


def test_sweep_closes_dead_runs_and_marks_them_crashed_in_prefect() -> None:
    store = MemoryEventStore()
    started_run(store, pid=111)
    client = FakePrefect()
    lines: list[str] = []
    closed = asyncio.run(
        crash.sweep(
            store,
            client,
            host=HOST,
            is_alive=lambda pid, _started: False,
            clock=FakeClock(5.0),
            log=lines.append,
            stop=lambda *a: 9,
        )
    )
    assert [c.run_id for c in closed] == ["r"]
    assert client.set and client.set[0][1].type.value == "CRASHED"
    assert any("crashed" in line for line in lines)


def test_m27_cancel_of_a_run_whose_process_died_stops_its_steps_and_frees_its_gpu(
    m27_home: Path, capsys: Any
) -> None:
    """`m27 cancel` closes a dead run the way the crash watcher does: the step's process
    group is stopped, its lease released, the run recorded cancelled."""
    import argparse

    from m27.cli.commands import cancel
    from m27.store.sqlite import open_store
    from tests.waiting import wait_until

    dead = subprocess.Popen(["true"])
    dead.wait()
    step = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        with open_store(m27_home) as store:
            # no Prefect flow run: there is no Prefect server to tell, none is started
            started_run(store, pid=dead.pid, step_pid=step.pid, flow_run_id=None)  # type: ignore[arg-type]
        assert cancel.run(argparse.Namespace(run_id="r", wait=5.0, steps=[])) == 0
        wait_until(lambda: step.poll() is not None, what="the step's group stopped")
    finally:
        if step.poll() is None:
            step.kill()
        step.wait()
    assert "cancelled (its process had died" in capsys.readouterr().out
    with open_store(m27_home) as store:
        state = fold(store.read())
    assert state.runs["r"].status == "cancelled" and state.leases == {}
    assert state.runs["r"].steps["md"].status == "cancelled"
