"""``m27.Checkpointer``: differential, asynchronous checkpoints of a step's state."""

from __future__ import annotations

import json
import logging
import os
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from m27._exceptions import CheckpointError
from m27.checkpoint import _chunks, gpu
from m27.checkpoint._format import manifests, next_seq, parse_name
from m27.checkpoint._parallel import Workers, default_threads
from m27.checkpoint._reader import load
from m27.checkpoint._report import Reporter
from m27.checkpoint._retention import BackgroundPrune
from m27.checkpoint._settings import default_directory, env_interval, load_settings
from m27.checkpoint._table import ChunkTable
from m27.checkpoint._writer import ArrayPlan, BackgroundWriter, Committed, SaveJob
from m27.clock import Clock, SystemClock
from m27.store import EventStore

log = logging.getLogger("m27.checkpoint")

#: `maybe_save` interval when neither the caller nor the runner gives one (the design's 5m).
DEFAULT_INTERVAL_S = 300.0


@dataclass
class _Seen:
    """What the last save knew about one array: its identity and chunk fingerprints."""

    key: tuple[Any, ...]
    fingerprints: Any
    groups: Any = None  # host arrays while changes are sparse: see `_chunks.ChunkDiff`


@dataclass
class _Pending:
    """An array between hashing and copying out (phase 1 -> 2 of a save)."""

    plan: ArrayPlan
    data: Any
    fingerprints: Any
    on_device: bool
    groups: Any = None


class Checkpointer:
    """Saves a state (a dict of NumPy/CuPy arrays and small JSON values) differentially.

    ``save`` returns once the changed chunks are copied out; a background thread writes
    them. ``restore`` returns ``(state, step)`` from ``$M27_RESUME_FROM`` or the newest
    checkpoint that passes its hash checks, skipping bad ones with a warning.
    """

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        interval: float | None = None,
        chunk_size: int | None = None,
        compression_level: int | None = None,
        keep_last: int | None = None,
        max_in_flight: int | None = None,
        threads: int | None = None,
        store: EventStore | None = None,
        clock: Clock | None = None,
    ) -> None:
        settings = load_settings()
        self.directory = Path(directory) if directory is not None else default_directory()
        self.interval = interval if interval is not None else env_interval()
        if self.interval is None:
            self.interval = DEFAULT_INTERVAL_S
        self.chunk_size = chunk_size or settings.chunk_size
        self.keep_last = keep_last if keep_last is not None else settings.keep_last
        level = compression_level if compression_level is not None else settings.compression_level
        in_flight = max_in_flight if max_in_flight is not None else settings.max_in_flight
        self.threads = threads if threads is not None else settings.threads
        if self.threads <= 0:
            self.threads = default_threads()
        if self.chunk_size < 64 or self.chunk_size % 16:
            raise CheckpointError(
                f"chunk size {self.chunk_size} must be a multiple of 16, >= 64",
                chunk_size=self.chunk_size,
            )
        if in_flight < 1:
            raise CheckpointError(
                f"max_in_flight must be at least 1, not {in_flight}", max_in_flight=in_flight
            )
        if self.keep_last < 0:  # 0 keeps every checkpoint (retention off)
            raise CheckpointError(
                f"keep_last must be 0 (keep every checkpoint) or more, not {self.keep_last}",
                keep_last=self.keep_last,
            )
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(
                f"cannot create checkpoint directory {self.directory}: {exc}",
                file=str(self.directory),
            ) from exc
        self._clock = clock or SystemClock()
        self._reporter = Reporter(store, self._clock)
        self._seen: dict[str, _Seen] = {}
        self._seq = next_seq(self.directory)
        self._last_save = self._clock.monotonic()
        self._closed = False
        # Hashing at save and reading at restore happen in the caller's thread; the
        # writer has its own threads, so a save never waits behind background compression.
        self._workers = Workers(self.threads, "m27-ckpt-hash")
        self._writer = BackgroundWriter(
            self.directory,
            compression_level=level,
            max_in_flight=in_flight,
            threads=self.threads,
            clock=self._clock,
            on_commit=self._committed,
        )
        self._retention = BackgroundPrune(self.directory, self.keep_last)
        # A script that forgets close() still gets its last saves made durable at exit.
        self._finalizer = weakref.finalize(
            self, _shut_down, self._writer, self._workers, self._retention
        )

    # --- saving -------------------------------------------------------------------------

    def save(self, state: Mapping[str, Any], step: int) -> None:
        """Checkpoint `state` as of simulation step `step`; returns once changes are copied."""
        self._ready()
        started = self._clock.monotonic()
        if not isinstance(state, Mapping):
            raise CheckpointError(
                f"a state must be a dict of names to values, not {type(state)}",
                directory=str(self.directory),
            )
        staging = self._writer.take_staging()
        if self._writer.failed:  # a save failed while this one waited for a buffer
            self._writer.give_back(staging)
            self._raise_pending()
        try:
            with self._retention.held():
                job, seen = self._plan(state, int(step), started, staging)
        except BaseException:
            self._writer.give_back(staging)
            raise
        self._writer.submit(job)
        self._seen = seen
        self._seq += 1
        self._last_save = started

    def due(self) -> bool:
        """Whether the step's checkpoint interval has passed since the last save: what
        `maybe_save` asks. A program whose own files (an energy log, a trajectory) must be
        durable up to the step a checkpoint records syncs them when this says so, then
        calls `save`."""
        self._ready()
        assert self.interval is not None
        return self._clock.monotonic() - self._last_save >= self.interval

    def maybe_save(self, state: Mapping[str, Any], step: int) -> bool:
        """Save if the step's checkpoint interval has passed since the last save."""
        if not self.due():
            return False
        self.save(state, step)
        return True

    @property
    def memory_bytes(self) -> int:
        """Memory this checkpointer holds between saves: staging buffers and fingerprints.

        The staging buffers are as large as the changed bytes of recent saves (a save with
        everything changed needs a full copy to return before the write); they shrink
        when later saves change less.
        """
        fingerprints = sum(
            int(s.fingerprints.nbytes) + (0 if s.groups is None else int(s.groups.nbytes))
            for s in self._seen.values()
        )
        return self._writer.buffer_bytes() + fingerprints

    def flush(self) -> None:
        """Wait until every save so far is durable; raise the error of one that failed."""
        self._writer.flush()
        self._raise_pending()

    def _plan(
        self, state: Mapping[str, Any], step: int, started: float, staging: Any
    ) -> tuple[SaveJob, dict[str, _Seen]]:
        pending: list[_Pending] = []
        values: dict[str, Any] = {}
        for name, value in state.items():
            if not isinstance(name, str):
                raise CheckpointError(f"state keys must be strings, not {name!r}", key=repr(name))
            if isinstance(value, np.ndarray | np.generic):
                pending.append(self._hash_host(name, value))
            elif gpu.is_cupy_array(value):
                pending.append(self._hash_device(name, value))
            else:
                values[name] = value
        try:
            json.dumps(values, allow_nan=True)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(
                f"state values must be arrays or JSON-able: {exc} (keys {sorted(values)})",
                keys=sorted(values),
            ) from exc
        sizes = [
            _chunks.changed_bytes(p.plan.changed, p.plan.nbytes, self.chunk_size) for p in pending
        ]
        total = sum(sizes)
        on_device = any(p.on_device for p in pending)
        buffer = staging.reserve(total, gpu.differ().pinned_empty if on_device else None)
        pos = 0
        seen: dict[str, _Seen] = {}
        for p, size in zip(pending, sizes, strict=True):
            plan = p.plan
            plan.offset = pos
            if p.on_device:
                with gpu.differ().cp.cuda.Device(plan.device):
                    gpu.differ().copy_changed(
                        p.data, self.chunk_size, plan.changed, buffer[pos : pos + size]
                    )
            else:
                _chunks.copy_changed(
                    p.data, plan.changed, self.chunk_size, buffer[pos : pos + size], self._workers
                )
                plan.hashes = p.fingerprints[plan.changed]
            pos += size
            seen[plan.name] = _Seen(_key(plan), p.fingerprints, p.groups)
        job = SaveJob(
            seq=self._seq,
            sim_step=step,
            time=self._clock.now(),
            started=started,
            arrays=[p.plan for p in pending],
            values=values,
            order=list(state),
            staging=staging,
            bytes_total=sum(p.plan.nbytes for p in pending),
            bytes_changed=total,
            meta=self._meta(),
        )
        return job, seen

    def _meta(self) -> dict[str, str | int]:
        """What the manifest says about whose checkpoint it is (and, for a file capture,
        the program's own step: `m27 checkpoints` shows it from the manifest alone)."""
        reporter = self._reporter
        meta: dict[str, str | int] = {
            "run_id": reporter.run_id,
            "step": reporter.step,
            "pipeline": reporter.pipeline,
        }
        if reporter.engine_step is not None:
            meta["engine_step"] = reporter.engine_step
        return meta

    def _new_plan(
        self, name: str, kind: str, device: int | None, array: Any, nbytes: int
    ) -> ArrayPlan:
        return ArrayPlan(
            name=name,
            kind=kind,
            device=device,
            dtype=_chunks.dtype_to_json(np.dtype(array.dtype)),
            shape=tuple(int(n) for n in array.shape),
            nbytes=nbytes,
            chunk_size=self.chunk_size,
            changed=np.empty(0, dtype=np.int64),
            offset=0,
            fresh=True,
        )

    def _hash_host(self, name: str, value: np.ndarray[Any, Any] | np.generic) -> _Pending:
        kind = "scalar" if isinstance(value, np.generic) else "numpy"
        array = np.asarray(value)
        data = _chunks.host_bytes(name, array)
        plan = self._new_plan(name, kind, None, array, int(data.shape[0]))
        prev = self._before(plan)
        found = _chunks.diff_chunks(
            data,
            self.chunk_size,
            self._workers,
            None if prev is None else prev.fingerprints,
            None if prev is None else prev.groups,
        )
        plan.changed, plan.fresh = found.changed, prev is None
        return _Pending(plan, data, found.chunks, on_device=False, groups=found.groups)

    def _hash_device(self, name: str, value: Any) -> _Pending:
        differ = gpu.differ()
        device = int(value.device.id)
        with differ.cp.cuda.Device(device):
            data = differ.device_bytes(value)
            plan = self._new_plan(name, "cupy", device, value, int(data.shape[0]))
            fps = differ.fingerprints(data, self.chunk_size)
            plan.changed, plan.fresh = self._diff(plan, fps, lambda prev: differ.changed(fps, prev))
        return _Pending(plan, data, fps, on_device=True)

    def _before(self, plan: ArrayPlan) -> _Seen | None:
        """What the last save knew of this array, unless its shape, dtype or chunking changed."""
        prev = self._seen.get(plan.name)
        return None if prev is None or prev.key != _key(plan) else prev

    def _diff(self, plan: ArrayPlan, fps: Any, compare: Any) -> tuple[npt.NDArray[np.int64], bool]:
        prev = self._before(plan)
        if prev is None:
            return np.arange(int(fps.shape[0]), dtype=np.int64), True
        changed: npt.NDArray[np.int64] = np.asarray(compare(prev.fingerprints), dtype=np.int64)
        return changed, False

    def _committed(self, done: Committed) -> None:
        """In the writer thread, once a save is durable: event, then retention (background)."""
        self._reporter.written(done)
        if self.keep_last > 0:
            self._retention.request()

    # --- restoring ------------------------------------------------------------------

    def restore(self) -> tuple[dict[str, Any], int] | None:
        """(state, step) of the checkpoint to resume from, or None when there is none."""
        self._ready()
        self._writer.flush()
        self._retention.wait_idle()
        self._raise_pending()
        for path in self._candidates():
            try:
                body, state = load(path, self._workers)
            except (CheckpointError, OSError, KeyError, TypeError, ValueError) as exc:
                log.warning("checkpoint %s cannot be restored, trying an older one: %s", path, exc)
                continue
            state = self._to_devices(body, state)
            self._adopt(path, body, state)
            self._reporter.restored(path, int(body["sim_step"]))
            self._last_save = self._clock.monotonic()
            return state, int(body["sim_step"])
        return None

    def _candidates(self) -> list[Path]:
        resume = os.environ.get("M27_RESUME_FROM")
        if not resume:
            return list(reversed(manifests(self.directory)))
        target = Path(resume)
        if target.is_dir():
            chosen = list(reversed(manifests(target)))
        else:
            parsed = parse_name(target)
            older = [
                p
                for p in reversed(manifests(target.parent))
                if parsed and (parse_name(p) or (0, ""))[0] < parsed[0]
            ]
            chosen = [target, *older]
        # If nothing there is usable, this step's own checkpoints are the next best thing.
        return chosen + [p for p in reversed(manifests(self.directory)) if p not in chosen]

    def _to_devices(self, body: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        for name, entry in body["arrays"].items():
            if entry.get("kind") != "cupy":
                continue
            try:
                state[name] = gpu.differ().to_device(state[name], entry.get("device"))
            except ImportError:
                log.warning("%r was a CuPy array; CuPy is missing, restored as NumPy", name)
        return state

    def _adopt(self, path: Path, body: dict[str, Any], state: dict[str, Any]) -> None:
        """Make the restored checkpoint the base of the next (differential) save."""
        if path.parent.resolve() != self.directory.resolve():
            return  # chunks in another directory cannot be referenced: next save is full
        tables: dict[str, ChunkTable] = {}
        seen: dict[str, _Seen] = {}
        for name, entry in body["arrays"].items():
            if int(entry["chunk_size"]) != self.chunk_size:
                continue
            key = (
                json.dumps(entry["dtype"]),
                tuple(entry["shape"]),
                int(entry["nbytes"]),
                self.chunk_size,
                entry.get("device"),
            )
            table = ChunkTable.from_manifest(key, entry["chunks"])
            value = state[name]
            if gpu.is_cupy_array(value):
                differ = gpu.differ()
                with differ.cp.cuda.Device(int(value.device.id)):
                    fps = differ.fingerprints(differ.device_bytes(value), self.chunk_size)
            elif entry.get("kind") == "cupy":
                continue  # restored as NumPy without CuPy: its next save is full
            else:
                fps = table.hash.copy()
            tables[name] = table
            seen[name] = _Seen(key, fps)
        self._writer.set_base(tables)
        self._seen = seen

    # --- lifecycle ----------------------------------------------------------------------

    def _ready(self) -> None:
        if self._closed:
            raise CheckpointError(
                f"checkpointer for {self.directory} is closed", directory=str(self.directory)
            )
        self._raise_pending()

    def _raise_pending(self) -> None:
        if self._writer.failed:
            error = self._writer.take_error()
            self._seen = {}
            if error is not None:
                raise error

    def close(self) -> None:
        """Wait for every save to be durable, stop the writer; raise a save's error."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        _shut_down(self._writer, self._workers, self._retention)
        self._raise_pending()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except CheckpointError as error:
            log.error("checkpoint error while handling another exception: %s", error)


def _shut_down(writer: BackgroundWriter, workers: Workers, retention: BackgroundPrune) -> None:
    """Make every pending save durable, finish retention, stop the threads (close(), exit)."""
    try:
        writer.close()
    finally:
        workers.close()
        retention.close()


def _key(plan: ArrayPlan) -> tuple[Any, ...]:
    return plan.key
