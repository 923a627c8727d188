"""The CuPy path: fingerprints on the device, and only changed chunks cross to the host.

The only module of m27 that compiles CUDA kernels. CuPy is imported lazily: without it
(or without a GPU) nothing here is touched and CuPy arrays cannot occur in a state.

Per save of a CuPy array:

1. ``m27_fingerprint``: one block per chunk sums ``mix(word ^ j * K1)`` over the chunk's
   64-bit little-endian words (``mix`` is the splitmix64 finaliser), then mixes the sum with
   the chunk length. Position-dependent, order-insensitive inside a block so it reduces in
   parallel; 64 bits, so an accidental collision is ~2^-64 per changed chunk.
2. Compare with the previous fingerprints on the device; only the changed indices (8 bytes
   each) come to the host.
3. ``m27_gather`` packs the changed chunks back to back into one device buffer, and one
   device-to-host copy moves them into pinned staging memory.

The stored verification hash is still xxh3_64 of the bytes, computed by the background
writer on the host, so a checkpoint written from a GPU restores on a machine without one.
:func:`fingerprint_reference` is the NumPy twin of the kernel, used by tests.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import numpy.typing as npt

K1 = 0x9E3779B97F4A7C15
K2 = 0xD6E8FEB86659FD93
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
THREADS = 256

_SOURCE = r"""
typedef unsigned long long u64;
__device__ __forceinline__ u64 m27_mix(u64 z) {
    z ^= z >> 30; z *= 0xBF58476D1CE4E5B9ULL;
    z ^= z >> 27; z *= 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

extern "C" __global__ void m27_fingerprint(const unsigned char* data, long long nbytes,
                                           long long chunk, int aligned, u64* out) {
    __shared__ u64 acc[256];
    long long start = (long long)blockIdx.x * chunk;
    long long len = nbytes - start < chunk ? nbytes - start : chunk;
    long long nwords = (len + 7) / 8;
    const unsigned char* base = data + start;
    u64 sum = 0;
    for (long long j = threadIdx.x; j < nwords; j += blockDim.x) {
        u64 w = 0;
        if (aligned && 8 * j + 8 <= len) {
            w = ((const u64*)base)[j];
        } else {
            for (int b = 0; b < 8; ++b) {
                long long p = 8 * j + b;
                if (p < len) w |= ((u64)base[p]) << (8 * b);
            }
        }
        sum += m27_mix(w ^ ((u64)j * 0x9E3779B97F4A7C15ULL));
    }
    acc[threadIdx.x] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) acc[threadIdx.x] += acc[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = m27_mix(acc[0] ^ ((u64)len * 0xD6E8FEB86659FD93ULL));
}

extern "C" __global__ void m27_gather(const unsigned char* data, long long nbytes,
                                      long long chunk, const long long* idx, int aligned,
                                      unsigned char* dst) {
    long long start = idx[blockIdx.x] * chunk;
    long long len = nbytes - start < chunk ? nbytes - start : chunk;
    const unsigned char* src = data + start;
    unsigned char* out = dst + (long long)blockIdx.x * chunk;
    long long done = 0;
    if (aligned) {
        long long nvec = len / 16;
        for (long long v = threadIdx.x; v < nvec; v += blockDim.x)
            ((uint4*)out)[v] = ((const uint4*)src)[v];
        done = nvec * 16;
    }
    for (long long p = done + threadIdx.x; p < len; p += blockDim.x) out[p] = src[p];
}
"""


def is_cupy_array(value: object) -> bool:
    """True for a CuPy ndarray, without importing CuPy."""
    return type(value).__module__.split(".")[0] == "cupy" and hasattr(value, "device")


def chunk_layout(nbytes: int, chunk: int) -> tuple[int, int]:
    """(number of chunks, length of the last one) of `nbytes` cut into `chunk`-byte pieces."""
    if nbytes == 0:
        return 0, 0
    count = -(-nbytes // chunk)
    return count, nbytes - (count - 1) * chunk


def gathered_size(changed: npt.NDArray[np.int64], nbytes: int, chunk: int) -> int:
    """Bytes the gather of chunks `changed` produces (chunk k lands at ``k * chunk``)."""
    if changed.size == 0:
        return 0
    count, last = chunk_layout(nbytes, chunk)
    return (int(changed.size) - 1) * chunk + (last if int(changed[-1]) == count - 1 else chunk)


def _mix(z: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(_M1)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(_M2)
    return z ^ (z >> np.uint64(31))


def fingerprint_reference(data: npt.NDArray[np.uint8], chunk: int) -> npt.NDArray[np.uint64]:
    """The device fingerprint of every chunk, computed with NumPy (for tests)."""
    if chunk % 8:
        raise ValueError("the reference needs a chunk size that is a multiple of 8")
    nbytes = int(data.shape[0])
    count, _ = chunk_layout(nbytes, chunk)
    out = np.empty(count, dtype=np.uint64)
    for c in range(count):
        piece = data[c * chunk : (c + 1) * chunk]
        padded = np.zeros(-(-piece.shape[0] // 8) * 8, dtype=np.uint8)
        padded[: piece.shape[0]] = piece
        words = padded.view("<u8").astype(np.uint64)
        j = np.arange(words.shape[0], dtype=np.uint64)
        total = np.sum(_mix(words ^ (j * np.uint64(K1))), dtype=np.uint64)
        length = np.array([piece.shape[0]], dtype=np.uint64) * np.uint64(K2)
        out[c] = _mix(np.array([total], dtype=np.uint64) ^ length)[0]
    return out


class DeviceDiffer:
    """Compiled kernels and a reusable gather buffer per device."""

    def __init__(self) -> None:
        import cupy

        self.cp: Any = cupy
        self._gather_buffers: dict[int, Any] = {}

    @functools.cached_property
    def _module(self) -> Any:
        return self.cp.RawModule(code=_SOURCE)

    def device_bytes(self, array: Any) -> Any:
        """The array's C-order bytes as a flat uint8 CuPy array (a view when contiguous)."""
        if array.dtype.hasobject:  # pragma: no cover - CuPy has no object dtype today
            raise TypeError("object dtype")
        return self.cp.ascontiguousarray(array).reshape(-1).view(self.cp.uint8)

    def fingerprints(self, data: Any, chunk: int) -> Any:
        """Per-chunk 64-bit fingerprints of flat uint8 device `data`, on the device."""
        nbytes = int(data.shape[0])
        count, _ = chunk_layout(nbytes, chunk)
        out = self.cp.empty(count, dtype=self.cp.uint64)
        if count:
            aligned = int(data.data.ptr % 8 == 0 and chunk % 8 == 0)
            kernel = self._module.get_function("m27_fingerprint")
            kernel(
                (count,),
                (THREADS,),
                (data, np.int64(nbytes), np.int64(chunk), np.int32(aligned), out),
            )
        return out

    def changed(self, fingerprints: Any, previous: Any) -> npt.NDArray[np.int64]:
        """Indices (on the host) of chunks whose fingerprint differs from `previous`."""
        diff = self.cp.flatnonzero(fingerprints != previous)
        result: npt.NDArray[np.int64] = diff.get().astype(np.int64)
        return result

    def copy_changed(
        self, data: Any, chunk: int, changed: npt.NDArray[np.int64], dest: npt.NDArray[np.uint8]
    ) -> None:
        """Gather chunks `changed` of device `data` into host `dest` with one D2H copy."""
        cp = self.cp
        nbytes = int(data.shape[0])
        size = gathered_size(changed, nbytes, chunk)
        if size == 0:
            return
        count, _ = chunk_layout(nbytes, chunk)
        if changed.size == count:
            data.get(out=dest[:size])
            return
        device = int(data.device.id)
        buffer = self._gather_buffers.get(device)
        if buffer is None or buffer.shape[0] < size:
            buffer = cp.empty(size, dtype=cp.uint8)
            self._gather_buffers[device] = buffer
        index = cp.asarray(changed, dtype=cp.int64)
        aligned = int(data.data.ptr % 16 == 0 and buffer.data.ptr % 16 == 0 and chunk % 16 == 0)
        kernel = self._module.get_function("m27_gather")
        kernel(
            (int(changed.size),),
            (THREADS,),
            (data, np.int64(nbytes), np.int64(chunk), index, np.int32(aligned), buffer),
        )
        buffer[:size].get(out=dest[:size])

    def to_device(self, host: npt.NDArray[Any], device: int | None) -> Any:
        with self.cp.cuda.Device(device or 0):
            return self.cp.asarray(host)

    def pinned_empty(self, nbytes: int) -> npt.NDArray[np.uint8]:
        """Page-locked host memory, so the D2H copy runs at full PCIe/NVLink speed."""
        memory = self.cp.cuda.alloc_pinned_memory(max(1, nbytes))
        return np.frombuffer(memory, dtype=np.uint8, count=nbytes)


@functools.cache
def differ() -> DeviceDiffer:
    """The process's DeviceDiffer (kernels compile once, on first use)."""
    return DeviceDiffer()
