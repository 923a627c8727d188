"""Retention runs in the background, after the commit: never on a save's critical path."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from m27.checkpoint import Checkpointer, _retention, latest_checkpoint, verify
from m27.checkpoint._format import manifests, read_manifest
from tests.waiting import wait_until

CHUNK = 1024
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("M27_RUN_ID", "M27_RESUME_FROM", "M27_CHECKPOINT_DIR", "M2_CHUNK_SIZE"):
        monkeypatch.delenv(name, raising=False)


def state(step: int) -> dict[str, Any]:
    x = np.arange(16 * CHUNK // 8, dtype=np.int64)
    x[(step % 16) * 128] = -step  # one chunk changes per step; the rest point to old packs
    return {"x": x, "step": step}


def packs(directory: Path) -> set[int]:
    return {int(p.name[5:15]) for p in directory.glob("ckpt-*.pack")}


def test_a_save_is_durable_while_retention_is_still_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    entered = threading.Event()
    real_prune = _retention.prune

    def blocked_prune(directory: Path, keep_last: int, **kwargs: Any) -> list[Path]:
        entered.set()
        release.wait(60)
        return real_prune(directory, keep_last, **kwargs)

    monkeypatch.setattr(_retention, "prune", blocked_prune)
    ck = Checkpointer(tmp_path, chunk_size=CHUNK, keep_last=1)
    try:
        ck.save(state(1), step=1)
        ck.save(state(2), step=2)
        flushed = threading.Thread(target=ck.flush)
        flushed.start()
        flushed.join(60)
        assert not flushed.is_alive(), "flush() waited for retention"
        assert entered.wait(60), "the commit requested no retention"
        assert latest_checkpoint(tmp_path) == tmp_path / "ckpt-0000000002.json"
    finally:
        release.set()
        ck.close()  # close() waits for the retention it started
    assert [p.name for p in manifests(tmp_path)] == ["ckpt-0000000002.json"]


def test_background_retention_never_deletes_what_the_newest_manifest_references(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_prune = _retention.prune
    checked: list[int] = []

    def checking_prune(directory: Path, keep_last: int, **kwargs: Any) -> list[Path]:
        removed = real_prune(directory, keep_last, **kwargs)
        newest = manifests(directory)[-1]
        needed = {int(k) for k in read_manifest(newest)["packs"]}
        assert needed <= packs(directory), f"{newest.name} lost a pack"
        checked.append(len(removed))
        return removed

    monkeypatch.setattr(_retention, "prune", checking_prune)
    with Checkpointer(tmp_path, chunk_size=CHUNK, keep_last=1, max_in_flight=2) as ck:
        for step in range(1, 41):  # saves keep coming while earlier prunes run
            ck.save(state(step), step=step)
    assert checked, "retention never ran"
    newest = latest_checkpoint(tmp_path)
    assert newest is not None and newest.name == "ckpt-0000000040.json"
    verify(newest)
    with Checkpointer(tmp_path, chunk_size=CHUNK) as ck:
        got = ck.restore()
    assert got is not None and got[1] == 40 and np.array_equal(got[0]["x"], state(40)["x"])
    # keep_last=1: only the packs the newest manifest needs are left
    assert packs(tmp_path) == {int(k) for k in read_manifest(newest)["packs"]}


KILLED_IN_GC = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import numpy as np
    from m27.checkpoint import Checkpointer, _retention
    from m27.checkpoint._format import manifests, read_manifest

    real = _retention.collect_garbage
    def killed(directory, **kwargs):
        found = manifests(directory)
        referenced = {int(k) for m in found for k in read_manifest(m)["packs"]}
        newest = max(int(m.name[5:15]) for m in found)
        on_disk = {int(p.name[5:15]) for p in Path(directory).glob("ckpt-*.pack")}
        # (a pack past the newest manifest is a save being written, not garbage)
        if {n for n in on_disk - referenced if n < newest}:
            # an old manifest is deleted, its pack is not yet: die like kill -9 here
            os.kill(os.getpid(), signal.SIGKILL)
        return real(directory, **kwargs)
    _retention.collect_garbage = killed
    ck = Checkpointer(sys.argv[1], chunk_size=1024, keep_last=1)
    for step in (1, 2, 3):
        ck.save({"x": np.full(2048, step, dtype=np.int64), "step": step}, step=step)
        ck.flush()
    ck.close()
    """
)


def test_a_kill_during_background_gc_leaves_the_newest_checkpoint_and_is_cleaned_up(
    tmp_path: Path,
) -> None:
    script = tmp_path / "child.py"
    script.write_text(KILLED_IN_GC)
    directory = tmp_path / "ck"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, str(script), str(directory)], env=env, timeout=120, check=False
    )
    assert done.returncode == -9, "the child should have died in garbage collection"
    newest = latest_checkpoint(directory)
    assert newest is not None
    with Checkpointer(directory, chunk_size=CHUNK, keep_last=1) as ck:
        got = ck.restore()
        assert got is not None
        state_back, step = got
        assert step >= 2, "the child died in the prune after its second save at the earliest"
        assert np.array_equal(state_back["x"], np.full(2048, step, dtype=np.int64))
        assert len(packs(directory)) > 1, "the killed prune left an unreferenced pack"
        ck.save({**state_back, "x": state_back["x"] + 1}, step=step + 1)
    # close() waited for the next prune, in a healthy process: the leftovers are gone.
    last = latest_checkpoint(directory)
    assert last is not None and [p.name for p in manifests(directory)] == [last.name]
    assert packs(directory) == {int(k) for k in read_manifest(last)["packs"]}


def test_a_prune_requested_while_a_save_hashes_starts_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save's hashing pass and a prune would take the GIL in turns: the prune waits."""
    bp = _retention.BackgroundPrune(tmp_path, keep_last=1)
    holds_at_start: list[int] = []

    def recording_prune(directory: Path, keep_last: int, **kwargs: Any) -> list[Path]:
        holds_at_start.append(bp._holds)
        return []

    monkeypatch.setattr(_retention, "prune", recording_prune)

    def parked() -> bool:
        # the retention thread is back in Condition.wait() (CPython keeps its waiters in
        # `_waiters`): it took the request in and did not start
        return bp._thread is not None and len(vars(bp._cond)["_waiters"]) == 1

    try:
        with bp.held():
            bp.request()
            wait_until(parked, what="the retention thread to wait for the save")
            assert holds_at_start == []
        bp.wait_idle()
        assert holds_at_start == [0]
    finally:
        bp.close()
