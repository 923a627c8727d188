"""The CuPy path: device fingerprints, gather of changed chunks, CuPy back on its device.

Tests marked ``gpu`` need CuPy and an NVIDIA GPU: skipped where there is no NVIDIA GPU,
failed where there is one but CuPy does not load or see it. The chunk maths and the NumPy
twin of the fingerprint kernel are checked everywhere.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from m27.checkpoint import Checkpointer, _chunks, gpu
from tests.services import no_gpu

CHUNK = 4096


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("M27_RUN_ID", "M27_RESUME_FROM", "M27_CHECKPOINT_DIR", "M2_CHUNK_SIZE"):
        monkeypatch.delenv(name, raising=False)


# --- everywhere: the pure-Python parts ----------------------------------------------------


@pytest.mark.parametrize(
    ("nbytes", "chunk", "layout"),
    [(0, 64, (0, 0)), (1, 64, (1, 1)), (64, 64, (1, 64)), (65, 64, (2, 1)), (640, 64, (10, 64))],
)
def test_chunk_layout_counts_chunks_and_the_short_last_one(
    nbytes: int, chunk: int, layout: tuple[int, int]
) -> None:
    assert gpu.chunk_layout(nbytes, chunk) == layout


def test_gathered_size_is_full_chunks_except_the_arrays_last() -> None:
    changed = np.array([0, 3, 9], dtype=np.int64)
    assert gpu.gathered_size(changed, 9 * 64 + 10, 64) == 2 * 64 + 10
    assert gpu.gathered_size(changed, 10 * 64, 64) == 3 * 64
    assert gpu.gathered_size(np.array([], dtype=np.int64), 640, 64) == 0
    assert gpu.gathered_size(np.array([2], dtype=np.int64), 640, 64) == 64


def test_reference_fingerprint_sees_any_change_and_its_position() -> None:
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 10 * 256 + 37, dtype=np.uint8)
    base = gpu.fingerprint_reference(data, 256)
    assert base.shape == (11,) and len(set(base.tolist())) == 11
    assert np.array_equal(base, gpu.fingerprint_reference(data.copy(), 256))
    for pos in (0, 7, 8, 255, 256, 1000, data.shape[0] - 1):
        changed = data.copy()
        changed[pos] ^= 1
        diff = np.flatnonzero(gpu.fingerprint_reference(changed, 256) != base)
        assert diff.tolist() == [pos // 256], pos
    swapped = data.copy()
    swapped[[0, 8]] = swapped[[8, 0]]  # same words, other order
    if swapped[0] != data[0]:
        assert gpu.fingerprint_reference(swapped, 256)[0] != base[0]
    # Zero padding is not confused with real zeros: the length is mixed in.
    assert (
        gpu.fingerprint_reference(np.zeros(8, np.uint8), 16)[0]
        != gpu.fingerprint_reference(np.zeros(16, np.uint8), 16)[0]
    )


def test_numpy_arrays_are_not_taken_for_cupy() -> None:
    assert not gpu.is_cupy_array(np.zeros(3))
    assert not gpu.is_cupy_array([1, 2])


class FakeDeviceArray:
    """Stands in for a CuPy array (its module says `cupy`) over host memory."""

    __module__ = "cupy._fake"

    def __init__(self, host: np.ndarray[Any, Any], device: int = 0) -> None:
        self.host = host
        self.device = SimpleNamespace(id=device)
        self.dtype = host.dtype
        self.shape = host.shape


class FakeDiffer:
    """DeviceDiffer's contract in NumPy, using the kernel's reference fingerprint."""

    def __init__(self) -> None:
        self.cp = SimpleNamespace(cuda=SimpleNamespace(Device=lambda _: contextlib.nullcontext()))
        self.copied = 0

    def device_bytes(self, array: FakeDeviceArray) -> Any:
        return _chunks.host_bytes("fake", array.host)

    def fingerprints(self, data: Any, chunk: int) -> Any:
        return gpu.fingerprint_reference(data, chunk)

    def changed(self, fps: Any, previous: Any) -> Any:
        return np.flatnonzero(fps != previous)

    def copy_changed(self, data: Any, chunk: int, changed: Any, dest: Any) -> None:
        self.copied += dest.shape[0]
        _chunks.copy_changed(data, changed, chunk, dest)

    def to_device(self, host: Any, device: int | None) -> FakeDeviceArray:
        return FakeDeviceArray(host, device or 0)

    def pinned_empty(self, nbytes: int) -> Any:
        return np.empty(nbytes, dtype=np.uint8)


def test_device_arrays_take_the_device_path_and_copy_only_changed_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeDiffer()
    monkeypatch.setattr(gpu, "differ", lambda: fake)
    host = np.random.default_rng(3).integers(0, 2**62, 16 * CHUNK // 8)
    x = FakeDeviceArray(host, device=1)
    with Checkpointer(tmp_path, chunk_size=CHUNK, keep_last=10) as ck:
        ck.save({"x": x, "h": np.arange(3), "n": 1}, step=1)
        ck.flush()
        assert fake.copied == host.nbytes
        host[3 * CHUNK // 8] = -1
        host[-1] = -2
        ck.save({"x": x, "h": np.arange(3), "n": 2}, step=2)
        assert fake.copied == host.nbytes + 2 * CHUNK
    assert (tmp_path / "ckpt-0000000002.pack").stat().st_size == 2 * CHUNK
    with Checkpointer(tmp_path, chunk_size=CHUNK, keep_last=10) as ck:
        got = ck.restore()
        assert got is not None
        restored = got[0]["x"]
        assert isinstance(restored, FakeDeviceArray) and restored.device.id == 1
        assert np.array_equal(restored.host, host) and got[0]["n"] == 2
        restored.host[0] = 5
        ck.save({"x": restored, "h": np.arange(3), "n": 3}, step=3)
    assert (tmp_path / "ckpt-0000000003.pack").stat().st_size == CHUNK


# --- on a GPU -----------------------------------------------------------------------------


@pytest.fixture
def cp() -> Any:
    try:
        import cupy
    except ImportError as exc:
        no_gpu(f"CuPy does not import: {exc}")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            no_gpu("CuPy sees no GPU")
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        no_gpu(f"CuPy finds no CUDA device: {exc}")
    return cupy


@pytest.mark.gpu
@pytest.mark.parametrize("nbytes", [0, 1, 4095, 4096, 4097, 5 * 4096 + 13])
@pytest.mark.parametrize("offset", [0, 1, 8])
def test_device_fingerprints_match_the_numpy_reference(cp: Any, nbytes: int, offset: int) -> None:
    host = np.random.default_rng(nbytes).integers(0, 256, nbytes + offset, dtype=np.uint8)
    device = cp.asarray(host)[offset:]  # offset 1: an unaligned view exercises the byte path
    got = gpu.differ().fingerprints(device, CHUNK).get()
    assert np.array_equal(got, gpu.fingerprint_reference(host[offset:], CHUNK))


@pytest.mark.gpu
def test_gather_copies_exactly_the_changed_chunks(cp: Any) -> None:
    host = np.random.default_rng(1).integers(0, 256, 10 * CHUNK + 100, dtype=np.uint8)
    for offset in (0, 3):
        device = cp.asarray(np.concatenate([np.zeros(offset, np.uint8), host]))[offset:]
        changed = np.array([0, 4, 5, 10], dtype=np.int64)
        dest = np.zeros(gpu.gathered_size(changed, host.shape[0], CHUNK), dtype=np.uint8)
        gpu.differ().copy_changed(device, CHUNK, changed, dest)
        want = np.concatenate([host[i * CHUNK : (i + 1) * CHUNK] for i in changed.tolist()])
        assert np.array_equal(dest, want)


@pytest.mark.gpu
def test_cupy_state_round_trips_as_cupy_on_its_device(cp: Any, tmp_path: Path) -> None:
    x = cp.random.random((300, 7), dtype=cp.float32)
    state = {
        "x": x,
        "strided": x[::2, 1:],
        "i": cp.arange(5, dtype=cp.int16),
        "host": np.ones(4),
        "e": 1.5,
    }
    with Checkpointer(tmp_path, chunk_size=CHUNK) as ck:
        ck.save(state, step=3)
    with Checkpointer(tmp_path, chunk_size=CHUNK) as ck:
        got = ck.restore()
    assert got is not None
    restored, step = got
    assert step == 3 and restored["e"] == 1.5 and isinstance(restored["host"], np.ndarray)
    for name in ("x", "strided", "i"):
        assert isinstance(restored[name], cp.ndarray)
        assert restored[name].device.id == state[name].device.id
        assert restored[name].dtype == state[name].dtype
        assert bool(cp.all(restored[name] == state[name]))


@pytest.mark.gpu
def test_only_changed_device_chunks_reach_the_pack(cp: Any, tmp_path: Path) -> None:
    x = cp.asarray(np.random.default_rng(2).integers(0, 2**62, 64 * CHUNK // 8))
    with Checkpointer(tmp_path, chunk_size=CHUNK, keep_last=10) as ck:
        ck.save({"x": x}, step=1)
        x[5 * CHUNK // 8] = -1  # chunk 5
        x[40 * CHUNK // 8 + 3] = -2  # chunk 40
        ck.save({"x": x}, step=2)
        ck.save({"x": x}, step=3)  # nothing changed
    assert (tmp_path / "ckpt-0000000002.pack").stat().st_size == 2 * CHUNK
    assert not (tmp_path / "ckpt-0000000003.pack").exists()
    with Checkpointer(tmp_path, chunk_size=CHUNK, keep_last=10) as ck:
        got = ck.restore()
        assert got is not None and bool(cp.all(got[0]["x"] == x))
        y = got[0]["x"]
        y[0] = 7  # differential after a restore too
        ck.save({"x": y}, step=4)
    assert (tmp_path / "ckpt-0000000004.pack").stat().st_size == CHUNK
