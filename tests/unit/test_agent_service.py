"""`m27 agent` as a service: it says it started, serves the node alone, stops cleanly on
SIGTERM and gives the node to the next agent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from m27 import events as ev
from m27.node.embed import NodeLock
from m27.node.report import SNAPSHOT_NAME, read_snapshot
from m27.store.sqlite import SqliteEventStore
from tests.unit.agent_helpers import ROOT
from tests.waiting import wait_until


def _service(home: Path, stderr: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, M27_HOME=str(home), M27_GPUS="sim:2")
    env["PREFECT_API_URL"] = "http://127.0.0.1:9/api"  # lab mode: no Prefect server of its own
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    with stderr.open("w") as err:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "m27.cli.commands.agent"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )


def test_sigterm_stops_the_service_cleanly_and_the_next_one_takes_over(
    m27_home: Path, tmp_path: Path
) -> None:
    store = SqliteEventStore(m27_home / "events.db")

    def started() -> list[int]:
        return [r.event.pid for r in store.read() if isinstance(r.event, ev.AgentStarted)]

    err1, err2 = tmp_path / "1.err", tmp_path / "2.err"
    first = _service(m27_home, err1)
    second: subprocess.Popen[str] | None = None
    try:
        wait_until(lambda: started() == [first.pid])
        wait_until(lambda: read_snapshot(m27_home) is not None)  # its live GPU snapshot
        second = _service(m27_home, err2)  # one agent per node: this one waits
        wait_until(lambda: f"pid {first.pid} runs this node's agent; waiting" in err2.read_text())
        assert "a run's process does at once, another service when it stops" in err2.read_text()
        assert started() == [first.pid]
        first.send_signal(signal.SIGTERM)
        out, _ = first.communicate(timeout=15)
        assert first.returncode == 0
        assert "serving" in out and out.rstrip().endswith("m27 agent: stopped")
        wait_until(lambda: started() == [first.pid, second.pid])  # took over at once
        second.send_signal(signal.SIGTERM)
        out2, _ = second.communicate(timeout=15)
        assert second.returncode == 0, err2.read_text()
        assert out2.rstrip().endswith("m27 agent: stopped")
        # nothing left behind: the lock is free, the snapshot gone
        lock = NodeLock(m27_home)
        assert lock.acquire()
        lock.release()
        assert not (m27_home / SNAPSHOT_NAME).exists()
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.communicate()
        store.close()


def test_the_service_agent_ticks_every_io_timeout_from_the_nodes_settings(
    m27_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from m27.node.embed import build_agent

    conf = tmp_path / "m2config"
    conf.write_text(
        "[performance]\nmemory_overprovision = 1.2   # over-allocation\nio_timeout = 50ms\n"
    )
    monkeypatch.setenv("M27_CONFIG", str(conf))
    monkeypatch.setenv("M27_GPUS", "sim:3x8GiB")
    agent = build_agent(m27_home)
    try:
        assert agent.tick_s == agent.config.io_timeout == 0.05  # the default tick
        assert agent.config.memory_overprovision == 1.2
        assert agent.backend.kind == "sim" and len(agent.backend.devices()) == 3
    finally:
        agent.close()
        agent.store.close()
    monkeypatch.setenv("M27_IO_TIMEOUT", "20ms")  # the variable wins over the file
    agent = build_agent(m27_home)
    try:
        assert agent.tick_s == 0.02
    finally:
        agent.close()
        agent.store.close()
