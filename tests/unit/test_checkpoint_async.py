"""Saves return before the disk is touched, are bounded in number, and never fail silently."""

from __future__ import annotations

import errno
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from m27 import CheckpointError
from m27.checkpoint import Checkpointer, _pack, artifact_for, artifact_key
from m27.clock import FakeClock
from m27.events import CheckpointRestored, CheckpointWritten, Event
from m27.store.memory import MemoryEventStore
from m27.store.sqlite import open_store
from tests.waiting import wait_until

CHUNK = 1024


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "M27_RUN_ID",
        "M27_STEP",
        "M27_PIPELINE",
        "M27_RESUME_FROM",
        "M27_CHECKPOINT_DIR",
        "M27_CHECKPOINT_INTERVAL",
        "M2_CHUNK_SIZE",
    ):
        monkeypatch.delenv(name, raising=False)


def state(value: int) -> dict[str, Any]:
    return {"x": np.full(4096, value, dtype=np.int64), "step": value}


def test_save_blocks_while_max_in_flight_saves_wait_for_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = threading.Event()
    real_commit = _pack.PackWriter.commit

    def slow_commit(self: _pack.PackWriter) -> None:
        disk.wait()
        real_commit(self)

    monkeypatch.setattr(_pack.PackWriter, "commit", slow_commit)
    ck = Checkpointer(tmp_path, chunk_size=CHUNK, max_in_flight=2, keep_last=10)
    ck.save(state(1), step=1)
    ck.save(state(2), step=2)
    pool = ck._writer._pool  # the staging buffers: one per save in flight
    assert pool.qsize() == 0, "two saves in flight must hold both buffers"
    third = threading.Thread(target=lambda: ck.save(state(3), step=3))
    third.start()
    # Event-ordered, not timed: the third save is seen waiting for a buffer.
    wait_until(lambda: len(pool.not_empty._waiters) == 1, 60, what="the third save to wait")
    assert third.is_alive(), "saves beyond max_in_flight must wait"
    assert not list(tmp_path.glob("*.json"))
    disk.set()
    third.join()
    ck.close()
    assert len(list(tmp_path.glob("ckpt-*.json"))) == 3


def test_a_write_error_surfaces_on_the_next_call_and_the_next_save_is_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = _pack._writev_all
    fail = {"on": False}

    def writev_all(fd: int, pieces: Any) -> None:
        if fail["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(fd, pieces)

    monkeypatch.setattr(_pack, "_writev_all", writev_all)
    # One buffer: the next save waits for the failing one, so it must see its error.
    with Checkpointer(tmp_path, chunk_size=CHUNK, max_in_flight=1) as ck:
        ck.save(state(1), step=1)
        ck.flush()
        fail["on"] = True
        ck.save(state(2), step=2)
        with pytest.raises(CheckpointError, match="disk full") as info:
            ck.save(state(3), step=3)
        assert "ckpt-0000000002.pack" in str(info.value)
        assert not (tmp_path / "ckpt-0000000002.pack").exists()
        ck.save(state(4), step=4)
        with pytest.raises(CheckpointError, match="disk full"):
            ck.flush()
        fail["on"] = False
        ck.save(state(5), step=5)
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [
        "ckpt-0000000001.json",
        "ckpt-0000000004.json",
    ]
    with Checkpointer(tmp_path, chunk_size=CHUNK) as ck:
        got = ck.restore()
    assert got is not None and got[1] == 5 and np.all(got[0]["x"] == 5)


def test_an_error_in_the_last_save_is_raised_by_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: _pack.PackWriter, payload: Any) -> tuple[int, int]:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(_pack.PackWriter, "add", broken)
    ck = Checkpointer(tmp_path, chunk_size=CHUNK)
    ck.save(state(1), step=1)
    with pytest.raises(CheckpointError, match="Input/output error"):
        ck.close()
    with pytest.raises(CheckpointError, match="closed"):
        ck.save(state(2), step=2)


def test_maybe_save_honours_the_interval_on_the_injected_clock(tmp_path: Path) -> None:
    clock = FakeClock()
    with Checkpointer(tmp_path, interval=300, chunk_size=CHUNK, clock=clock) as ck:
        assert not ck.maybe_save(state(1), step=1)
        clock.advance(299)
        assert not ck.maybe_save(state(2), step=2)
        clock.advance(1)
        assert ck.maybe_save(state(3), step=3)
        clock.advance(100)
        assert not ck.maybe_save(state(4), step=4)
        clock.advance(200)
        assert ck.maybe_save(state(5), step=5)
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_due_says_when_a_save_is_due_and_an_explicit_save_restarts_the_interval(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    with Checkpointer(tmp_path, interval=60, chunk_size=CHUNK, clock=clock) as ck:
        assert not ck.due()
        clock.advance(60)
        assert ck.due()
        ck.save(state(1), step=1)  # what a program does after syncing its own files
        assert not ck.due()
        clock.advance(59)
        assert not ck.due() and not ck.maybe_save(state(2), step=2)
        clock.advance(1)
        assert ck.due() and ck.maybe_save(state(3), step=3) and not ck.due()
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_directory_and_interval_default_to_what_the_runner_sets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("M27_CHECKPOINT_DIR", str(tmp_path / "ck"))
    monkeypatch.setenv("M27_CHECKPOINT_INTERVAL", "5m")
    with Checkpointer() as ck:
        assert ck.directory == tmp_path / "ck" and ck.interval == 300.0
    monkeypatch.setenv("M27_CHECKPOINT_INTERVAL", "soon")
    with pytest.raises(Exception, match="M27_CHECKPOINT_INTERVAL"):
        Checkpointer()


def test_committed_and_restored_checkpoints_are_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("M27_RUN_ID", "r1")
    monkeypatch.setenv("M27_STEP", "md_simulation")
    monkeypatch.setenv("M27_PIPELINE", "md")
    store = MemoryEventStore()
    clock = FakeClock()
    with Checkpointer(tmp_path, chunk_size=CHUNK, store=store, clock=clock) as ck:
        ck.save(state(1), step=10)
        x = state(1)
        x["x"][:10] = 5
        ck.save(x, step=20)
    with Checkpointer(tmp_path, chunk_size=CHUNK, store=store, clock=clock) as ck:
        ck.restore()
    events: list[Event] = [r.event for r in store.read()]
    written = [e for e in events if isinstance(e, CheckpointWritten)]
    assert [(e.run_id, e.step, e.pipeline, e.sim_step) for e in written] == [
        ("r1", "md_simulation", "md", 10),
        ("r1", "md_simulation", "md", 20),
    ]
    assert written[1].path == str(tmp_path / "ckpt-0000000002.json")
    assert written[1].bytes_total == 4096 * 8
    assert CHUNK <= written[1].bytes_written < written[0].bytes_written
    assert events[-1] == CheckpointRestored(
        at=clock.now(), run_id="r1", step="md_simulation", path=written[1].path, sim_step=20
    )


def test_with_a_run_id_the_nodes_event_log_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, m27_home: Path
) -> None:
    monkeypatch.setenv("M27_RUN_ID", "r2")
    monkeypatch.setenv("M27_STEP", "sim")
    with Checkpointer(tmp_path, chunk_size=CHUNK) as ck:
        ck.save(state(1), step=1)
    with open_store(m27_home) as store:
        kinds = [r.event.kind for r in store.read()]
    assert kinds == ["CheckpointWritten"]


def test_an_event_log_failure_keeps_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(MemoryEventStore):
        def append(self, events: Any) -> int:
            raise OSError("log is gone")

    monkeypatch.setenv("M27_RUN_ID", "r3")
    with Checkpointer(tmp_path, chunk_size=CHUNK, store=Broken()) as ck:
        ck.save(state(1), step=1)
    assert "log is gone" in caplog.text
    with Checkpointer(tmp_path, chunk_size=CHUNK) as ck:
        got = ck.restore()
    assert got is not None and got[1] == 1


def test_artifact_key_and_markdown_describe_the_checkpoint() -> None:
    event = CheckpointWritten(
        at=1_700_000_000.0,
        run_id="20261129-143012-7f3a",
        step="MD_Simulation",
        path="/home/lab/.m27/checkpoints/r/md/ckpt-0000000003.json",
        sim_step=50_000,
        bytes_written=1_048_576,
        bytes_total=1_073_741_824,
        duration_s=0.25,
        pipeline="Protein folding v2",
    )
    key, text = artifact_for(event)
    assert key == "m27-ckpt-protein-folding-v2-md-simulation"
    assert "50000" in text and "1048576" in text and event.path in text
    # one size format everywhere (run log, `m27 checkpoints`, this artifact): format_size
    assert "| written | 1.0MiB (1048576 bytes, 0.1% of the state) |" in text
    assert "| state size | 1.0GiB (1073741824 bytes) |" in text
    assert "2023-11-14 22:13:20 UTC" in text
    assert artifact_key("", "__x__") == "m27-ckpt-x"


def test_context_manager_does_not_hide_the_callers_exception(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: _pack.PackWriter, payload: Any) -> tuple[int, int]:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(_pack.PackWriter, "add", broken)
    with pytest.raises(KeyError), Checkpointer(tmp_path, chunk_size=CHUNK) as ck:
        ck.save(state(1), step=1)
        raise KeyError("the step's own bug")
