"""Storage choices of a save: byte shuffle, raw vs zstd by measured speed, gathered writes."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from m27 import CorruptCheckpointError
from m27.checkpoint import Checkpointer, _codec, verify
from m27.checkpoint._format import CODEC_RAW, CODEC_ZSTD, read_manifest

CHUNK = 4096


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("M27_RUN_ID", "M27_RESUME_FROM", "M27_CHECKPOINT_DIR", "M2_CHUNK_SIZE"):
        monkeypatch.delenv(name, raising=False)


def slow_disk(ck: Checkpointer) -> None:
    """Make the checkpointer believe its disk takes 1 kB/s: compression then always pays."""
    speed = ck._writer.speed
    speed.disk_bps = 1e3
    speed.written = lambda nbytes, seconds: None  # type: ignore[method-assign]


def codecs(path: Path, name: str) -> set[str]:
    return {c[5] for c in read_manifest(path)["arrays"][name]["chunks"]}


def smooth(n: int, dtype: Any) -> np.ndarray[Any, Any]:
    """Values whose high bytes repeat: compressible, more so after a byte shuffle."""
    return (np.sin(np.arange(n) / 50.0) * 1000).astype(dtype)


@pytest.mark.parametrize("itemsize", [2, 4, 8])
def test_shuffle_round_trips_every_byte(itemsize: int) -> None:
    raw = np.random.default_rng(itemsize).integers(0, 256, 3 * CHUNK, dtype=np.uint8)
    shuffled = np.empty_like(raw)
    _codec.shuffle_into(memoryview(raw), itemsize, shuffled)  # type: ignore[arg-type]
    # byte k of item i lands at k * items + i
    items = raw.size // itemsize
    assert shuffled[1 * items + 5] == raw[5 * itemsize + 1]
    back = bytearray(raw.size)
    _codec.unshuffle_into(memoryview(shuffled), itemsize, memoryview(back))  # type: ignore[arg-type]
    assert bytes(back) == raw.tobytes()


def test_shuffled_zstd_is_smaller_than_plain_zstd_on_floats() -> None:
    chunk = memoryview(smooth(CHUNK // 4, np.float32).view(np.uint8))  # type: ignore[arg-type]
    ((plain, plain_codec, _),) = _codec.encode([chunk], level=3)
    ((shuffled, shuffled_codec, _),) = _codec.encode([chunk], level=3, itemsize=4)
    assert plain_codec == CODEC_ZSTD and shuffled_codec == "zstd-s4"
    assert len(shuffled) < len(plain)


def test_compression_is_skipped_when_the_disk_is_faster_than_the_threads() -> None:
    zeros = memoryview(bytes(CHUNK))
    fast_disk = _codec.Throughput(threads=2, disk_bps=1e15)
    slow_disk_ = _codec.Throughput(threads=2, disk_bps=1e3)
    # The first group's probe times the compressor; from then on the disk speed decides.
    first = _codec.encode([zeros] * (2 * _codec.PROBE_GROUP), level=3, speed=fast_disk)
    assert fast_disk.compress_bps is not None
    assert all(codec == CODEC_RAW for _, codec, _ in first[_codec.PROBE_GROUP :])
    slow = _codec.encode([zeros] * (2 * _codec.PROBE_GROUP), level=3, speed=slow_disk_)
    assert all(codec == CODEC_ZSTD for _, codec, _ in slow)


def test_throughput_estimates_follow_measurements() -> None:
    speed = _codec.Throughput(threads=4)
    assert speed.compression_pays(), "unknown compressor speed: the probe decides"
    speed.compressed(1 << 20, 1 / 500)  # 0.5 GB/s per thread, 4 threads: 2 GB/s
    speed.written(1 << 30, 1.0)  # disk: 1.07 GB/s, less than the margin below 2 GB/s
    assert not speed.compression_pays()
    speed.written(1 << 30, 4.0)  # the disk turns out slower: ~0.67 GB/s averaged
    assert speed.compression_pays()
    speed.written(1 << 30, 0.25)  # and faster again: ~2.5 GB/s averaged
    assert not speed.compression_pays()
    speed.written(100, 1.0)  # too small to say anything about the disk
    assert not speed.compression_pays()


class Timed(_codec.Throughput):
    """A Throughput that also records every probe it was given."""

    def __init__(self, threads: int, disk_bps: float) -> None:
        super().__init__(threads, disk_bps)
        self.probes: list[float] = []

    def compressed(self, nbytes: int, seconds: float) -> None:
        self.probes.append(nbytes / seconds)
        super().compressed(nbytes, seconds)


def test_a_threads_first_compression_is_not_what_gets_timed() -> None:
    chunk = memoryview(smooth(CHUNK // 4, np.float32).view(np.uint8))  # type: ignore[arg-type]
    calls: list[int] = []
    real = _codec._compress

    def counting(zstd: Any, data: memoryview, shuffle: int) -> tuple[bytes, str]:
        calls.append(len(data))
        return real(zstd, data, shuffle)

    speed = Timed(threads=1, disk_bps=1e3)

    def first_use() -> None:  # a new thread: its compressor has never run
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_codec, "_compress", counting)
            _codec.encode([chunk] * 3, level=3, itemsize=4, speed=speed)
            _codec.encode([chunk] * 3, level=3, itemsize=4, speed=speed)

    thread = threading.Thread(target=first_use)
    thread.start()
    thread.join()
    # one untimed warm-up, then the probe and the 2 other chunks, twice, warm the second time
    assert calls == [CHUNK] * 7
    assert len(speed.probes) == 2


def test_a_vetoed_compressor_is_timed_again_and_wins_back_a_slow_disk() -> None:
    noise = np.random.default_rng(7).integers(0, 4, 8 * CHUNK, dtype=np.uint8)  # compressible
    chunks = [memoryview(noise[i * CHUNK : (i + 1) * CHUNK]) for i in range(8)]  # type: ignore[arg-type]
    speed = Timed(threads=2, disk_bps=1e3)  # a slow disk: zstd should pay...
    speed.compress_bps = 1.0  # ...but a bad first estimate says zstd runs at 1 byte/s
    group = [chunks[i % 8] for i in range(_codec.PROBE_GROUP)]
    vetoed = [_codec.encode(group, level=3, speed=speed) for _ in range(_codec.RETIME_EVERY - 1)]
    assert all(codec == CODEC_RAW for out in vetoed for _, codec, _ in out)
    assert speed.probes == []
    retimed = _codec.encode(group, level=3, speed=speed)  # the RETIME_EVERY-th vetoed group
    assert [codec for _, codec, _ in retimed] == [CODEC_ZSTD] + [CODEC_RAW] * (len(group) - 1)
    assert len(speed.probes) == 1 and speed.compression_pays()
    after = _codec.encode(group, level=3, speed=speed)
    assert {codec for _, codec, _ in after} == {CODEC_ZSTD}


def test_a_shuffled_checkpoint_restores_and_a_corrupt_one_is_refused(tmp_path: Path) -> None:
    state = {
        "x": smooth(40 * CHUNK // 4, np.float32),
        "i": smooth(10 * CHUNK // 8, np.int64),
        "rec": np.zeros(500, dtype=[("a", "<i4"), ("b", "<f8")]),
        "step": 3,
    }
    with Checkpointer(tmp_path, chunk_size=CHUNK, keep_last=5) as ck:
        slow_disk(ck)
        ck.save(state, step=3)
    newest = tmp_path / "ckpt-0000000001.json"
    assert codecs(newest, "x") == {"zstd-s4"}
    assert codecs(newest, "i") == {"zstd-s8"}
    assert codecs(newest, "rec") == {CODEC_ZSTD}, "structured dtypes are not shuffled"
    with Checkpointer(tmp_path, chunk_size=CHUNK) as ck:
        got = ck.restore()
    assert got is not None
    for name in ("x", "i", "rec"):
        assert np.array_equal(got[0][name], state[name])
    pack = tmp_path / "ckpt-0000000001.pack"
    data = bytearray(pack.read_bytes())
    data[len(data) // 2] ^= 0x33
    pack.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=r"ckpt-0000000001\.pack"):
        verify(newest)


def test_a_fast_disk_gets_raw_chunks_even_when_zstd_would_gain(tmp_path: Path) -> None:
    state = {"x": smooth(64 * CHUNK // 4, np.float32)}
    with Checkpointer(tmp_path, chunk_size=CHUNK) as ck:
        speed = ck._writer.speed
        speed.disk_bps = 1e15
        speed.written = lambda nbytes, seconds: None  # type: ignore[method-assign]
        ck.save(state, step=1)
    chunks = read_manifest(tmp_path / "ckpt-0000000001.json")["arrays"]["x"]["chunks"]
    # Only the first group may be compressed: its probe ran before any speed was known.
    assert {c[5] for c in chunks[_codec.PROBE_GROUP :]} == {CODEC_RAW}
    with Checkpointer(tmp_path, chunk_size=CHUNK) as ck:
        got = ck.restore()
    assert got is not None and np.array_equal(got[0]["x"], state["x"])


def test_the_node_setting_compression_level_0_stores_every_chunk_raw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("M27_COMPRESSION_LEVEL", "0")  # as `compression_level = 0` in ~/.m2config
    state = {"x": smooth(64 * CHUNK // 4, np.float32)}
    with Checkpointer(tmp_path / "c", chunk_size=CHUNK) as ck:
        slow_disk(ck)  # where zstd would otherwise always be chosen
        ck.save(state, step=1)
    assert codecs(tmp_path / "c" / "ckpt-0000000001.json", "x") == {CODEC_RAW}
    with Checkpointer(tmp_path / "c", chunk_size=CHUNK) as ck:
        got = ck.restore()
    assert got is not None and np.array_equal(got[0]["x"], state["x"])


def test_gathered_writes_put_every_chunk_at_its_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from m27.checkpoint import _pack

    monkeypatch.setattr(_pack, "GATHER_BYTES", 3 * CHUNK + 1)  # flushes mid-array
    rng = np.random.default_rng(5)
    state = {"a": rng.random(10 * CHUNK // 8), "b": rng.integers(0, 9, 7 * CHUNK + 13)}
    with Checkpointer(tmp_path, chunk_size=CHUNK, compression_level=0) as ck:
        ck.save(state, step=1)
    verify(tmp_path / "ckpt-0000000001.json")
    with Checkpointer(tmp_path, chunk_size=CHUNK) as ck:
        got = ck.restore()
    assert got is not None
    assert np.array_equal(got[0]["a"], state["a"]) and np.array_equal(got[0]["b"], state["b"])
