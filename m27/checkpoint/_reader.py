"""Reading a checkpoint back: every chunk's hash is checked before a state is returned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from m27._exceptions import CorruptCheckpointError
from m27.checkpoint._chunks import chunk_span, dtype_from_json, n_chunks
from m27.checkpoint._format import check_packs, info, read_manifest
from m27.checkpoint._pack import PackReader


def load(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(manifest body, state) of the checkpoint at `path`, arrays as NumPy on the host.

    Raises CorruptCheckpointError naming the bad file if anything fails its check.
    """
    body = read_manifest(path)
    check_packs(path.parent, info(path, body))
    arrays: dict[str, Any] = {}
    with PackReader(path.parent) as reader:
        for name, entry in body["arrays"].items():
            arrays[name] = _load_array(path, name, entry, reader)
    values = body.get("values", {})
    state: dict[str, Any] = {}
    for name in body.get("order", [*arrays, *values]):
        state[name] = arrays[name] if name in arrays else values[name]
    return body, state


def verify(path: Path) -> dict[str, Any]:
    """Check the manifest and every chunk it references without keeping the state."""
    body = read_manifest(path)
    check_packs(path.parent, info(path, body))
    with PackReader(path.parent) as reader:
        for name, entry in body["arrays"].items():
            nbytes, size, chunks = _layout(path, name, entry)
            scratch = np.empty(min(size, nbytes), dtype=np.uint8)
            for i, ref in enumerate(chunks):
                start, end = chunk_span(i, nbytes, size)
                reader.read_into(ref, scratch[: end - start])
    return body


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


def _load_array(path: Path, name: str, entry: dict[str, Any], reader: PackReader) -> Any:
    nbytes, size, chunks = _layout(path, name, entry)
    dtype = dtype_from_json(entry["dtype"])
    array: npt.NDArray[Any] = np.empty(tuple(entry["shape"]), dtype=dtype)
    if array.nbytes != nbytes:
        raise CorruptCheckpointError(
            f"{path}: array {name!r} has {nbytes} bytes, its shape and dtype need {array.nbytes}",
            file=str(path),
        )
    if nbytes:
        flat = array.reshape(-1).view(np.uint8)
        for i, ref in enumerate(chunks):
            start, end = chunk_span(i, nbytes, size)
            reader.read_into(ref, flat[start:end])
    if entry.get("kind") == "scalar":
        return array[()]
    return array
