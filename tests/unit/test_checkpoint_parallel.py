"""Saves and restores spread over threads give exactly the single-threaded results."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from m27 import CorruptCheckpointError
from m27.checkpoint import Checkpointer, _chunks, _codec, _reader, verify
from m27.checkpoint._format import CODEC_RAW, CODEC_ZSTD, read_manifest
from m27.checkpoint._parallel import Workers

CHUNK = 1024


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("M27_RUN_ID", "M27_RESUME_FROM", "M27_CHECKPOINT_DIR", "M2_CHUNK_SIZE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def small_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs of 3 chunks, so even a small state is read by several threads at once."""
    monkeypatch.setattr(_reader, "RUN_BYTES", 3 * CHUNK)


def mixed_state(seed: int = 0) -> dict[str, Any]:
    """Noise and zeros interleaved every few chunks: raw and zstd runs alternate."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 2**62, 40 * CHUNK // 8, dtype=np.int64)
    for start in range(0, x.size, 7 * CHUNK // 8):
        x[start : start + 3 * CHUNK // 8] = 0
    return {"x": x, "tail": np.arange(1001, dtype=np.float32), "note": "mixed"}


def codecs(path: Path, name: str) -> set[str]:
    return {c[5] for c in read_manifest(path)["arrays"][name]["chunks"]}


@pytest.mark.usefixtures("small_runs")
@pytest.mark.parametrize("threads", [1, 3])
def test_restore_on_threads_returns_every_byte(tmp_path: Path, threads: int) -> None:
    state = mixed_state()
    with Checkpointer(tmp_path, chunk_size=CHUNK, threads=threads) as ck:
        ck.save(state, step=1)
        changed = {**state, "x": state["x"].copy()}
        changed["x"][100:900] = -1  # chunks 0-6 change: a second pack joins the runs
        ck.save(changed, step=2)
    # int64 chunks are byte-shuffled before zstd (codec "zstd-s8")
    assert codecs(tmp_path / "ckpt-0000000001.json", "x") == {CODEC_RAW, "zstd-s8"}
    with Checkpointer(tmp_path, chunk_size=CHUNK, threads=threads) as ck:
        got = ck.restore()
    assert got is not None
    restored, step = got
    assert step == 2 and restored["note"] == "mixed"
    assert np.array_equal(restored["x"], changed["x"])
    assert np.array_equal(restored["tail"], state["tail"])


@pytest.mark.usefixtures("small_runs")
def test_a_corrupt_chunk_read_by_another_thread_still_fails_the_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = mixed_state(1)
    second = {**first, "x": first["x"] + 1, "note": "second"}
    with Checkpointer(tmp_path, chunk_size=CHUNK, keep_last=10, threads=3) as ck:
        ck.save(first, step=1)
        ck.save(second, step=2)
    pack = tmp_path / "ckpt-0000000002.pack"
    data = bytearray(pack.read_bytes())
    data[len(data) * 2 // 3] ^= 0x5A  # deep in the pack: not the first run
    pack.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=r"ckpt-0000000002\.pack"):
        verify(tmp_path / "ckpt-0000000002.json")
    with Checkpointer(tmp_path, chunk_size=CHUNK, keep_last=10, threads=3) as ck:
        got = ck.restore()
    assert got is not None and got[1] == 1 and np.array_equal(got[0]["x"], first["x"])
    assert "ckpt-0000000002" in caplog.text


def test_a_group_whose_probe_does_not_compress_is_stored_raw() -> None:
    rng = np.random.default_rng(2)
    noise = memoryview(rng.integers(0, 256, CHUNK, dtype=np.uint8).tobytes())
    zeros = memoryview(bytes(CHUNK))
    probe_misses = _codec.encode([noise, zeros, zeros], level=3)
    assert [codec for _, codec, _ in probe_misses] == [CODEC_RAW] * 3
    probe_hits = _codec.encode([zeros, noise, zeros], level=3)
    assert [codec for _, codec, _ in probe_hits] == [CODEC_ZSTD, CODEC_RAW, CODEC_ZSTD]
    groups = _codec.encode([noise] + [zeros] * _codec.PROBE_GROUP, level=3)
    assert groups[_codec.PROBE_GROUP][1] == CODEC_ZSTD, "the next group probes afresh"
    assert bytes(probe_misses[1][0]) == bytes(zeros), "raw payloads are the chunk's bytes"


def test_encode_hashes_the_raw_bytes_when_asked() -> None:
    zeros = memoryview(bytes(CHUNK))
    ((_, _, digest),) = _codec.encode([zeros], level=3, with_hash=True)
    assert digest == _chunks.chunk_hash(zeros)
    ((_, _, none),) = _codec.encode([zeros], level=3)
    assert none is None


def test_fingerprints_on_threads_equal_the_single_threaded_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_chunks, "_PARALLEL_BYTES", 0)
    data = np.random.default_rng(3).integers(0, 256, 50 * CHUNK + 17, dtype=np.uint8)
    workers = Workers(3, "test")
    try:
        parallel = _chunks.fingerprints(data, CHUNK, workers)
    finally:
        workers.close()
    assert np.array_equal(parallel, _chunks.fingerprints(data, CHUNK))
    assert parallel.size == 51


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 5000), min_size=1, max_size=12),
    count=st.integers(1, 5),
)
def test_copy_shares_cover_every_byte_once_in_nearly_equal_parts(
    lengths: list[int], count: int
) -> None:
    pieces, pos = [], 0
    for k, length in enumerate(lengths):
        pieces.append((10_000 * k + 7, pos, length))  # sources far apart, dests back to back
        pos += length
    shares = _chunks.shares(pieces, pos, count)
    flat = [piece for share in shares for piece in share]
    assert [target for _, target, _ in flat] == sorted(target for _, target, _ in flat)
    covered = 0
    for source, target, length in flat:
        assert target == covered, "no gap, no overlap"
        owner = max(p for p in pieces if p[1] <= target)  # the copy this part was cut from
        assert source - owner[0] == target - owner[1], "source and dest move together"
        assert target + length <= owner[1] + owner[2]
        covered += length
    assert covered == pos
    size = -(-pos // count)
    assert len(shares) <= count
    assert all(sum(length for *_, length in share) <= size for share in shares)
    assert _chunks.shares([], 0, count) == [], "nothing to copy: no share"


@pytest.mark.parametrize("picked", ["all", "scattered", "last short"])
def test_copy_on_threads_equals_the_single_threaded_copy(
    monkeypatch: pytest.MonkeyPatch, picked: str
) -> None:
    monkeypatch.setattr(_chunks, "_PARALLEL_BYTES", 0)
    data = np.random.default_rng(4).integers(0, 256, 50 * CHUNK + 17, dtype=np.uint8)
    count = _chunks.n_chunks(data.size, CHUNK)
    indices = {
        "all": np.arange(count),
        "scattered": np.array([0, 1, 2, 9, 20, 21, 33, 49]),
        "last short": np.array([3, 4, 48, 50]),
    }[picked].astype(np.int64)
    size = _chunks.changed_bytes(indices, data.size, CHUNK)
    alone = np.zeros(size, dtype=np.uint8)
    assert _chunks.copy_changed(data, indices, CHUNK, alone) == size
    shared = np.zeros(size, dtype=np.uint8)
    workers = Workers(3, "test")
    try:
        assert _chunks.copy_changed(data, indices, CHUNK, shared, workers) == size
    finally:
        workers.close()
    assert np.array_equal(shared, alone)
    expected = np.concatenate([data[i * CHUNK : (i + 1) * CHUNK] for i in indices])
    assert np.array_equal(shared, expected)


def test_workers_give_results_in_order_and_the_first_error_in_order() -> None:
    workers = Workers(3, "test")
    third_ran = threading.Event()
    finished: list[int] = []

    def work(i: int) -> int:
        if i == 3:
            third_ran.set()
        if i == 0:
            assert third_ran.wait(60)  # the first item finishes after the last one
        if i in (4, 6):
            raise ValueError(f"item {i}")
        finished.append(i)
        return i * i

    try:
        assert list(workers.map_ordered(work, [0, 1, 2, 3])) == [0, 1, 4, 9]
        assert finished.index(3) < finished.index(0)
        with pytest.raises(ValueError, match="item 4"):
            workers.run_all(work, range(8))
    finally:
        workers.close()
    assert workers.run_all(lambda i: i + 1, [1, 2]) == [2, 3], "closed pools run inline"


def test_a_stopped_consumer_cancels_the_look_ahead() -> None:
    workers = Workers(2, "test")
    started: list[int] = []
    gate = threading.Event()

    def work(i: int) -> int:
        started.append(i)
        gate.wait(5)
        return i

    try:
        results = workers.map_ordered(work, range(100), ahead=4)
        gate.set()
        assert next(results) == 0
        results.close()
    finally:
        workers.close()
    assert len(started) <= 4, "only the look-ahead may have run"


def test_neighbouring_chunks_from_different_packs_are_read_from_their_own_pack(
    tmp_path: Path,
) -> None:
    # Chunk 0 rewritten raw lands at offset 0 of pack 2, and chunk 1 sits at offset CHUNK
    # of pack 1: adjacent offsets, different files.
    x = np.random.default_rng(4).integers(0, 2**62, 6 * CHUNK // 8, dtype=np.int64)
    with Checkpointer(tmp_path, chunk_size=CHUNK, compression_level=0) as ck:
        ck.save({"x": x}, step=1)
        x[0] += 1
        ck.save({"x": x}, step=2)
    chunks = read_manifest(tmp_path / "ckpt-0000000002.json")["arrays"]["x"]["chunks"]
    assert chunks[0][:3] == [2, 0, CHUNK] and chunks[1][:3] == [1, CHUNK, CHUNK]
    with Checkpointer(tmp_path, chunk_size=CHUNK) as ck:
        got = ck.restore()
    assert got is not None and got[1] == 2 and np.array_equal(got[0]["x"], x)


@settings(max_examples=300, deadline=None)
@given(st.sets(st.integers(0, 200), max_size=60))
def test_runs_are_the_stretches_of_consecutive_chunks(chosen: set[int]) -> None:
    """One (first, last) per stretch of consecutive indices, in order: the copy plan. A
    single stretch (a small array, or every chunk changed) is found without a pass."""
    indices = np.array(sorted(chosen), dtype=np.int64)
    expected: list[tuple[int, int]] = []
    for i in sorted(chosen):
        if expected and expected[-1][1] == i - 1:
            expected[-1] = (expected[-1][0], i)
        else:
            expected.append((i, i))
    assert _chunks.runs(indices) == expected
