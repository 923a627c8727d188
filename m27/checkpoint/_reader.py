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
    body = read_manifest(path)
    check_packs(path.parent, info(path, body))
    arrays: dict[str, Any] = {}
    runs: list[_Run] = []
    for name, entry in body["arrays"].items():
        nbytes, size, chunks = _layout(path, name, entry)
        dtype = dtype_from_json(entry["dtype"])
        array: npt.NDArray[Any] = np.empty(tuple(entry["shape"]), dtype=dtype)
        if array.nbytes != nbytes:
            raise CorruptCheckpointError(
                f"{path}: array {name!r} has {nbytes} bytes, "
                f"its shape and dtype need {array.nbytes}",
                file=str(path),
            )
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
    body = read_manifest(path)
    check_packs(path.parent, info(path, body))
    runs: list[_Run] = []
    for name, entry in body["arrays"].items():
        nbytes, size, chunks = _layout(path, name, entry)
        runs += _runs(chunks, None, nbytes, size)
    _read(path, runs, workers)
    return body


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
