"""Sixteen `m27 run` started at the same moment on one node, with no node service yet:
one service starts, every run succeeds, each is recorded with a terminal event, the log
has no gap, and no output shows a traceback (lab members submitting at once)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from m27.events import RunSucceeded
from m27.store.sqlite import SqliteEventStore
from tests.e2e._helpers import m27_env, node_state

pytestmark = [pytest.mark.service, pytest.mark.slow]

CPU = "name: cpu{i}\npipeline:\n  - name: work\n    type: cpu\n    command: 'true'\n"
GPU = (
    "name: gpu{i}\npipeline:\n"
    "  - name: prep\n    type: cpu\n    command: 'true'\n"
    "  - name: train\n    type: gpu\n    depends_on: [prep]\n    command: 'true'\n"
)


@pytest.mark.timeout(1200)
def test_sixteen_runs_started_together_all_succeed(
    m27_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)  # the node service's own server
    specs = []
    for i in range(16):
        path = tmp_path / f"p{i}.yaml"
        path.write_text((CPU if i % 2 else GPU).format(i=i))
        specs.append(path)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "m27.cli", "run", str(spec), "--plain", "--quiet"],
            env=m27_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for spec in specs
    ]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=900)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out
        assert "Traceback" not in out, out
    starts = sum("node service ready after" in out for out in outs)
    assert starts >= 1  # everyone waited for the one service, started once
    runs = node_state(m27_home).runs
    assert len(runs) == 16
    assert sorted(r.pipeline for r in runs.values()) == sorted(
        f"{'cpu' if i % 2 else 'gpu'}{i}" for i in range(16)
    )
    assert all(r.status == "succeeded" and r.ended_at is not None for r in runs.values())
    store = SqliteEventStore(m27_home / "events.db")
    try:
        records = list(store.read())
    finally:
        store.close()
    seqs = [r.seq for r in records]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # gapless
    ends = {r.event.run_id for r in records if isinstance(r.event, RunSucceeded)}
    assert ends == set(runs)
    agents = [r.event for r in records if r.event.kind == "AgentStarted"]
    assert len(agents) == 1  # one node service served them all
