"""The background half of a save: compress, append to a pack, commit the manifest.

``Checkpointer.save`` hashes the state, copies the changed chunks into a staging buffer
and hands a :class:`SaveJob` to this writer; it returns at once. The writer runs jobs in
order on one thread. At most ``max_in_flight`` staging buffers exist and each is held until
its save is durable, so at most that many saves are in flight and a caller saving faster
than the disk blocks in :meth:`BackgroundWriter.take_staging` (backpressure).

An error in a job is kept and raised to the caller on its next call (never swallowed);
jobs queued behind a failed one are dropped, because they describe their chunks relative
to it, and the caller starts again with a full save.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from m27._exceptions import CheckpointError
from m27.checkpoint._chunks import chunk_span, n_chunks
from m27.checkpoint._codec import PROBE_GROUP, Encoded, Throughput, encode
from m27.checkpoint._format import (
    FORMAT_VERSION,
    encode_manifest,
    manifest_path,
    pack_path,
    write_atomic,
)
from m27.checkpoint._pack import PackWriter
from m27.checkpoint._parallel import Workers
from m27.checkpoint._table import ChunkTable, pack_extents
from m27.clock import Clock

log = logging.getLogger("m27.checkpoint")

Allocator = Callable[[int], npt.NDArray[np.uint8]]

#: Bytes of chunks one encoding task takes (a multiple of the probe group).
_BATCH_BYTES = 4 * 1024 * 1024


class Staging:
    """A reusable host buffer for one save's changed bytes (allocated once, regrown rarely)."""

    def __init__(self) -> None:
        self.buffer: npt.NDArray[np.uint8] = np.empty(0, dtype=np.uint8)
        self.pinned = False

    def reserve(self, nbytes: int, allocator: Allocator | None = None) -> npt.NDArray[np.uint8]:
        """A view of `nbytes`; `allocator` (pinned host memory for CuPy) when given."""
        pinned = allocator is not None
        capacity = self.buffer.shape[0]
        too_small = capacity < nbytes or (pinned and not self.pinned)
        # Give memory back after a big save so a 100%-changed save is not paid forever.
        too_big = capacity > 4 * nbytes and capacity > 1024 * 1024
        if too_small or too_big:
            self.buffer = np.empty(0, dtype=np.uint8)
            self.buffer = allocator(nbytes) if allocator else np.empty(nbytes, dtype=np.uint8)
            self.pinned = pinned
        return self.buffer[:nbytes]


@dataclass
class ArrayPlan:
    """One array of a save: its identity and which chunks changed (in staging order)."""

    name: str
    kind: str
    device: int | None
    dtype: Any
    shape: tuple[int, ...]
    nbytes: int
    chunk_size: int
    changed: npt.NDArray[np.int64]
    offset: int
    fresh: bool
    hashes: npt.NDArray[np.uint64] | None = None

    @functools.cached_property
    def key(self) -> tuple[Any, ...]:
        """What must match the last save for its fingerprints to apply (computed once: a
        save asks twice per array, and a state may hold 100,000 small ones)."""
        return (json.dumps(self.dtype), self.shape, self.nbytes, self.chunk_size, self.device)


@dataclass
class SaveJob:
    seq: int
    sim_step: int
    time: float
    started: float
    arrays: list[ArrayPlan]
    values: dict[str, Any]
    order: list[str]
    staging: Staging
    bytes_total: int
    bytes_changed: int
    meta: dict[str, str | int] = field(default_factory=dict)


@dataclass
class _Batch:
    """Consecutive changed chunks of one array, encoded by one worker thread."""

    table: ChunkTable
    indices: list[int]
    views: list[memoryview]
    hashes: list[int] | None
    itemsize: int


@dataclass(frozen=True)
class Committed:
    """A save that is durable: what the caller's event and artifact report."""

    path: Path
    seq: int
    sim_step: int
    time: float
    bytes_written: int
    bytes_total: int
    bytes_changed: int
    duration_s: float


class BackgroundWriter:
    def __init__(
        self,
        directory: Path,
        *,
        compression_level: int,
        max_in_flight: int,
        threads: int = 1,
        clock: Clock,
        on_commit: Callable[[Committed], None],
    ) -> None:
        self.directory = directory
        self._level = compression_level
        # Uncompressed saves only copy bytes to the page cache: no threads needed.
        self._workers = Workers(threads if compression_level > 0 else 1, "m27-ckpt-zstd")
        #: Compression and disk speeds as measured here: zstd only where it beats the disk.
        self.speed = Throughput(self._workers.count)
        self._clock = clock
        self._on_commit = on_commit
        self._tables: dict[str, ChunkTable] = {}
        # LIFO: the buffer used last is warm and already the right size.
        self._pool: queue.LifoQueue[Staging] = queue.LifoQueue()
        for _ in range(max(1, max_in_flight)):
            self._pool.put(Staging())
        self._jobs: queue.Queue[SaveJob | None] = queue.Queue()
        self._cond = threading.Condition()
        self._pending = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="m27-checkpoint", daemon=True)
        self._thread.start()

    # --- caller side ----------------------------------------------------------------

    def take_staging(self) -> Staging:
        """A free staging buffer; blocks while `max_in_flight` saves are in flight."""
        return self._pool.get()

    def buffer_bytes(self) -> int:
        """Host memory held by idle staging buffers (the save-time copies)."""
        return sum(s.buffer.nbytes for s in list(self._pool.queue))

    def give_back(self, staging: Staging) -> None:
        self._pool.put(staging)

    def submit(self, job: SaveJob) -> None:
        with self._cond:
            self._pending += 1
        self._jobs.put(job)

    def flush(self) -> None:
        """Wait until every submitted save is durable (or dropped after an error)."""
        with self._cond:
            while self._pending:
                self._cond.wait()

    @property
    def failed(self) -> bool:
        return self._error is not None

    def take_error(self) -> BaseException | None:
        """The kept error, cleared, after every job queued behind it was dropped."""
        self.flush()
        with self._cond:
            error, self._error = self._error, None
            self._tables = {}
        return error

    def set_base(self, tables: dict[str, ChunkTable]) -> None:
        """Start from a restored manifest's chunk tables (no save may be in flight)."""
        self.flush()
        self._tables = tables

    def close(self) -> None:
        self.flush()
        self._jobs.put(None)
        self._thread.join()
        self._workers.close()

    # --- writer thread ----------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                if self._error is None:
                    self._write(job)
            except BaseException as exc:
                with self._cond:
                    self._error = _as_checkpoint_error(exc, self.directory, job.seq)
            finally:
                self._pool.put(job.staging)
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()

    def _write(self, job: SaveJob) -> None:
        pack = PackWriter(pack_path(self.directory, job.seq), self.speed)
        try:
            tables = self._append_chunks(job, pack)
            pack.commit()
            body = self._body(job, tables, pack.size)
            data = encode_manifest(body)
            path = manifest_path(self.directory, job.seq)
            write_atomic(path, data)
        except BaseException:
            pack.abort()
            raise
        self._tables = tables
        done = Committed(
            path=path,
            seq=job.seq,
            sim_step=job.sim_step,
            time=job.time,
            bytes_written=pack.size + len(data),
            bytes_total=job.bytes_total,
            bytes_changed=job.bytes_changed,
            duration_s=self._clock.monotonic() - job.started,
        )
        try:
            self._on_commit(done)
        except Exception:
            log.warning("checkpoint %s is durable, but reporting it failed", path, exc_info=True)

    def _append_chunks(self, job: SaveJob, pack: PackWriter) -> dict[str, ChunkTable]:
        """Encode the changed chunks on the worker threads, append them in order."""
        staging = memoryview(job.staging.buffer)  # type: ignore[arg-type]
        tables: dict[str, ChunkTable] = {}
        batches: list[_Batch] = []
        for plan in job.arrays:
            count = n_chunks(plan.nbytes, plan.chunk_size)
            base = self._tables.get(plan.name)
            if plan.fresh:
                table = ChunkTable.empty(plan.key, count)
            elif base is None or base.key != plan.key:
                raise CheckpointError(
                    f"internal: no chunk table for unchanged chunks of {plan.name!r}",
                    array=plan.name,
                )
            else:
                table = base.copy()
            tables[plan.name] = table
            indices = plan.changed.tolist()
            pos = plan.offset
            views = []
            for index in indices:
                start, end = chunk_span(index, plan.nbytes, plan.chunk_size)
                views.append(staging[pos : pos + end - start])
                pos += end - start
            itemsize = _itemsize(plan.dtype)
            per_batch = PROBE_GROUP * max(1, _BATCH_BYTES // (PROBE_GROUP * plan.chunk_size))
            for first in range(0, len(indices), per_batch):
                last = first + per_batch
                hashes = plan.hashes[first:last].tolist() if plan.hashes is not None else None
                batches.append(
                    _Batch(table, indices[first:last], views[first:last], hashes, itemsize)
                )
        level, speed = self._level, self.speed

        def encode_batch(batch: _Batch) -> list[Encoded]:
            return encode(
                batch.views,
                level,
                with_hash=batch.hashes is None,
                itemsize=batch.itemsize,
                speed=speed,
            )

        encoded = self._workers.map_ordered(encode_batch, batches)
        try:
            for batch, chunks in zip(batches, encoded, strict=True):
                for k, (payload, codec, digest) in enumerate(chunks):
                    offset, length = pack.add(payload)
                    if batch.hashes is not None:
                        digest = batch.hashes[k]
                    assert digest is not None
                    raw = len(batch.views[k])
                    batch.table.set(batch.indices[k], job.seq, offset, length, raw, digest, codec)
        finally:
            encoded.close()  # cancels the look-ahead if a write failed
        return tables

    def _body(self, job: SaveJob, tables: dict[str, ChunkTable], pack_bytes: int) -> dict[str, Any]:
        arrays = {
            plan.name: {
                "kind": plan.kind,
                "device": plan.device,
                "dtype": plan.dtype,
                "shape": list(plan.shape),
                "nbytes": plan.nbytes,
                "chunk_size": plan.chunk_size,
                "chunks": tables[plan.name].refs(),
            }
            for plan in job.arrays
        }
        changed = sum(int(p.changed.size) for p in job.arrays)
        total = sum(n_chunks(p.nbytes, p.chunk_size) for p in job.arrays)
        return {
            "format": FORMAT_VERSION,
            "seq": job.seq,
            "time": job.time,
            "sim_step": job.sim_step,
            **job.meta,
            "order": job.order,
            "arrays": arrays,
            "values": job.values,
            "packs": {str(k): v for k, v in pack_extents(list(tables.values())).items()},
            "stats": {
                "bytes_written": pack_bytes,
                "bytes_total": job.bytes_total,
                "bytes_changed": job.bytes_changed,
                "chunks_changed": changed,
                "chunks_total": total,
            },
        }


def _itemsize(descr: Any) -> int:
    """Item size of a plain numeric dtype (shuffled before zstd), else 1 (not shuffled)."""
    if not isinstance(descr, str):
        return 1  # structured: fields of mixed sizes
    dtype = np.dtype(descr)
    return dtype.itemsize if dtype.kind in "biufc" else 1


def _as_checkpoint_error(exc: BaseException, directory: Path, seq: int) -> BaseException:
    if isinstance(exc, CheckpointError):
        return exc
    if isinstance(exc, OSError):
        why = exc.strerror or str(exc)
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            why = f"disk full or file size limit reached ({why})"
        target = exc.filename or str(directory)
        error = CheckpointError(
            f"checkpoint {seq} in {directory} was not written: {why} [{target}]; "
            "the previous checkpoint is intact",
            file=str(target),
            errno=exc.errno,
        )
        error.__cause__ = exc
        return error
    if isinstance(exc, Exception):
        error = CheckpointError(f"checkpoint {seq} in {directory} was not written: {exc!r}")
        error.__cause__ = exc
        return error
    return exc
