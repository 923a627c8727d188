"""Where every chunk of an array lives: the in-memory form of a manifest's chunk list.

The background writer keeps one table per array for the last save it wrote; the next save
copies it and replaces only the changed chunks, so an unchanged chunk keeps pointing into
the older pack that holds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from m27.checkpoint._codec import CODECS as _CODECS


@dataclass
class ChunkTable:
    key: tuple[Any, ...]
    pack: npt.NDArray[np.int64]
    offset: npt.NDArray[np.int64]
    length: npt.NDArray[np.int64]
    raw: npt.NDArray[np.int64]
    hash: npt.NDArray[np.uint64]
    codec: npt.NDArray[np.uint8]

    @classmethod
    def empty(cls, key: tuple[Any, ...], count: int) -> ChunkTable:
        def col() -> npt.NDArray[np.int64]:
            return np.full(count, -1, dtype=np.int64)

        return cls(
            key,
            col(),
            col(),
            col(),
            col(),
            np.zeros(count, np.uint64),
            np.zeros(count, np.uint8),
        )

    @classmethod
    def from_manifest(cls, key: tuple[Any, ...], chunks: list[list[Any]]) -> ChunkTable:
        table = cls.empty(key, len(chunks))
        for i, (pack, offset, length, raw, digest, codec) in enumerate(chunks):
            table.set(i, pack, offset, length, raw, int(digest, 16), codec)
        return table

    def _columns(self) -> tuple[npt.NDArray[Any], ...]:
        """The per-chunk arrays, in field order (that of a manifest's chunk rows)."""
        return (self.pack, self.offset, self.length, self.raw, self.hash, self.codec)

    def copy(self) -> ChunkTable:
        return ChunkTable(self.key, *(column.copy() for column in self._columns()))

    def set(
        self, i: int, pack: int, offset: int, length: int, raw: int, digest: int, codec: str
    ) -> None:
        self.pack[i] = pack
        self.offset[i] = offset
        self.length[i] = length
        self.raw[i] = raw
        self.hash[i] = digest
        self.codec[i] = _CODECS.index(codec)

    def refs(self) -> list[list[Any]]:
        """The manifest's ``[pack, offset, length, raw length, hash hex, codec]`` rows."""
        return [
            [p, o, n, r, f"{h:016x}", _CODECS[c]]
            for p, o, n, r, h, c in zip(
                *(column.tolist() for column in self._columns()), strict=True
            )
        ]


def pack_extents(tables: list[ChunkTable]) -> dict[int, int]:
    """pack number -> bytes of it the tables need (for the cheap validity check)."""
    if not tables:
        return {}
    packs = np.concatenate([t.pack for t in tables])
    ends = np.concatenate([t.offset + t.length for t in tables])
    if packs.size == 0:
        return {}
    unique, inverse = np.unique(packs, return_inverse=True)
    need = np.zeros(unique.size, dtype=np.int64)
    np.maximum.at(need, inverse, ends)
    return {int(p): int(n) for p, n in zip(unique.tolist(), need.tolist(), strict=True)}
