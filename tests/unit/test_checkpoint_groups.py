"""Without the compiled hasher, sparse saves look at group fingerprints first: same
answer, far fewer xxh3 calls from Python (the compiled path: test_checkpoint_native.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from m27.checkpoint import Checkpointer, _chunks
from m27.checkpoint._parallel import Workers

CHUNK = 64
PER_GROUP = 8


@pytest.fixture(autouse=True)
def small_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_chunks, "GROUP_BYTES", PER_GROUP * CHUNK)
    monkeypatch.setattr(_chunks, "_native", None)  # the Python path, as built without gcc


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Lengths of the buffers handed to xxh3, in call order."""
    seen: list[int] = []
    real = _chunks._xxh3_64

    def counting(data: memoryview) -> int:
        seen.append(len(data))
        return real(data)

    monkeypatch.setattr(_chunks, "_xxh3_64", counting)
    yield seen


def check(
    diff: _chunks.ChunkDiff, data: npt.NDArray[np.uint8], before: npt.NDArray[np.uint64]
) -> None:
    """The diff says what a full fresh pass says."""
    fresh = _chunks.fingerprints(data, CHUNK)
    assert np.array_equal(diff.chunks, fresh)
    assert np.array_equal(diff.changed, np.flatnonzero(fresh != before))
    if diff.groups is not None:
        assert np.array_equal(diff.groups, _chunks.fingerprints(data, PER_GROUP * CHUNK))


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(0, 40 * CHUNK + 63),
    rounds=st.lists(st.lists(st.integers(0, 10**6), max_size=30), min_size=1, max_size=6),
)
def test_every_save_finds_exactly_the_changed_chunks(size: int, rounds: list[list[int]]) -> None:
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    diff = _chunks.diff_chunks(data, CHUNK, None, None, None)
    assert np.array_equal(diff.changed, np.arange(_chunks.n_chunks(size, CHUNK)))
    for positions in rounds:
        before = diff.chunks
        for p in positions:
            if size:
                data[p % size] ^= 1 + p % 255
        diff = _chunks.diff_chunks(data, CHUNK, None, diff.chunks, diff.groups)
        check(diff, data, before)


def test_a_sparse_save_hashes_groups_then_only_the_changed_groups_chunks(
    calls: list[int],
) -> None:
    data = np.zeros(1024 * CHUNK, dtype=np.uint8)  # 1,024 chunks in 128 groups
    first = _chunks.diff_chunks(data, CHUNK, None, None, None)
    assert first.groups is None  # everything was new: dense
    data[5 * CHUNK] = 1
    second = _chunks.diff_chunks(data, CHUNK, None, first.chunks, first.groups)
    assert second.changed.tolist() == [5]
    assert second.groups is not None  # sparse: from now on groups first
    calls.clear()
    data[700 * CHUNK + 3] = 1
    third = _chunks.diff_chunks(data, CHUNK, None, second.chunks, second.groups)
    assert third.changed.tolist() == [700]
    # 128 group calls, then the 8 chunks of the one group that changed
    assert calls == [PER_GROUP * CHUNK] * 128 + [CHUNK] * PER_GROUP
    check(third, data, second.chunks)


def test_after_a_dense_save_the_next_one_hashes_chunks_without_a_group_pass(
    calls: list[int],
) -> None:
    data = np.zeros(1024 * CHUNK, dtype=np.uint8)
    diff = _chunks.diff_chunks(data, CHUNK, None, None, None)
    data[CHUNK] = 1
    diff = _chunks.diff_chunks(data, CHUNK, None, diff.chunks, diff.groups)
    data[::CHUNK] += 1  # every chunk
    dense = _chunks.diff_chunks(data, CHUNK, None, diff.chunks, diff.groups)
    assert dense.changed.size == 1024 and dense.groups is None
    calls.clear()
    data[::CHUNK] += 1
    again = _chunks.diff_chunks(data, CHUNK, None, dense.chunks, dense.groups)
    assert calls == [CHUNK] * 1024 and again.groups is None
    calls.clear()
    data[3 * CHUNK] += 1  # sparse again: one group pass now, so the next save can use it
    sparse = _chunks.diff_chunks(data, CHUNK, None, again.chunks, again.groups)
    assert sparse.changed.tolist() == [3]
    assert calls == [CHUNK] * 1024 + [PER_GROUP * CHUNK] * 128
    assert sparse.groups is not None


def test_chunks_larger_than_a_group_never_keep_groups() -> None:
    data = np.zeros(64 * CHUNK, dtype=np.uint8)
    chunk = PER_GROUP * CHUNK  # one chunk per group: a group pass would gain nothing
    diff = _chunks.diff_chunks(data, chunk, None, None, None)
    data[0] = 1
    diff = _chunks.diff_chunks(data, chunk, None, diff.chunks, diff.groups)
    assert diff.changed.tolist() == [0] and diff.groups is None


def test_chunks_at_indices_on_threads_equal_the_single_threaded_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_chunks, "_PARALLEL_BYTES", 0)
    data = np.random.default_rng(3).integers(0, 256, 50 * CHUNK + 17, dtype=np.uint8)
    picked = np.array([0, 1, 7, 8, 9, 31, 50], dtype=np.int64)  # 50 is the short last chunk
    workers = Workers(3, "test")
    try:
        parallel = _chunks.fingerprints(data, CHUNK, workers, picked)
    finally:
        workers.close()
    assert np.array_equal(parallel, _chunks.fingerprints(data, CHUNK)[picked])


def test_sparse_saves_through_groups_restore_every_byte(tmp_path: Path, calls: list[int]) -> None:
    state = np.random.default_rng(7).random(3000, dtype=np.float32)  # 188 chunks, 24 groups
    with Checkpointer(tmp_path, chunk_size=CHUNK, interval=0, keep_last=0) as ck:
        for step in range(6):
            calls.clear()
            state[(step * 331) % state.size] += 1.0
            ck.save({"x": state}, step=step)
        ck.flush()
    # the last save looked at 24 groups, then at the 8 chunks of the one that changed
    assert sorted(calls, reverse=True) == [PER_GROUP * CHUNK] * 23 + [224] + [CHUNK] * 8
    with Checkpointer(tmp_path, chunk_size=CHUNK) as reader:
        restored = reader.restore()
    assert restored is not None
    values, step = restored
    assert step == 5 and np.array_equal(values["x"], state)
