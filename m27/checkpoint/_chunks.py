"""Cutting arrays into fixed-size chunks and fingerprinting them on the CPU.

A chunk is ``chunk_size`` bytes of the array's C-order bytes (the last one may be shorter).
The fingerprint is xxh3_64 of the chunk, computed over ``memoryview`` slices of one
contiguous buffer: no per-chunk copies, 8 bytes of memory per chunk kept between saves.
Large arrays are hashed in slices on a few threads (xxh3 releases the GIL).

Two ways give the same values. The compiled ``m27.checkpoint._spans`` (csrc/spans.c,
built at install when a C compiler is there) hashes a whole slice of chunks per call with
the GIL released: two threads run at memory speed (1 GiB: ~34 ms) and every save simply
hashes every chunk. Without it, one xxhash call per chunk from Python: the GIL hand-off
between calls costs more than the hashing, so while changes are sparse a save hashes
1 MiB groups first and only the chunks of the groups that changed (`diff_chunks`).
The same value doubles as the stored verification hash, so after a restore the
fingerprints come from the manifest for free.

Non-contiguous views (slices with steps, transposes, Fortran order) are made contiguous
with ``np.ascontiguousarray``: that is one full copy of that array per save, at memory
speed (~13 GB/s); store contiguous arrays in hot loops to avoid it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from m27._exceptions import CheckpointError
from m27.checkpoint._parallel import Workers

try:
    from m27.checkpoint import _spans as _native_module

    _native: ModuleType | None = _native_module
except ImportError:  # installed without a C compiler: chunks are hashed from Python
    _native = None

_xxh3_64 = xxhash.xxh3_64_intdigest
#: Less data than this is hashed and copied in the caller's thread (xxh3 takes ~2 ms for it).
_PARALLEL_BYTES = 16 * 1024 * 1024


def n_chunks(nbytes: int, chunk_size: int) -> int:
    """How many chunks `nbytes` make (0 for an empty array)."""
    return -(-nbytes // chunk_size)


def chunk_span(index: int, nbytes: int, chunk_size: int) -> tuple[int, int]:
    """[start, end) byte range of chunk `index`."""
    start = index * chunk_size
    return start, min(start + chunk_size, nbytes)


def host_bytes(name: str, array: npt.NDArray[Any]) -> npt.NDArray[np.uint8]:
    """The array's C-order bytes as a flat uint8 array (a view when already contiguous)."""
    if array.dtype.hasobject:
        raise CheckpointError(
            f"state[{name!r}] has dtype {array.dtype} holding Python objects; "
            "only plain NumPy/CuPy dtypes can be checkpointed",
            array=name,
        )
    contiguous = np.ascontiguousarray(array)
    return contiguous.reshape(-1).view(np.uint8)


def native_hashing() -> bool:
    """Whether chunk fingerprints come from the compiled ``m27.checkpoint._spans``."""
    return _native is not None


def fingerprints(
    data: npt.NDArray[np.uint8],
    chunk_size: int,
    workers: Workers | None = None,
    indices: npt.NDArray[np.int64] | None = None,
) -> npt.NDArray[np.uint64]:
    """xxh3_64 of every chunk of `data` (or of the chunks at `indices`), in slices on
    `workers` when that is much data."""
    native = _native
    if native is not None:
        return _native_fingerprints(native, data, chunk_size, workers, indices)
    view = memoryview(data)  # type: ignore[arg-type]
    nbytes = data.shape[0]
    offsets: Sequence[int] = (
        range(0, nbytes, chunk_size) if indices is None else (indices * chunk_size).tolist()
    )
    count = len(offsets)
    out = np.empty(count, dtype=np.uint64)

    def hash_range(span: tuple[int, int]) -> None:
        first, last = span
        # the slices first, then one C-level map over them: between two xxh3 calls (each
        # releases the GIL) as little Python as possible runs, so two threads wait less
        # for the GIL (1 GiB in 128 KiB chunks on two threads: ~47 against ~51 ms)
        views = [view[o : o + chunk_size] for o in offsets[first:last]]
        out[first:last] = np.fromiter(map(_xxh3_64, views), dtype=np.uint64, count=last - first)

    parts = 1
    if workers is not None and min(nbytes, count * chunk_size) >= _PARALLEL_BYTES:
        parts = 4 * workers.count
    step = -(-count // parts) if count else 1
    spans = [(first, min(first + step, count)) for first in range(0, count, step)]
    if workers is None or len(spans) <= 1:
        for span in spans:
            hash_range(span)
    else:
        workers.run_all(hash_range, spans)
    return out


def _native_fingerprints(
    native: ModuleType,
    data: npt.NDArray[np.uint8],
    chunk_size: int,
    workers: Workers | None,
    indices: npt.NDArray[np.int64] | None,
) -> npt.NDArray[np.uint64]:
    """`fingerprints` through the compiled module: one call per thread's slice."""
    count = n_chunks(data.shape[0], chunk_size) if indices is None else len(indices)
    wanted = None if indices is None else np.ascontiguousarray(indices, dtype=np.int64)
    out = np.empty(count, dtype=np.uint64)

    def hash_range(span: tuple[int, int]) -> None:
        first, last = span
        if wanted is None:
            native.hash_range(data, chunk_size, first, out[first:last])
        else:
            native.hash_indices(data, chunk_size, wanted[first:last], out[first:last])

    if workers is None or workers.count < 2 or count * chunk_size < _PARALLEL_BYTES:
        hash_range((0, count))
        return out
    # a few slices per thread, so one thread that the OS delays does not hold up the rest
    step = -(-count // (2 * workers.count))
    workers.run_all(hash_range, [(f, min(f + step, count)) for f in range(0, count, step)])
    return out


@dataclass(frozen=True)
class ChunkDiff:
    """One save's look at a host array: its chunk fingerprints, the chunks that differ
    from the last save, and the group fingerprints the next save may start from.

    `groups` holds xxh3 of each `GROUP_BYTES` group of chunks while changes are sparse:
    the next save then hashes whole groups (one call per group) and only the chunks of
    the groups that changed. Each xxh3 call over memory costs ~1 us beyond its bytes
    (the call itself ~35 ns; it is the reading that slows: one thread over 1 GiB, 128 KiB
    calls 74 ms, 1 MiB calls 66 ms, the same in cache 19 ms either way), so with 1 % of a
    1 GiB state's chunks changed at random that is ~1,700 calls (1,024 groups, the
    chunks of ~80 changed groups) instead of 8,192. After a dense save (more than
    `DENSE_GROUPS` of the groups changed) `groups` is None and the next save hashes
    chunks directly: a group pass would only add work.
    """

    chunks: npt.NDArray[np.uint64]
    changed: npt.NDArray[np.int64]
    groups: npt.NDArray[np.uint64] | None


#: Bytes one group fingerprint covers (whole chunks; no groups when a chunk is larger).
GROUP_BYTES = 1 << 20
#: Above this fraction of changed groups a save counts as dense (see `ChunkDiff`).
DENSE_GROUPS = 0.25


def diff_chunks(
    data: npt.NDArray[np.uint8],
    chunk_size: int,
    workers: Workers | None,
    chunks_before: npt.NDArray[np.uint64] | None,
    groups_before: npt.NDArray[np.uint64] | None,
) -> ChunkDiff:
    """Fingerprint `data` and find the chunks that differ from `chunks_before` (all of
    them when None), through `groups_before` when the last save kept group fingerprints."""
    count = n_chunks(data.shape[0], chunk_size)
    per_group = GROUP_BYTES // chunk_size
    if chunks_before is None:
        chunks = fingerprints(data, chunk_size, workers)
        return ChunkDiff(chunks, np.arange(count, dtype=np.int64), None)
    if _native is not None:  # every chunk at memory speed: groups would only add a pass
        chunks = fingerprints(data, chunk_size, workers)
        return ChunkDiff(chunks, np.flatnonzero(chunks != chunks_before), None)
    group_size = per_group * chunk_size
    if groups_before is not None:
        groups: npt.NDArray[np.uint64] | None = fingerprints(data, group_size, workers)
        moved = np.flatnonzero(groups != groups_before)
        candidates = (moved[:, None] * per_group + np.arange(per_group)).ravel()
        candidates = candidates[candidates < count]
        chunks = chunks_before.copy()
        chunks[candidates] = fingerprints(data, chunk_size, workers, candidates)
        changed = candidates[chunks[candidates] != chunks_before[candidates]]
    else:
        groups = None
        chunks = fingerprints(data, chunk_size, workers)
        changed = np.flatnonzero(chunks != chunks_before)
    if per_group < 2:
        return ChunkDiff(chunks, changed, None)
    moved_groups = np.unique(changed // per_group).size
    if moved_groups > DENSE_GROUPS * n_chunks(data.shape[0], group_size):
        return ChunkDiff(chunks, changed, None)
    if groups is None:  # sparse after a dense save: the next save starts from groups
        groups = fingerprints(data, group_size, workers)
    return ChunkDiff(chunks, changed, groups)


def chunk_hash(data: memoryview | bytes) -> int:
    """The verification hash of one chunk's raw bytes (xxh3_64)."""
    return _xxh3_64(data)


def runs(indices: npt.NDArray[np.int64]) -> list[tuple[int, int]]:
    """Sorted chunk indices as [first, last] runs of consecutive chunks (one copy per run)."""
    if indices.size == 0:
        return []
    first, last = int(indices[0]), int(indices[-1])
    if last - first == indices.size - 1:  # sorted and distinct: one run (a small or dense array)
        return [(first, last)]
    breaks = np.flatnonzero(np.diff(indices) != 1)
    starts = np.concatenate(([0], breaks + 1))
    ends = np.concatenate((breaks, [indices.size - 1]))
    return [(int(indices[s]), int(indices[e])) for s, e in zip(starts, ends, strict=True)]


def copy_changed(
    data: npt.NDArray[np.uint8],
    indices: npt.NDArray[np.int64],
    chunk_size: int,
    dest: npt.NDArray[np.uint8],
    workers: Workers | None = None,
) -> int:
    """Copy the chunks at `indices` of `data` back to back into `dest`; bytes copied.

    Changed chunks land compactly in index order, so chunk k of `indices` starts at
    ``k * chunk_size`` in `dest` (only the array's last chunk can be short). Much data is
    copied on `workers` in one contiguous share each: a NumPy copy releases the GIL, and
    one large copy per thread is the fastest shape (glibc switches to non-temporal stores
    above a size; two 512 MiB halves of 1 GiB took 47 ms here, one copy 86 ms, eight
    128 MiB pieces on two threads 78 ms).
    """
    nbytes = data.shape[0]
    pieces: list[tuple[int, int, int]] = []  # (source start, dest start, length)
    pos = 0
    for first, last in runs(indices):
        start = first * chunk_size
        end = min((last + 1) * chunk_size, nbytes)
        pieces.append((start, pos, end - start))
        pos += end - start

    def copy(share: list[tuple[int, int, int]]) -> None:
        for source, target, length in share:
            dest[target : target + length] = data[source : source + length]

    if workers is None or workers.count < 2 or pos < _PARALLEL_BYTES:
        copy(pieces)
    else:
        workers.run_all(copy, shares(pieces, pos, workers.count))
    return pos


def shares(
    pieces: list[tuple[int, int, int]], total: int, count: int
) -> list[list[tuple[int, int, int]]]:
    """Cut back-to-back (source, dest, length) copies into `count` shares of nearly equal
    bytes, splitting a copy where a share ends."""
    size = max(1, -(-total // count))
    out: list[list[tuple[int, int, int]]] = [[] for _ in range(count)]
    for source, target, length in pieces:
        while length:
            share = target // size
            take = min(length, (share + 1) * size - target)
            out[share].append((source, target, take))
            source, target, length = source + take, target + take, length - take
    return [share for share in out if share]


def changed_bytes(indices: npt.NDArray[np.int64], nbytes: int, chunk_size: int) -> int:
    """Total bytes of the chunks at `indices` (all full but possibly the array's last)."""
    if indices.size == 0:
        return 0
    total = int(indices.size) * chunk_size
    last = n_chunks(nbytes, chunk_size) - 1
    if int(indices[-1]) == last:
        total -= last * chunk_size + chunk_size - nbytes
    return total


def dtype_to_json(dtype: np.dtype[Any]) -> Any:
    """A JSON-able description of `dtype` (byte order, structured fields included)."""
    return np.lib.format.dtype_to_descr(dtype)


def dtype_from_json(descr: Any) -> np.dtype[Any]:
    """Inverse of :func:`dtype_to_json` after a JSON round trip (lists back to tuples)."""
    return np.lib.format.descr_to_dtype(_tuplify(descr))


def _tuplify(descr: Any) -> Any:
    if isinstance(descr, str):
        return descr
    fields = []
    for field in descr:
        name, sub, *rest = field
        if isinstance(name, list):
            name = tuple(name)
        item: tuple[Any, ...] = (name, _tuplify(sub))
        if rest:
            item += (tuple(rest[0]),)
        fields.append(item)
    return fields
