"""Only changed chunks are written; unchanged ones are referenced in older packs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from m27.checkpoint import Checkpointer, scan

CHUNK = 4096


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("M27_RUN_ID", "M27_RESUME_FROM", "M27_CHECKPOINT_DIR", "M2_CHUNK_SIZE"):
        monkeypatch.delenv(name, raising=False)


def body(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    parsed: dict[str, Any] = json.loads(data)["body"]
    return parsed


def pack_size(directory: Path, seq: int) -> int:
    pack = directory / f"ckpt-{seq:010d}.pack"
    return pack.stat().st_size if pack.exists() else 0


def noise(n: int, seed: int = 0) -> np.ndarray[Any, Any]:
    """8-byte random words: incompressible, so packs hold exactly the raw bytes."""
    return np.random.default_rng(seed).integers(0, 2**63, n, dtype=np.int64).view(np.uint64)


def test_a_second_save_writes_only_the_changed_chunk(tmp_path: Path) -> None:
    x = noise(64 * CHUNK // 8)  # 64 chunks
    with Checkpointer(tmp_path, chunk_size=CHUNK, compression_level=3) as ck:
        ck.save({"x": x}, step=1)
        ck.flush()
        x[10 * CHUNK // 8 + 3] = 1  # one value, inside chunk 10
        ck.save({"x": x}, step=2)
    assert pack_size(tmp_path, 1) == x.nbytes  # noise is stored raw
    assert pack_size(tmp_path, 2) == CHUNK
    second = body(tmp_path / "ckpt-0000000002.json")
    chunks = second["arrays"]["x"]["chunks"]
    assert [i for i, c in enumerate(chunks) if c[0] == 2] == [10]
    assert second["stats"]["chunks_changed"] == 1 and second["stats"]["bytes_changed"] == CHUNK
    listed = scan(tmp_path)
    assert listed[1].info is not None and listed[1].info.percent_changed == pytest.approx(100 / 64)


def test_an_unchanged_state_writes_no_pack_at_all(tmp_path: Path) -> None:
    x = noise(10 * CHUNK // 8)
    with Checkpointer(tmp_path, chunk_size=CHUNK) as ck:
        ck.save({"x": x, "energy": 1.0}, step=1)
        ck.save({"x": x, "energy": 2.0}, step=2)
    assert not (tmp_path / "ckpt-0000000002.pack").exists()
    with Checkpointer(tmp_path, chunk_size=CHUNK) as ck:
        got = ck.restore()
    assert got is not None
    state, step = got
    assert step == 2 and state["energy"] == 2.0 and np.array_equal(state["x"], x)


def test_compressible_chunks_are_stored_zstd_and_noise_raw(tmp_path: Path) -> None:
    zeros = np.zeros(8 * CHUNK, dtype=np.uint8)
    with Checkpointer(tmp_path, chunk_size=CHUNK, compression_level=3) as ck:
        ck.save({"z": zeros, "n": noise(8 * CHUNK // 8)}, step=1)
    arrays = body(tmp_path / "ckpt-0000000001.json")["arrays"]
    assert {c[5] for c in arrays["z"]["chunks"]} == {"zstd"}
    assert {c[5] for c in arrays["n"]["chunks"]} == {"raw"}
    assert pack_size(tmp_path, 1) < 8 * CHUNK + 8 * CHUNK * 0.05 + 200


def test_differential_saves_continue_after_a_restore(tmp_path: Path) -> None:
    x = noise(32 * CHUNK // 8)
    with Checkpointer(tmp_path, chunk_size=CHUNK) as ck:
        ck.save({"x": x}, step=1)
    with Checkpointer(tmp_path, chunk_size=CHUNK) as ck:
        got = ck.restore()
        assert got is not None
        y = got[0]["x"]
        y[0] = 5
        ck.save({"x": y}, step=2)
    assert pack_size(tmp_path, 2) == CHUNK
    with Checkpointer(tmp_path, chunk_size=CHUNK) as ck:
        again = ck.restore()
    assert again is not None and again[1] == 2 and np.array_equal(again[0]["x"], y)


def test_a_changed_shape_or_dtype_saves_that_array_in_full(tmp_path: Path) -> None:
    x = noise(4 * CHUNK // 8)
    with Checkpointer(tmp_path, chunk_size=CHUNK) as ck:
        ck.save({"x": x}, step=1)
        ck.save({"x": x.reshape(2, -1)}, step=2)
        ck.save({"x": x.view(np.int64).reshape(2, -1)}, step=3)
    assert pack_size(tmp_path, 2) == x.nbytes
    assert pack_size(tmp_path, 3) == x.nbytes
    with Checkpointer(tmp_path, chunk_size=CHUNK) as ck:
        got = ck.restore()
    assert got is not None and got[0]["x"].dtype == np.int64 and got[0]["x"].shape == (2, 1024)


def test_arrays_can_appear_and_disappear_between_saves(tmp_path: Path) -> None:
    a, b = noise(CHUNK, 1), noise(CHUNK, 2)
    with Checkpointer(tmp_path, chunk_size=CHUNK) as ck:
        ck.save({"a": a}, step=1)
        ck.save({"a": a, "b": b}, step=2)
        ck.save({"b": b}, step=3)
        ck.save({"a": a, "b": b}, step=4)
    assert pack_size(tmp_path, 2) == b.nbytes
    assert pack_size(tmp_path, 3) == 0
    assert pack_size(tmp_path, 4) == a.nbytes
    with Checkpointer(tmp_path, chunk_size=CHUNK) as ck:
        got = ck.restore()
    assert got is not None and set(got[0]) == {"a", "b"}
    assert np.array_equal(got[0]["a"], a) and np.array_equal(got[0]["b"], b)


def test_saved_data_is_a_snapshot_taken_before_save_returns(tmp_path: Path) -> None:
    x = noise(16 * CHUNK // 8)
    snapshot = x.copy()
    with Checkpointer(tmp_path, chunk_size=CHUNK, max_in_flight=2) as ck:
        ck.save({"x": x}, step=1)
        x[:] = 0  # the caller mutates at once; the background write must not see it
    with Checkpointer(tmp_path, chunk_size=CHUNK) as ck:
        got = ck.restore()
    assert got is not None and np.array_equal(got[0]["x"], snapshot)


def test_chunk_size_comes_from_m2_chunk_size_when_not_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("M2_CHUNK_SIZE", "8")  # KiB, as the seed wrote it
    x = noise(8 * 1024)  # 64 KiB
    with Checkpointer(tmp_path) as ck:
        assert ck.chunk_size == 8 * 1024
        ck.save({"x": x}, step=1)
    assert len(body(tmp_path / "ckpt-0000000001.json")["arrays"]["x"]["chunks"]) == 8


def test_resume_from_another_runs_checkpoint_restores_it_and_saves_in_full_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = noise(8 * CHUNK // 8)
    with Checkpointer(tmp_path / "old", chunk_size=CHUNK) as ck:
        ck.save({"x": x, "step": 30}, step=30)
    monkeypatch.setenv("M27_RESUME_FROM", str(tmp_path / "old" / "ckpt-0000000001.json"))
    with Checkpointer(tmp_path / "new", chunk_size=CHUNK) as ck:
        got = ck.restore()
        assert got is not None and got[1] == 30 and np.array_equal(got[0]["x"], x)
        ck.save(got[0], step=31)  # packs of another directory cannot be referenced
    assert pack_size(tmp_path / "new", 1) == x.nbytes
