"""Types of the compiled ``m27.checkpoint._spans`` (source: csrc/spans.c)."""

from typing_extensions import Buffer

def hash_range(data: Buffer, chunk_size: int, first: int, out: Buffer, /) -> None:
    """xxh3_64 of chunks ``first, first+1, ...`` of `data` into `out` (uint64)."""

def hash_indices(data: Buffer, chunk_size: int, indices: Buffer, out: Buffer, /) -> None:
    """xxh3_64 of the chunks at `indices` (int64) of `data` into `out` (uint64)."""
