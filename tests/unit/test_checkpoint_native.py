"""The compiled chunk hasher (csrc/spans.c) gives exactly the values of the Python path.

Fingerprints are stored in manifests and compared across saves, so a checkpoint written
by an install with the compiled module and resumed by one without (or the reverse) must
see the same hashes; these tests hold the two paths to the same answers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from m27.checkpoint import Checkpointer, _chunks
from m27.checkpoint._parallel import Workers
from m27.events import CheckpointWritten
from m27.store.memory import MemoryEventStore
from tests.services import unavailable


@pytest.fixture(scope="module")
def native() -> object:
    module = _chunks._native
    if module is None:
        unavailable("m27.checkpoint._spans was not built (no C compiler at install?)")
    return module


@pytest.fixture
def workers() -> Iterator[Workers]:
    pool = Workers(2, "test-native")
    yield pool
    pool.close()


def python_hashes(data: np.ndarray, chunk: int) -> list[int]:
    view = memoryview(data)
    return [xxhash.xxh3_64_intdigest(view[o : o + chunk]) for o in range(0, len(data), chunk)]


@settings(max_examples=80, deadline=None)
@given(size=st.integers(0, 5000), chunk=st.integers(1, 700), seed=st.integers(0, 2**32 - 1))
def test_every_chunk_hash_is_xxh3_64_of_the_chunk(
    native: object, size: int, chunk: int, seed: int
) -> None:
    data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
    got = _chunks.fingerprints(data, chunk)
    assert got.tolist() == python_hashes(data, chunk)
    picks = np.random.default_rng(seed).permutation(len(got))[: len(got) // 2]
    assert _chunks.fingerprints(data, chunk, indices=picks).tolist() == got[picks].tolist()


def test_threads_split_a_large_buffer_and_agree(native: object, workers: Workers) -> None:
    data = np.random.default_rng(7).integers(0, 256, 40 * 2**20 + 12345, dtype=np.uint8)
    chunk = 128 * 1024
    got = _chunks.fingerprints(data, chunk, workers)
    assert got.tolist() == python_hashes(data, chunk)
    picks = np.arange(0, len(got), 3)
    assert np.array_equal(_chunks.fingerprints(data, chunk, workers, picks), got[picks])


def test_bad_ranges_raise_instead_of_reading_past_the_buffer(native: object) -> None:
    from m27.checkpoint import _spans

    data = np.zeros(1000, dtype=np.uint8)
    out = np.empty(4, dtype=np.uint64)
    with pytest.raises(ValueError, match="outside the buffer"):
        _spans.hash_range(data, 256, 1, out)  # chunks 1..5 of 4
    with pytest.raises(ValueError, match="outside the buffer"):
        _spans.hash_indices(data, 256, np.array([0, 1, 2, 4], dtype=np.int64), out)
    with pytest.raises(ValueError, match="outside the buffer"):
        _spans.hash_indices(data, 256, np.array([0, -1, 2, 3], dtype=np.int64), out)
    with pytest.raises(ValueError, match="positive"):
        _spans.hash_range(data, 0, 0, out)
    with pytest.raises(ValueError, match="same length"):
        _spans.hash_indices(data, 256, np.array([0], dtype=np.int64), out)
    with pytest.raises(TypeError):
        _spans.hash_range(data, 256, 0, out.tobytes())  # read-only out


def test_diff_finds_the_same_chunks_as_the_python_path(
    native: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, 3 * 2**20 + 77, dtype=np.uint8)
    chunk = 4096
    first = _chunks.diff_chunks(data, chunk, None, None, None)
    data[rng.choice(len(data), 40, replace=False)] ^= 0x5A
    compiled = _chunks.diff_chunks(data, chunk, None, first.chunks, None)
    assert compiled.groups is None  # no group pass: every chunk is hashed at memory speed
    monkeypatch.setattr(_chunks, "_native", None)
    python = _chunks.diff_chunks(data, chunk, None, first.chunks, None)
    assert np.array_equal(compiled.chunks, python.chunks)
    assert np.array_equal(compiled.changed, python.changed)
    assert 0 < compiled.changed.size <= 40


def test_a_checkpoint_saved_with_one_path_resumes_with_the_other(
    native: object, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An install built without gcc resumes (and diffs against) a compiled one's saves."""
    store = MemoryEventStore()
    with Checkpointer(tmp_path, chunk_size=4096, store=store) as ckpt:
        ckpt.save({"x": np.random.default_rng(1).random(300_000)}, step=1)
    monkeypatch.setattr(_chunks, "_native", None)
    with Checkpointer(tmp_path, chunk_size=4096, store=store) as ckpt:
        found = ckpt.restore()
        assert found is not None and found[1] == 1
        state = found[0]
        state["x"][1000] = -1.0
        ckpt.save(state, step=2)
    monkeypatch.setattr(_chunks, "_native", native)
    with Checkpointer(tmp_path, chunk_size=4096, store=store) as ckpt:
        again = ckpt.restore()
    assert again is not None and again[1] == 2
    assert again[0]["x"][1000] == -1.0
    assert np.array_equal(np.delete(again[0]["x"], 1000), np.delete(state["x"], 1000))
    full, diff = (r.event for r in store.read() if isinstance(r.event, CheckpointWritten))
    # one changed chunk (4 KiB) and the manifest, not all 2.4 MB again: the hashes the
    # compiled path stored are the ones the Python path computes
    assert 4096 <= diff.bytes_written < full.bytes_written / 20
