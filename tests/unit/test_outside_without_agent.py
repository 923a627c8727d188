"""Without the node's agent, `m27 queue` and `m27 gpus` still see another user's work on a
GPU (processes m27 did not start, :func:`m27.node.views.outside_m27`): before, the fold
said such a GPU was free, and a step's reason named nothing of the 60 GiB job on it."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import pytest

from m27 import events as ev
from m27.cli.commands import gpus, queue
from m27.gpu import GpuSample, ProcessSample
from m27.gpu.sim import SimBackend
from m27.node.book import Held
from m27.node.views import outside_m27
from m27.policy import OUTSIDE_MEMORY_MIN
from m27.store.sqlite import open_store

GiB = 1024**3
STRANGER = 4_000_000  # a made-up pid: no step of this node has it


def _node(monkeypatch: pytest.MonkeyPatch, *on_gpu0: tuple[int, int]) -> None:
    """One simulated GPU whose samples list `on_gpu0` (pid, bytes), for every command."""

    def backend() -> SimBackend:
        b = SimBackend(1)
        for pid, memory in on_gpu0:
            b.attach(0, pid, memory=memory)
            b.set_computing(pid, True)
        return b

    monkeypatch.setattr(queue, "detect", backend)
    monkeypatch.setattr(gpus, "detect", backend)


def _log(home: Path, *events: ev.Event) -> None:
    store = open_store(home)
    store.append(list(events))
    store.close()


def _request(step: str) -> ev.StepRequested:
    return ev.StepRequested(at=time.time(), run_id="r", step=step, type="gpu", gpus=1,
                            gpu_memory=GiB)  # fmt: skip


def _why(capsys: pytest.CaptureFixture[str], step: str) -> str:
    assert queue.run(argparse.Namespace(why=step, json=False)) == 0
    return capsys.readouterr().out


def test_queue_without_the_agent_names_a_gpu_another_user_holds(
    m27_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _log(m27_home, _request("fit"))
    _node(monkeypatch, (STRANGER, 60 * GiB))
    assert "GPU 0 used outside m27 (60.0 GiB by processes m27 did not start)" in _why(capsys, "fit")
    # a little memory of someone else's (a desktop, a probe) leaves the GPU to m27
    _node(monkeypatch, (STRANGER, OUTSIDE_MEMORY_MIN - 1))
    assert "outside m27" not in _why(capsys, "fit")


def test_queue_without_the_agent_counts_a_held_steps_processes_as_m27s(
    m27_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The log holds md's lease and its process group (this test's own): a process of that
    group on the GPU is md's, not someone else's: fit may join md there as its guest."""
    group = os.getpgid(0)
    _log(
        m27_home,
        _request("md"),
        ev.LeaseGranted(at=time.time(), run_id="r", step="md", gpus=(0,)),
        ev.StepStarted(
            at=time.time(),
            run_id="r",
            step="md",
            attempt=1,
            pid=STRANGER + 1,
            pgid=group,
            command=("md",),
            gpus=(0,),
        ),
        _request("fit"),
    )
    _node(monkeypatch, (os.getpid(), 60 * GiB))
    why = _why(capsys, "fit")
    assert why == "r/fit: granted (ready) on GPU 0\n"


def test_gpus_without_the_agent_shows_memory_held_outside_m27(
    m27_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _node(monkeypatch, (STRANGER, 60 * GiB))
    assert gpus.run(argparse.Namespace(json=False, watch=None)) == 0
    assert "outside m27 (60.0GiB)" in capsys.readouterr().out  # in the PRIMARY column
    assert gpus.run(argparse.Namespace(json=True, watch=None)) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["outside_memory"] == 60 * GiB


def _sample(*procs: ProcessSample, used: int | None = None) -> GpuSample:
    return GpuSample(0, None, None, 0.0, memory_used=used, processes=procs)


def _held(pid: int | None, pgid: int | None) -> Held:
    return Held(("r", "md"), (0,), "immediate", 0.0, None, pid=pid, pgid=pgid)


@pytest.mark.parametrize(
    ("procs", "used", "held", "outside"),
    [
        ([(STRANGER, 30 * GiB)], None, [], 30 * GiB),
        ([(STRANGER, 30 * GiB)], None, [_held(STRANGER, None)], 0),
        ([(os.getpid(), 30 * GiB)], None, [_held(1, os.getpgid(0))], 0),
        ([(STRANGER, None)], 40 * GiB, [], 40 * GiB),  # NVML hides another user's memory
        ([(STRANGER, None), (os.getpid(), 10 * GiB)], 40 * GiB, [_held(os.getpid(), None)], 30 * GiB),
        ([(STRANGER, GiB // 2)], None, [], 0),  # under OUTSIDE_MEMORY_MIN
    ],
    ids=["stranger", "held-pid", "held-group", "unknown-memory", "unknown-beside-own", "small"],
)  # fmt: skip
def test_outside_m27_is_what_processes_no_held_lease_explains_hold(
    procs: list[tuple[int, int | None]], used: int | None, held: list[Held], outside: int
) -> None:
    sample = _sample(*(ProcessSample(pid, m, None) for pid, m in procs), used=used)
    assert outside_m27([sample], held) == {0: outside}
