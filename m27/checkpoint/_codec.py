"""How a chunk is stored: raw, zstd, or zstd after a byte shuffle; chosen by measured speed.

zstd costs ~0.5 GB/s per core and buys ~8-12% on float data (shared/notes/limits.md); a
disk takes 0.7-7 GB/s. Compressing is only worth it when it does not slow the save down,
so the writer keeps two running estimates (:class:`Throughput`): how fast this machine's
threads compress (timed on every probe chunk, and on one group in :data:`RETIME_EVERY`
while compression is vetoed) and how fast the pack's disk takes bytes (timed on the
writes and the fsync). A group is compressed when the probe saves at least
:data:`MIN_GAIN` *and* the threads together compress faster than the disk writes, by
:data:`SPEED_MARGIN` (2x); otherwise it is stored raw at disk speed. On a 2-core VM with
a fast disk that means raw; on a 32-core server writing to a network filesystem, zstd.

Chunks are encoded in groups of :data:`PROBE_GROUP` (4 MiB at the default 128 KiB
chunks): the group's first chunk is the probe, and when it misses, the whole group is
stored raw without trying the others. In a compressed group each chunk is still judged
alone. Arrays of 2-, 4- or 8-byte items are byte-shuffled before zstd (all first bytes,
then all second bytes, ...: ``codec = "zstd-s<itemsize>"``), which gains ~10% more on
floats, whose exponent bytes repeat; numpy does the shuffle as one transposed copy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import zstandard

from m27.checkpoint._chunks import chunk_hash
from m27.checkpoint._format import CODEC_RAW, CODEC_ZSTD

#: Smallest saving (fraction of the raw size) that makes storing a chunk compressed worth it.
MIN_GAIN = 0.05
#: Chunks that share one compressibility probe.
PROBE_GROUP = 32
#: Compression must beat the disk by this factor to be chosen. It buys ~10-20 % on float
#: data at best, while a disk faster than its estimate makes a compressing save slower by
#: as much as it was underestimated, and disks drift: on the 2-core dev VM consecutive
#: 1 GiB packs were written at 0.37 and 1.35 GB/s. Compressible data compresses faster,
#: so it clears the margin more easily.
SPEED_MARGIN = 2.0
#: Item sizes that are byte-shuffled before zstd.
SHUFFLE_SIZES = (2, 4, 8)
#: Disk speed assumed before the first pack was timed (bytes/s): a mid-range local SSD.
DEFAULT_DISK_BPS = 1.0e9
#: While compression is vetoed for speed, one group in this many still compresses (and
#: times) its probe chunk, so the estimate follows the machine instead of freezing.
RETIME_EVERY = 16

Payload = memoryview | bytes
#: One chunk as the writer stores it: (payload, codec, xxh3 of the raw bytes or None).
Encoded = tuple[Payload, str, int | None]

_local = threading.local()


def shuffle_codec(itemsize: int) -> str:
    return f"{CODEC_ZSTD}-s{itemsize}"


def codec_itemsize(codec: str) -> int | None:
    """The shuffle item size of a ``zstd-s<n>`` codec; None for any other codec."""
    prefix = f"{CODEC_ZSTD}-s"
    if codec.startswith(prefix) and codec[len(prefix) :].isdigit():
        size = int(codec[len(prefix) :])
        return size if size in SHUFFLE_SIZES else None
    return None


#: Every codec a chunk table may hold (the order is the table's uint8 encoding).
CODECS = (CODEC_RAW, CODEC_ZSTD, *(shuffle_codec(n) for n in SHUFFLE_SIZES))


def shuffle_into(chunk: memoryview, itemsize: int, out: npt.NDArray[np.uint8]) -> None:
    """Byte ``k`` of every item, for k = 0..itemsize-1, back to back into `out`."""
    src = np.frombuffer(chunk, dtype=np.uint8)
    np.copyto(out.reshape(itemsize, -1), src.reshape(-1, itemsize).T)


def unshuffle_into(data: memoryview, itemsize: int, out: memoryview) -> None:
    """Inverse of :func:`shuffle_into`: `data` (shuffled) back into item order in `out`."""
    src = np.frombuffer(data, dtype=np.uint8)
    dest = np.frombuffer(out, dtype=np.uint8)
    np.copyto(dest.reshape(-1, itemsize), src.reshape(itemsize, -1).T)


class Throughput:
    """Running estimates of compression speed (per thread) and disk write speed.

    Thread-safe enough for its use: floats written whole by one thread at a time under
    the GIL; a stale read only delays the switch by one group.
    """

    def __init__(self, threads: int, disk_bps: float | None = None) -> None:
        self.threads = max(1, threads)
        self.disk_bps = disk_bps or DEFAULT_DISK_BPS
        self.compress_bps: float | None = None
        self._disk_timed = disk_bps is not None
        self._vetoed = 0

    def compressed(self, nbytes: int, seconds: float) -> None:
        """A probe compressed `nbytes` in `seconds` on one thread."""
        if nbytes < 4096 or seconds <= 0:
            return
        rate = nbytes / seconds
        self.compress_bps = (
            rate if self.compress_bps is None else 0.7 * self.compress_bps + (0.3 * rate)
        )

    def written(self, nbytes: int, seconds: float) -> None:
        """A pack of `nbytes` took `seconds` of write calls and fsync."""
        if nbytes < 1024 * 1024 or seconds <= 0:
            return  # small packs time the syscall, not the disk
        rate = nbytes / seconds
        if not self._disk_timed:
            self.disk_bps, self._disk_timed = rate, True
        else:
            self.disk_bps = 0.5 * self.disk_bps + 0.5 * rate

    def compression_pays(self) -> bool:
        """Do the threads together compress faster than the disk writes (by the margin)?"""
        if self.compress_bps is None:
            return True  # unknown yet: let the probe decide and time itself
        return self.threads * self.compress_bps > SPEED_MARGIN * self.disk_bps

    def retime_due(self) -> bool:
        """Called once per group stored raw for speed: is this one's probe timed anyway?"""
        self._vetoed += 1
        return self._vetoed % RETIME_EVERY == 0


def _compressor(level: int) -> zstandard.ZstdCompressor:
    """This thread's compressor (zstandard's objects must not be shared between threads)."""
    cache: dict[int, zstandard.ZstdCompressor] = getattr(_local, "compressors", {})
    _local.compressors = cache
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level)
    return cache[level]


def decompressor() -> zstandard.ZstdDecompressor:
    found: zstandard.ZstdDecompressor | None = getattr(_local, "decompressor", None)
    if found is None:
        found = _local.decompressor = zstandard.ZstdDecompressor()
    return found


def _shuffle_buffer(nbytes: int) -> npt.NDArray[np.uint8]:
    buffer: npt.NDArray[np.uint8] | None = getattr(_local, "shuffle", None)
    if buffer is None or buffer.shape[0] < nbytes:
        buffer = _local.shuffle = np.empty(max(nbytes, 1 << 17), dtype=np.uint8)
    return buffer[:nbytes]


def encode(
    chunks: Sequence[memoryview],
    level: int,
    with_hash: bool = False,
    *,
    itemsize: int = 1,
    speed: Throughput | None = None,
) -> list[Encoded]:
    """Payload and codec of each chunk (see the module docstring for the rule).

    Thread-safe. `with_hash` also hashes each chunk (CuPy states, whose fingerprints are
    not xxh3, need the stored hash computed on the host). `itemsize` is the array's item
    size (shuffled before zstd when 2, 4 or 8); `speed`, when given, is timed on every
    probe and may veto compression for being slower than the disk.
    """
    out: list[Encoded] = []
    zstd = _compressor(level) if level > 0 else None
    shuffle = itemsize if itemsize in SHUFFLE_SIZES else 0
    for start in range(0, len(chunks), PROBE_GROUP):
        pays = zstd is not None and (speed is None or speed.compression_pays())
        retime = not pays and zstd is not None and speed is not None and speed.retime_due()
        compress = pays or retime
        for chunk in chunks[start : start + PROBE_GROUP]:
            payload: Payload = chunk
            codec = CODEC_RAW
            if compress and zstd is not None:
                probe = len(out) == start
                if probe and speed is not None:
                    _warm_up(zstd, chunk, shuffle)
                began = time.perf_counter() if probe else 0.0
                packed, packed_codec = _compress(zstd, chunk, shuffle)
                if probe and speed is not None:
                    speed.compressed(len(chunk), time.perf_counter() - began)
                if len(packed) <= len(chunk) * (1 - MIN_GAIN):
                    payload, codec = packed, packed_codec
                elif probe:  # the group's probe missed: store the group raw
                    compress = False
                if retime:  # only the probe: the rest of the group stays raw
                    compress = False
            out.append((payload, codec, chunk_hash(chunk) if with_hash else None))
    return out


def _warm_up(zstd: zstandard.ZstdCompressor, chunk: memoryview, shuffle: int) -> None:
    """Compress `chunk` once untimed if this thread's compressor never saw its size: the
    first call also sets up zstd's context (a first 128 KiB probe timed ~0.2 GB/s, the
    next ones ~0.5), and an estimate taken from it would veto compression for good."""
    seen: set[tuple[int, int]] | None = getattr(_local, "warm", None)
    if seen is None:
        seen = _local.warm = set()
    key = (id(zstd), len(chunk))
    if key not in seen:
        _compress(zstd, chunk, shuffle)
        seen.add(key)


def _compress(zstd: zstandard.ZstdCompressor, chunk: memoryview, shuffle: int) -> tuple[bytes, str]:
    if shuffle and len(chunk) % shuffle == 0:
        buffer = _shuffle_buffer(len(chunk))
        shuffle_into(chunk, shuffle, buffer)
        return zstd.compress(memoryview(buffer)), shuffle_codec(shuffle)  # type: ignore[arg-type]
    return zstd.compress(chunk), CODEC_ZSTD
