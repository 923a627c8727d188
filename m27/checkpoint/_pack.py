"""Writing encoded chunks into a pack, and reading runs of them back with hashes checked.

How each chunk is encoded (raw, zstd, shuffled zstd) is decided in
:mod:`m27.checkpoint._codec`. The writer gathers payloads and hands them to the kernel
with one ``writev`` per ~8 MiB (no per-chunk system call, no copy into a bigger buffer),
times those writes and the fsync for the codec's disk-speed estimate, and starts
writeback early so the final fsync has little left. The reader fills the caller's arrays
in place.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import zstandard

from m27._exceptions import CorruptCheckpointError
from m27.checkpoint._chunks import chunk_hash
from m27.checkpoint._codec import Payload, Throughput, codec_itemsize, decompressor, unshuffle_into
from m27.checkpoint._format import CODEC_RAW, CODEC_ZSTD, pack_path

_local = threading.local()

#: Payload bytes gathered before one ``writev``; at most :data:`_MAX_IOV` pieces per call.
GATHER_BYTES = 8 * 1024 * 1024
_MAX_IOV = 1024


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
    """One save's pack: payloads gathered, written with ``writev`` in order, fsynced once.

    The file is created on the first write: a save where nothing changed writes no pack.
    Payloads are referenced, not copied, until written: the staging buffer and the
    encoded bytes outlive the pack writer.
    """

    def __init__(self, path: Path, speed: Throughput | None = None) -> None:
        self.path = path
        self.size = 0
        self._fd = -1
        self._flushed = 0
        self._written = 0
        self._pending: list[Payload] = []
        self._pending_bytes = 0
        self._speed = speed
        self._io_s = 0.0

    def add(self, payload: Payload) -> tuple[int, int]:
        """Append one encoded chunk; (offset, stored length)."""
        offset = self.size
        self._pending.append(payload)
        self._pending_bytes += len(payload)
        self.size += len(payload)
        if self._pending_bytes >= GATHER_BYTES or len(self._pending) >= _MAX_IOV:
            self._write_pending()
        return offset, len(payload)

    def _write_pending(self) -> None:
        if not self._pending:
            return
        began = time.perf_counter()
        try:
            if self._fd < 0:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            _writev_all(self._fd, self._pending)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, str(self.path)) from exc
        self._written += self._pending_bytes
        self._pending, self._pending_bytes = [], 0
        if self._written - self._flushed >= WRITEBACK_EVERY:
            start_writeback(self._fd, self._flushed, self._written - self._flushed)
            self._flushed = self._written
        self._io_s += time.perf_counter() - began

    def commit(self) -> None:
        self._write_pending()
        if self._fd < 0:
            return
        began = time.perf_counter()
        try:
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = -1
        self._io_s += time.perf_counter() - began
        if self._speed is not None:
            self._speed.written(self.size, self._io_s)

    def abort(self) -> None:
        """Forget a pack that will never be referenced (error during the save)."""
        self._pending, self._pending_bytes = [], 0
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.path.unlink(missing_ok=True)


def _writev_all(fd: int, pieces: list[Payload]) -> None:
    views = [memoryview(p).cast("B") for p in pieces if len(p)]
    while views:
        written = os.writev(fd, views)
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]


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
            got = _pread_into(fd, dest, first, path)
            if got != stored:
                raise CorruptCheckpointError(
                    f"pack {path} is truncated at offset {first + got}", file=str(path)
                )
        elif codec == CODEC_ZSTD or codec_itemsize(codec):
            shuffled = codec_itemsize(codec) or 0
            scratch = _scratch(stored)
            got = _pread_into(fd, scratch, first, path)
            if got != stored:
                raise CorruptCheckpointError(
                    f"pack {path} is truncated at offset {first + got}", file=str(path)
                )
            pos = 0
            for k, ref in enumerate(refs):
                length = int(ref[2])
                target = dest[k * size : (k + 1) * size]
                into = _unshuffle_buffer(len(target)) if shuffled else target
                try:
                    done = _decompress_into(scratch[pos : pos + length], into)
                except zstandard.ZstdError as exc:
                    raise CorruptCheckpointError(
                        f"pack {path}: chunk at offset {first + pos} does not decompress: {exc}",
                        file=str(path),
                    ) from exc
                if done != len(target) or (shuffled and len(target) % shuffled):
                    raise CorruptCheckpointError(
                        f"pack {path}: chunk at offset {first + pos} has the wrong length",
                        file=str(path),
                    )
                if shuffled:
                    unshuffle_into(into, shuffled, target)
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


def _unshuffle_buffer(nbytes: int) -> memoryview:
    """This thread's buffer for a shuffled chunk between zstd and the destination."""
    buffer: bytearray | None = getattr(_local, "unshuffle", None)
    if buffer is None or len(buffer) < nbytes:
        buffer = _local.unshuffle = bytearray(max(nbytes, 1 << 17))
    return memoryview(buffer)[:nbytes]


def _decompress_into(data: memoryview, view: memoryview) -> int:
    """Decompress straight into the destination: no intermediate bytes object."""
    done = 0
    with decompressor().stream_reader(data) as reader:
        while done < len(view):
            got = reader.readinto(view[done:])
            if not got:
                break
            done += got
        if reader.read(1):
            return done + 1  # more data than the chunk holds
    return done


def _pread_into(fd: int, view: memoryview, offset: int, path: Path) -> int:
    done = 0
    while done < len(view):
        try:
            got = os.preadv(fd, [view[done:]], offset + done)
        except OSError as exc:  # a pack replaced by a folder: EISDIR
            raise CorruptCheckpointError(
                f"cannot read pack {path}: {exc.strerror or exc}", file=str(path)
            ) from exc
        if got == 0:
            break
        done += got
    return done
