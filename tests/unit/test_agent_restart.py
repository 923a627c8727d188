"""Crashes and handovers: agent kill -9 and restart, a lost GPU, two pipeline processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from m27 import events as ev
from m27.node.lease import AgentLease
from m27.store.sqlite import SqliteEventStore
from tests.unit.agent_helpers import ROOT, make_node, run_step_leased, step_argv
from tests.waiting import wait_until


def _env(home: Path, gpus: str) -> dict[str, str]:
    env = dict(os.environ, M27_HOME=str(home), M27_GPUS=gpus)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _events(store: SqliteEventStore) -> list[ev.Event]:
    return [r.event for r in store.read()]


def _agent(home: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "m27.cli.commands.agent"],
        env=_env(home, "sim:2"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


#: A process that asks for a lease and runs one step under it, then never ends.
REQUESTER = textwrap.dedent("""\
    import sys, threading
    from pathlib import Path
    from m27.node.lease import AgentLease, run_leased
    from m27.executors.local import StepLaunch
    from m27.store.sqlite import open_store
    home = Path(sys.argv[1])
    lease = AgentLease(open_store(home), home, embed=False)
    run_leased(lease, StepLaunch("r2", "lost", tuple(sys.argv[2:])), "gpu",
               cancel=threading.Event(), gpu_memory=2**30)
""")


def test_a_restarted_agent_readopts_live_steps_and_releases_lost_ones(
    m27_home: Path, tmp_path: Path
) -> None:
    store = SqliteEventStore(m27_home / "events.db")
    first = _agent(m27_home)
    wait_until(lambda: any(isinstance(e, ev.AgentStarted) for e in _events(store)))
    lease = AgentLease(store, m27_home, embed=False)
    flag = tmp_path / "finish"
    live = run_step_leased(lease, "r1", "live", step_argv(tmp_path / "l.txt", until=flag))
    requester = subprocess.Popen(
        [sys.executable, "-c", REQUESTER, str(m27_home), *step_argv(tmp_path / "x.txt", 10**6)],
        env=_env(m27_home, "sim:2"),
    )

    def started(step: str) -> list[ev.StepStarted]:
        return [e for e in _events(store) if isinstance(e, ev.StepStarted) and e.step == step]

    wait_until(lambda: bool(started("live")) and bool(started("lost")))

    first.kill()  # kill -9: no cleanup at all
    first.wait()
    requester.kill()
    requester.wait()
    os.killpg(started("lost")[0].pgid, signal.SIGKILL)  # its step dies with it
    nxt = run_step_leased(lease, "r3", "next", step_argv(tmp_path / "n.txt", cycles=1))
    wait_until(
        lambda: any(isinstance(e, ev.StepRequested) and e.step == "next" for e in _events(store))
    )
    before = len(_events(store))

    second = _agent(m27_home)
    try:
        result = nxt.wait()
        assert result is not None and result.ok
        after = _events(store)[before:]
        assert [type(e).__name__ for e in after][:1] == ["AgentStarted"]
        # the lost step: lease released and the step marked failed, by the new agent
        released = [e for e in after if isinstance(e, ev.LeaseReleased) and e.step == "lost"]
        failed = [e for e in after if isinstance(e, ev.StepFailed) and e.step == "lost"]
        assert len(released) == 1 and len(failed) == 1 and "lost" in failed[0].reason
        assert failed[0].attempt == started("lost")[0].attempt  # the attempt that was lost
        # the live step keeps its lease and GPU: the next step gets the freed GPU only
        live_gpus = next(
            e.gpus for e in _events(store) if isinstance(e, ev.LeaseGranted) and e.step == "live"
        )
        (grant,) = [e for e in after if isinstance(e, ev.LeaseGranted) and e.step == "next"]
        assert grant.gpus != live_gpus and grant.tier == "immediate"
        assert not any(getattr(e, "step", "") == "live" for e in after if e.kind != "StepStarted")
        assert len(started("live")) == 1  # never restarted
        flag.write_text("done")
        live_result = live.wait()
        assert live_result is not None and live_result.ok
    finally:
        second.terminate()
        second.wait(10)
        lease.close()
        store.close()


def test_a_lost_gpu_requeues_its_step_on_another_gpu(m27_home: Path, tmp_path: Path) -> None:
    node = make_node(m27_home, gpus=2).start()
    lease = node.lease()
    flag = tmp_path / "finish"
    step = run_step_leased(lease, "r1", "md", step_argv(tmp_path / "o.txt", until=flag))
    wait_until(lambda: bool(node.of(ev.StepStarted)))
    (first,) = node.of(ev.LeaseGranted)
    node.backend.lose(first.gpus[0])  # type: ignore[attr-defined]
    wait_until(lambda: len(node.of(ev.StepStarted)) == 2)
    flag.write_text("done")
    result = step.wait()
    assert result is not None and result.ok
    grants = node.of(ev.LeaseGranted)
    assert len(grants) == 2 and grants[0].gpus != grants[1].gpus  # type: ignore[attr-defined]
    (lost,) = node.of(ev.GpuLost)
    assert lost.gpu == first.gpus[0]  # type: ignore[attr-defined]
    kinds = [  # the measured GPU memory is recorded after the release (m27.node.memory)
        e.kind
        for e in node.events()
        if getattr(e, "step", "") == "md" and e.kind != "StepMemoryMeasured"
    ]
    assert kinds.count("LeaseReleased") == 2 and kinds[-2:] == ["StepSucceeded", "LeaseReleased"]
    # stopped to ask again, not cancelled: `m27 run` said `md: cancelled`, `m27 status`
    # showed it cancelled while it waited for the other GPU
    assert "StepCancelled" not in kinds
    (requeued,) = node.of(ev.StepRequeued)
    assert (requeued.attempt, requeued.reason) == (1, f"GPU {first.gpus[0]} lost")  # type: ignore[attr-defined]
    assert (
        kinds.index("StepRequeued") < kinds.index("LeaseReleased") < kinds.index("StepRequested", 1)
    )
    # and so does its log: `m27 logs` showed `=== attempt 1 cancelled ===`
    log = (m27_home / "runs" / "r1" / "md.log").read_text()
    assert f"=== attempt 1 stopped: GPU {first.gpus[0]} lost; requeued ===" in log, log
    assert "cancelled" not in log, log
    lease.close()
    node.close()


#: One pipeline process: embeds the agent if the node has none, runs its steps in order.
PIPELINE = textwrap.dedent("""\
    import sys, threading
    from pathlib import Path
    from m27.node.embed import ensure_agent
    from m27.node.lease import AgentLease, run_leased
    from m27.executors.local import StepLaunch
    from m27.store.sqlite import open_store
    home, run, n, argv = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), tuple(sys.argv[4:])
    agent = ensure_agent(home)
    lease = AgentLease(open_store(home), home)
    for i in range(n):
        r = run_leased(lease, StepLaunch(run, f"s{i}", argv), "gpu",
                       cancel=threading.Event(), gpu_memory=2**30)
        assert r is not None and r.ok, r
    lease.close()
    if agent is not None:
        agent.stop()
""")


def test_two_pipelines_in_two_processes_share_one_gpu(m27_home: Path, tmp_path: Path) -> None:
    store = SqliteEventStore(m27_home / "events.db")

    def pipeline(
        run: str, n: int, cycles: int, until: Path | None = None
    ) -> subprocess.Popen[bytes]:
        out = tmp_path / f"{run}.txt"
        argv = step_argv(out, cycles=cycles, compute=0.1, io=0.1, until=until)
        return subprocess.Popen(
            [sys.executable, "-c", PIPELINE, str(m27_home), run, str(n), *argv],
            env=_env(m27_home, "sim:1"),
        )

    # The first pipeline's step runs until the second pipeline holds the GPU beside it:
    # the overlap is made by the order of events, not by how fast a process starts.
    flag = tmp_path / "one-may-finish"
    one = pipeline("one", 1, cycles=0, until=flag)
    wait_until(lambda: any(isinstance(e, ev.AgentStarted) for e in _events(store)))
    two = pipeline("two", 3, cycles=2)
    wait_until(
        lambda: any(isinstance(e, ev.LeaseGranted) and e.run_id == "two" for e in _events(store)),
        timeout=60,
        what="the second pipeline's first lease",
    )
    flag.write_text("done")
    assert one.wait(120) == 0 and two.wait(120) == 0
    events = _events(store)
    done = {(e.run_id, e.step) for e in events if isinstance(e, ev.StepSucceeded)}
    assert done == {("one", "s0"), ("two", "s0"), ("two", "s1"), ("two", "s2")}
    # the second process took the node over when the first one ended
    assert [e.pid for e in events if isinstance(e, ev.AgentStarted)] == [one.pid, two.pid]
    # never two primaries on the GPU at once
    primary: set[tuple[str, str]] = set()
    guests: set[tuple[str, str]] = set()
    shared = False
    for e in events:
        key = (getattr(e, "run_id", ""), getattr(e, "step", ""))
        if isinstance(e, ev.LeaseGranted):
            (guests if e.tier == "ready" else primary).add(key)
        elif isinstance(e, ev.GuestStarted):
            primary.discard(key)
            guests.add(key)
        elif isinstance(e, ev.Promoted):
            guests.discard(key)
            primary.add(key)
        elif isinstance(e, ev.LeaseReleased):
            primary.discard(key)
            guests.discard(key)
        assert len(primary) <= 1, e
        shared = shared or {k[0] for k in primary | guests} == {"one", "two"}
    assert shared  # both pipelines held the GPU at once: one primary, one guest
    store.close()


@pytest.mark.parametrize("held_by_other", [True, False])
def test_ensure_agent_embeds_only_when_no_other_process_holds_the_node(
    m27_home: Path, held_by_other: bool
) -> None:
    from m27.node.embed import NodeLock, ensure_agent

    other = NodeLock(m27_home)  # a separate open file: the same as another process
    if held_by_other:
        assert other.acquire()
    agent = ensure_agent(m27_home)
    try:
        assert (agent is None) == held_by_other
        if agent is not None:
            assert not other.acquire()
            assert ensure_agent(m27_home) is agent  # one per process
    finally:
        if agent is not None:
            agent.stop()
        other.release()
    if agent is not None:
        assert other.acquire()  # stopping gives the node back
        other.release()


SERVICE_WAITING = """
import sys, time
from pathlib import Path
from m27.node.embed import NodeLock, request_handover, withdraw_handover
home = Path(sys.argv[1])
lock = NodeLock(home)
request_handover(home)
print("asked", flush=True)
deadline = time.monotonic() + 60
while not lock.acquire():
    if time.monotonic() > deadline:
        print("still held", flush=True)
        sys.exit(1)
    time.sleep(0.05)
withdraw_handover(home)
print("acquired", flush=True)
sys.stdin.read()  # hold the node until the test is done
"""


def test_an_embedded_agent_hands_the_node_to_a_service_that_asks(m27_home: Path) -> None:
    """A service started while a run held the agent (it took it over when the last service
    stopped) waited for that run to end: days for an MD run, and every `m27 run` meanwhile
    failed with `the node service was not ready after 240s`."""
    from m27.node.embed import HANDOVER_NAME, ensure_agent, handover_wanted

    agent = ensure_agent(m27_home)
    assert agent is not None and agent.alive
    service = subprocess.Popen(
        [sys.executable, "-c", SERVICE_WAITING, str(m27_home)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert service.stdout is not None
        assert service.stdout.readline().strip() == "asked"
        assert service.stdout.readline().strip() == "acquired"
        wait_until(lambda: not agent.alive, timeout=30, what="the embedded agent stopped")
        assert not (m27_home / HANDOVER_NAME).exists() and not handover_wanted(m27_home)
        assert ensure_agent(m27_home) is None  # the service's agent serves this process now
    finally:
        service.stdin.close()  # type: ignore[union-attr]
        service.wait(30)
        agent.stop()


def test_no_process_embeds_an_agent_while_a_service_waits_and_a_dead_ones_ask_is_ignored(
    m27_home: Path,
) -> None:
    from m27 import liveness
    from m27.node.embed import HANDOVER_NAME, ensure_agent

    parent = os.getppid()  # alive (pytest's parent), and not this process
    (m27_home / HANDOVER_NAME).write_text(f"{parent} {liveness.start_time(parent)}\n")
    assert ensure_agent(m27_home) is None
    (m27_home / HANDOVER_NAME).write_text("999999999 12.5\n")  # a service that died waiting
    agent = ensure_agent(m27_home)
    try:
        assert agent is not None and agent.alive
    finally:
        if agent is not None:
            agent.stop()
