"""Writing changed chunks into a pack, and reading them back with their hash checked.

zstd costs ~0.5 GB/s and buys ~8% on float data (shared/notes/limits.md), so a chunk is
stored raw unless compression saves at least :data:`MIN_GAIN`. To avoid paying the
compressor on incompressible arrays, each array is probed: after
:data:`_GIVE_UP_AFTER` chunks in a row that did not compress, only every
:data:`_PROBE_EVERY`-th chunk is tried, until one compresses again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import zstandard

from m27._exceptions import CheckpointError, CorruptCheckpointError
from m27.checkpoint._chunks import chunk_hash
from m27.checkpoint._format import CODEC_RAW, CODEC_ZSTD, pack_path, write_all

#: Smallest saving (fraction of the raw size) that makes storing a chunk compressed worth it.
MIN_GAIN = 0.05
_GIVE_UP_AFTER = 8
_PROBE_EVERY = 32


class PackWriter:
    """One save's pack: chunks appended in order, then fsynced once.

    The file is created on the first chunk: a save where nothing changed writes no pack.
    """

    def __init__(self, path: Path, compression_level: int) -> None:
        self.path = path
        self.size = 0
        self._fd = -1
        self._zstd = (
            zstandard.ZstdCompressor(level=compression_level) if compression_level > 0 else None
        )
        self._misses = 0
        self._since_probe = 0

    def new_array(self) -> None:
        """Arrays differ in compressibility: start probing afresh."""
        self._misses = 0
        self._since_probe = 0

    def add(self, chunk: memoryview) -> tuple[int, int, str]:
        """Append one chunk; (offset, stored length, codec)."""
        payload: memoryview | bytes = chunk
        codec = CODEC_RAW
        if self._zstd is not None and self._should_try():
            packed = self._zstd.compress(chunk)
            if len(packed) <= len(chunk) * (1 - MIN_GAIN):
                payload, codec = packed, CODEC_ZSTD
                self._misses = 0
            else:
                self._misses += 1
        offset = self.size
        try:
            if self._fd < 0:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            write_all(self._fd, payload)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, str(self.path)) from exc
        self.size += len(payload)
        return offset, len(payload), codec

    def _should_try(self) -> bool:
        if self._misses < _GIVE_UP_AFTER:
            return True
        self._since_probe += 1
        if self._since_probe >= _PROBE_EVERY:
            self._since_probe = 0
            return True
        return False

    def commit(self) -> None:
        if self._fd < 0:
            return
        try:
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = -1

    def abort(self) -> None:
        """Forget a pack that will never be referenced (error during the save)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.path.unlink(missing_ok=True)


class PackReader:
    """Reads chunks from the packs of one directory, keeping each pack open once."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fds: dict[int, int] = {}
        self._zstd = zstandard.ZstdDecompressor()

    def _fd(self, pack: int) -> tuple[int, Path]:
        path = pack_path(self.directory, pack)
        if pack not in self._fds:
            try:
                self._fds[pack] = os.open(path, os.O_RDONLY)
            except OSError as exc:
                raise CorruptCheckpointError(f"pack {path} is missing", file=str(path)) from exc
        return self._fds[pack], path

    def read_into(self, ref: list[Any], dest: npt.NDArray[np.uint8]) -> None:
        """Fill `dest` (exactly the chunk's raw length) from chunk `ref`, checking its hash.

        `ref` is the manifest's ``[pack, offset, length, raw length, hash hex, codec]``.
        """
        pack, offset, length, raw_len, digest, codec = ref
        fd, path = self._fd(int(pack))
        if raw_len != dest.shape[0]:
            raise CorruptCheckpointError(
                f"pack {path}: chunk at {offset} has length {raw_len}, expected {dest.shape[0]}",
                file=str(path),
            )
        view = memoryview(dest)  # type: ignore[arg-type]
        if codec == CODEC_RAW:
            got = _pread_into(fd, view, offset)
            if got != length or length != raw_len:
                raise CorruptCheckpointError(
                    f"pack {path} is truncated at offset {offset + got}", file=str(path)
                )
        elif codec == CODEC_ZSTD:
            data = os.pread(fd, length, offset)
            if len(data) != length:
                raise CorruptCheckpointError(
                    f"pack {path} is truncated at offset {offset + len(data)}", file=str(path)
                )
            try:
                got = self._decompress_into(data, view)
            except zstandard.ZstdError as exc:
                raise CorruptCheckpointError(
                    f"pack {path}: chunk at offset {offset} does not decompress: {exc}",
                    file=str(path),
                ) from exc
            if got != raw_len:
                raise CorruptCheckpointError(
                    f"pack {path}: chunk at offset {offset} has the wrong length", file=str(path)
                )
        else:
            raise CorruptCheckpointError(f"pack {path}: unknown codec {codec!r}", file=str(path))
        if f"{chunk_hash(view):016x}" != digest:
            raise CorruptCheckpointError(
                f"pack {path}: chunk at offset {offset} fails its hash check", file=str(path)
            )

    def _decompress_into(self, data: bytes, view: memoryview) -> int:
        """Decompress straight into the destination (1.7x faster than a new bytes + copy)."""
        done = 0
        with self._zstd.stream_reader(data) as reader:
            while done < len(view):
                got = reader.readinto(view[done:])
                if not got:
                    break
                done += got
            if reader.read(1):
                return done + 1  # more data than the chunk holds
        return done

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> PackReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pread_into(fd: int, view: memoryview, offset: int) -> int:
    done = 0
    while done < len(view):
        try:
            got = os.preadv(fd, [view[done:]], offset + done)
        except OSError as exc:
            raise CheckpointError(f"cannot read a pack: {exc}") from exc
        if got == 0:
            break
        done += got
    return done
