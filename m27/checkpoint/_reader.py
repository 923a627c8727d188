"""Reading a checkpoint back: every chunk's hash is checked before a state is returned.

Arrays are allocated once and filled in place: raw chunks are read straight into them,
compressed ones decompressed straight into them, and the hash is checked on the array's
own memory. The chunks are cut into runs of ~:data:`RUN_BYTES` read by several threads.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from m27._exceptions import CorruptCheckpointError
from m27.checkpoint._chunks import dtype_from_json, n_chunks
from m27.checkpoint._format import check_packs, info, read_manifest
from m27.checkpoint._pack import PackReader
from m27.checkpoint._parallel import Workers, default_threads

#: Bytes of chunks one thread reads in one go (enough to amortise the hand-off).
RUN_BYTES = 4 * 1024 * 1024

_local = threading.local()
_Run = tuple[Sequence[list[Any]], "npt.NDArray[np.uint8] | None", int, int, int]


def load(path: Path, workers: Workers | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(manifest body, state) of the checkpoint at `path`, arrays as NumPy on the host.

    Raises CorruptCheckpointError naming the bad file if anything fails its check.
    """
    body, layouts = _checked(path)
    arrays: dict[str, Any] = {}
    runs: list[_Run] = []
    for name, (dtype, shape, nbytes, size, chunks) in layouts.items():
        array: npt.NDArray[Any] = np.empty(shape, dtype=dtype)
        if nbytes:
            runs += _runs(chunks, array.reshape(-1).view(np.uint8), nbytes, size)
        arrays[name] = array
    _read(path, runs, workers)
    for name, entry in body["arrays"].items():
        if entry.get("kind") == "scalar":
            arrays[name] = arrays[name][()]
    values = body.get("values", {})
    state: dict[str, Any] = {}
    for name in body.get("order", [*arrays, *values]):
        state[name] = arrays[name] if name in arrays else values[name]
    return body, state


def verify(path: Path, workers: Workers | None = None) -> dict[str, Any]:
    """Check the manifest and every chunk it references without keeping the state."""
    body, layouts = _checked(path)
    runs: list[_Run] = []
    for _dtype, _shape, nbytes, size, chunks in layouts.values():
        runs += _runs(chunks, None, nbytes, size)
    _read(path, runs, workers)
    return body


_Layout = tuple[np.dtype[Any], tuple[int, ...], int, int, list[Any]]


def _checked(path: Path) -> tuple[dict[str, Any], dict[str, _Layout]]:
    """The manifest at `path` and each array's (dtype, shape, bytes, chunk size, chunks),
    every field checked: a manifest whose hash holds can still say what no save writes (a
    file edited and re-hashed, a bug), and `verify` called it ok or stopped on a
    TypeError, and a restore died on an AttributeError instead of trying an older one."""
    body = read_manifest(path)
    check_packs(path.parent, info(path, body))
    try:
        entries = body["arrays"]
        layouts = {name: _array_layout(path, name, entry) for name, entry in entries.items()}
        values, order = body.get("values", {}), body.get("order", [*entries])
        if not isinstance(values, dict) or not all(n in entries or n in values for n in order):
            raise ValueError("its order names a value it does not have")
    except (AttributeError, KeyError, TypeError, ValueError, OverflowError) as exc:
        raise CorruptCheckpointError(
            f"{path}: manifest is malformed: {type(exc).__name__}: {exc}", file=str(path)
        ) from None
    return body, layouts


def _array_layout(path: Path, name: str, entry: dict[str, Any]) -> _Layout:
    nbytes, size, chunks = _layout(path, name, entry)
    dtype = dtype_from_json(entry["dtype"])
    shape = tuple(entry["shape"])
    if dtype.hasobject or not all(type(n) is int and n >= 0 for n in shape):
        raise CorruptCheckpointError(
            f"{path}: array {name!r} has dtype {dtype} and shape {shape}, which no save writes",
            file=str(path),
        )
    need = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if need != nbytes:
        raise CorruptCheckpointError(
            f"{path}: array {name!r} has {nbytes} bytes, its shape and dtype need {need}",
            file=str(path),
        )
    if not all(_a_ref(ref) for ref in chunks):
        raise CorruptCheckpointError(
            f"{path}: array {name!r} has a chunk reference that is not [pack, offset, "
            "stored, length, hash, codec]",
            file=str(path),
        )
    return dtype, shape, nbytes, size, chunks


def _runs(
    chunks: list[Any], flat: npt.NDArray[np.uint8] | None, nbytes: int, size: int
) -> list[_Run]:
    per_run = max(1, RUN_BYTES // size)
    out: list[_Run] = []
    for first in range(0, len(chunks), per_run):
        start = first * size
        end = min(nbytes, (first + per_run) * size)
        out.append((chunks[first : first + per_run], flat, start, end, size))
    return out


def _batches(runs: list[_Run]) -> list[list[_Run]]:
    """`runs` in tasks of about RUN_BYTES each: a big array's runs one per task, small
    arrays many to a task (10,000 arrays of 4 kB were 10,000 futures: 1.4 s to restore
    40 MB)."""
    out: list[list[_Run]] = []
    total = RUN_BYTES
    for run in runs:
        n = run[3] - run[2]
        if total + n > RUN_BYTES:
            out.append([])
            total = 0
        out[-1].append(run)
        total += n
    return out


def _read(path: Path, runs: list[_Run], workers: Workers | None) -> None:
    own = workers is None
    pool = Workers(default_threads(), "m27-ckpt-read") if workers is None else workers
    try:
        with PackReader(path.parent) as reader:

            def read(batch: list[_Run]) -> None:
                for refs, flat, start, end, size in batch:
                    dest = flat[start:end] if flat is not None else _scratch(end - start)
                    reader.read_run(refs, dest, size)

            pool.run_all(read, _batches(runs))
    finally:
        if own:
            pool.close()


def _scratch(nbytes: int) -> npt.NDArray[np.uint8]:
    """This thread's throwaway destination for verify, reused between runs."""
    buffer: npt.NDArray[np.uint8] | None = getattr(_local, "scratch", None)
    if buffer is None or buffer.shape[0] < nbytes:
        buffer = _local.scratch = np.empty(nbytes, dtype=np.uint8)
    return buffer[:nbytes]


def _a_ref(ref: Any) -> bool:
    """Whether `ref` is a chunk reference a save writes: [pack, offset, stored bytes,
    bytes, hash, codec], the first four whole numbers >= 0."""
    return (
        isinstance(ref, list) and len(ref) == 6 and all(type(n) is int and n >= 0 for n in ref[:4])
    )


def _layout(path: Path, name: str, entry: dict[str, Any]) -> tuple[int, int, list[Any]]:
    nbytes = int(entry["nbytes"])
    size = int(entry["chunk_size"])
    chunks = entry["chunks"]
    if size <= 0 or len(chunks) != n_chunks(nbytes, size):
        raise CorruptCheckpointError(
            f"{path}: array {name!r} lists {len(chunks)} chunks for {nbytes} bytes",
            file=str(path),
        )
    return nbytes, size, chunks
