"""Writing changed chunks into a pack, and reading runs of them back with hashes checked.

zstd costs ~0.5 GB/s per core and buys ~8-12% on float data (shared/notes/limits.md), so
a chunk is stored compressed only when that saves at least :data:`MIN_GAIN` of its size.
Chunks are encoded in groups of :data:`PROBE_GROUP` (4 MiB at the default 128 KiB
chunks): the group's first chunk is the probe, and when it does not reach the gain the
whole group is stored raw without trying the others. Incompressible data thus costs one
compression in 32; compressible data is compressed chunk by chunk, each chunk still
stored raw when it alone misses the gain. Groups are independent, so several threads
encode them at once (:class:`m27.checkpoint._parallel.Workers`).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import zstandard

from m27._exceptions import CheckpointError, CorruptCheckpointError
from m27.checkpoint._chunks import chunk_hash
from m27.checkpoint._format import CODEC_RAW, CODEC_ZSTD, pack_path, write_all

#: Smallest saving (fraction of the raw size) that makes storing a chunk compressed worth it.
MIN_GAIN = 0.05
#: Chunks that share one compressibility probe.
PROBE_GROUP = 32

Payload = memoryview | bytes
#: One chunk as the writer stores it: (payload, codec, xxh3 of the raw bytes or None).
Encoded = tuple[Payload, str, int | None]

_local = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    """This thread's compressor (zstandard's objects must not be shared between threads)."""
    cache: dict[int, zstandard.ZstdCompressor] = getattr(_local, "compressors", {})
    _local.compressors = cache
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level)
    return cache[level]


def _decompressor() -> zstandard.ZstdDecompressor:
    found: zstandard.ZstdDecompressor | None = getattr(_local, "decompressor", None)
    if found is None:
        found = _local.decompressor = zstandard.ZstdDecompressor()
    return found


def encode(chunks: Sequence[memoryview], level: int, with_hash: bool = False) -> list[Encoded]:
    """Payload and codec of each chunk (see the module docstring for the raw/zstd rule).

    Thread-safe. `with_hash` also hashes each chunk (CuPy states, whose fingerprints are
    not xxh3, need the stored hash computed on the host).
    """
    out: list[Encoded] = []
    zstd = _compressor(level) if level > 0 else None
    for start in range(0, len(chunks), PROBE_GROUP):
        compress = zstd is not None
        for chunk in chunks[start : start + PROBE_GROUP]:
            payload: Payload = chunk
            codec = CODEC_RAW
            if compress:
                assert zstd is not None
                packed = zstd.compress(chunk)
                if len(packed) <= len(chunk) * (1 - MIN_GAIN):
                    payload, codec = packed, CODEC_ZSTD
                elif len(out) == start:  # the group's probe missed: store the group raw
                    compress = False
            out.append((payload, codec, chunk_hash(chunk) if with_hash else None))
    return out


#: Bytes appended between two writeback kicks (see :func:`start_writeback`).
WRITEBACK_EVERY = 16 * 1024 * 1024


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return cast(Callable[[int, int, int, int], int], function)


_SYNC_FILE_RANGE = _sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Ask the kernel to start writing a range now, without waiting for it.

    Otherwise dirty pages sit in the page cache until the final fsync (below the
    dirty-ratio thresholds nothing is written early), and the fsync then writes the
    whole pack after the last chunk was encoded. Measured here on 1 GiB: write + fsync
    1.2-2.3 s without, 0.4-0.5 s with. A hint only: fsync at commit still reports errors.
    """
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


class PackWriter:
    """One save's pack: payloads appended in order, then fsynced once.

    The file is created on the first chunk: a save where nothing changed writes no pack.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size = 0
        self._fd = -1
        self._flushed = 0

    def add(self, payload: Payload) -> tuple[int, int]:
        """Append one encoded chunk; (offset, stored length)."""
        offset = self.size
        try:
            if self._fd < 0:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            write_all(self._fd, payload)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, str(self.path)) from exc
        self.size += len(payload)
        if self.size - self._flushed >= WRITEBACK_EVERY:
            start_writeback(self._fd, self._flushed, self.size - self._flushed)
            self._flushed = self.size
        return offset, len(payload)

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
    """Reads chunks from the packs of one directory, each pack opened once.

    Thread-safe: reads are positional (``preadv``), decompressors and scratch buffers
    are per thread, so several threads may call :meth:`read_run` at once.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()

    def _fd(self, pack: int) -> tuple[int, Path]:
        path = pack_path(self.directory, pack)
        with self._lock:
            if pack not in self._fds:
                try:
                    self._fds[pack] = os.open(path, os.O_RDONLY)
                except OSError as exc:
                    raise CorruptCheckpointError(f"pack {path} is missing", file=str(path)) from exc
            return self._fds[pack], path

    def read_run(self, refs: Sequence[list[Any]], dest: npt.NDArray[np.uint8], size: int) -> None:
        """Fill `dest` with consecutive chunks `refs` (all `size` bytes but maybe the last).

        A ref is the manifest's ``[pack, offset, length, raw length, hash hex, codec]``.
        Chunks stored back to back in one pack with one codec are read with one
        ``preadv``: raw ones straight into `dest`, compressed ones into a per-thread
        scratch buffer and decompressed into `dest`. Each chunk's hash is then checked on
        `dest` itself, while it is still in the cache.
        """
        view = memoryview(dest)  # type: ignore[arg-type]
        i = 0
        while i < len(refs):
            j = i + 1
            pack, offset, _, _, _, codec = refs[i]
            end = int(offset) + int(refs[i][2])
            while (
                j < len(refs)
                and refs[j][0] == pack
                and refs[j][5] == codec
                and int(refs[j][1]) == end
            ):
                end += int(refs[j][2])
                j += 1
            self._read_segment(refs[i:j], view[i * size : min(j * size, len(view))], size)
            i = j

    def _read_segment(self, refs: Sequence[list[Any]], dest: memoryview, size: int) -> None:
        pack, first, _, _, _, codec = refs[0]
        fd, path = self._fd(int(pack))
        first = int(first)
        stored = sum(int(r[2]) for r in refs)
        for k, ref in enumerate(refs):
            want = min(size, len(dest) - k * size)
            if int(ref[3]) != want or (codec == CODEC_RAW and int(ref[2]) != want):
                raise CorruptCheckpointError(
                    f"pack {path}: chunk at {ref[1]} has length {ref[3]}, expected {want}",
                    file=str(path),
                )
        if codec == CODEC_RAW:
            got = _pread_into(fd, dest, first)
            if got != stored:
                raise CorruptCheckpointError(
                    f"pack {path} is truncated at offset {first + got}", file=str(path)
                )
        elif codec == CODEC_ZSTD:
            scratch = _scratch(stored)
            got = _pread_into(fd, scratch, first)
            if got != stored:
                raise CorruptCheckpointError(
                    f"pack {path} is truncated at offset {first + got}", file=str(path)
                )
            pos = 0
            for k, ref in enumerate(refs):
                length = int(ref[2])
                target = dest[k * size : (k + 1) * size]
                try:
                    done = _decompress_into(scratch[pos : pos + length], target)
                except zstandard.ZstdError as exc:
                    raise CorruptCheckpointError(
                        f"pack {path}: chunk at offset {first + pos} does not decompress: {exc}",
                        file=str(path),
                    ) from exc
                if done != len(target):
                    raise CorruptCheckpointError(
                        f"pack {path}: chunk at offset {first + pos} has the wrong length",
                        file=str(path),
                    )
                _check(path, first + pos, target, ref[4])
                pos += length
            return
        else:
            raise CorruptCheckpointError(f"pack {path}: unknown codec {codec!r}", file=str(path))
        pos = first
        for k, ref in enumerate(refs):
            _check(path, pos, dest[k * size : (k + 1) * size], ref[4])
            pos += int(ref[2])

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def __enter__(self) -> PackReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check(path: Path, offset: int, chunk: memoryview, digest: Any) -> None:
    if f"{chunk_hash(chunk):016x}" != digest:
        raise CorruptCheckpointError(
            f"pack {path}: chunk at offset {offset} fails its hash check", file=str(path)
        )


def _scratch(nbytes: int) -> memoryview:
    """This thread's read buffer, grown as needed and reused (new buffers cost page faults)."""
    buffer: bytearray | None = getattr(_local, "scratch", None)
    if buffer is None or len(buffer) < nbytes:
        buffer = _local.scratch = bytearray(max(nbytes, 1 << 20))
    return memoryview(buffer)[:nbytes]


def _decompress_into(data: memoryview, view: memoryview) -> int:
    """Decompress straight into the destination: no intermediate bytes object."""
    done = 0
    with _decompressor().stream_reader(data) as reader:
        while done < len(view):
            got = reader.readinto(view[done:])
            if not got:
                break
            done += got
        if reader.read(1):
            return done + 1  # more data than the chunk holds
    return done


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
