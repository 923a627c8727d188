"""Finding, listing, pruning and garbage-collecting the checkpoints of one directory."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from m27._exceptions import CheckpointError, CorruptCheckpointError
from m27.checkpoint._format import (
    ManifestInfo,
    check_packs,
    info,
    manifests,
    parse_name,
    read_manifest,
)

log = logging.getLogger("m27.checkpoint")


class ManifestCache:
    """Manifests already read by this process, keyed by the file's identity.

    A manifest is written once and renamed into place, never changed: the same inode,
    size and mtime mean the same bytes, so a prune need not parse it again. Only the
    background prune uses it (it runs after every save, beside the next save's hashing,
    and parsing every kept manifest twice per save held the GIL for tens of ms per save,
    benchmarks/README.md run D); listings and restores always read the file.
    """

    #: Entries kept (a manifest's info is a few hundred bytes).
    LIMIT = 1024

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[tuple[str, int, int, int], ManifestInfo] = {}

    def info(self, path: Path) -> ManifestInfo:
        """The manifest's info, parsed and hash-checked the first time it is seen."""
        try:
            st = path.stat()
        except OSError:
            return info(path, read_manifest(path))  # gone: read_manifest says how
        key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            found = self._known.get(key)
        if found is not None:
            return found
        parsed = info(path, read_manifest(path))
        with self._lock:
            if len(self._known) >= self.LIMIT:
                self._known.clear()
            self._known[key] = parsed
        return parsed


def _read_info(path: Path, cache: ManifestCache | None) -> ManifestInfo:
    return cache.info(path) if cache is not None else info(path, read_manifest(path))


@dataclass(frozen=True)
class Listed:
    """One manifest file as listings show it; `info` is None when it cannot be read."""

    path: Path
    seq: int
    info: ManifestInfo | None
    problem: str | None

    @property
    def valid(self) -> bool:
        return self.problem is None


def scan(directory: Path, cache: ManifestCache | None = None) -> list[Listed]:
    """Every manifest in `directory`, oldest first, with the cheap validity check applied."""
    out = []
    for path in manifests(directory):
        parsed = parse_name(path)
        seq = parsed[0] if parsed else -1
        try:
            manifest = _read_info(path, cache)
        except (CorruptCheckpointError, KeyError, TypeError, ValueError) as exc:
            out.append(Listed(path, seq, None, str(exc)))
            continue
        try:
            check_packs(directory, manifest)
        except CorruptCheckpointError as exc:
            out.append(Listed(path, seq, manifest, str(exc)))
            continue
        out.append(Listed(path, seq, manifest, None))
    return out


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest valid manifest (hash ok, packs present and long enough), or None.

    Cheap: reads manifests newest first and stops at the first good one; chunk hashes are
    checked by ``restore`` and ``m27 checkpoints verify``.
    """
    for path in reversed(manifests(Path(directory))):
        try:
            check_packs(path.parent, info(path, read_manifest(path)))
        except (CorruptCheckpointError, KeyError, TypeError, ValueError) as exc:
            log.warning("checkpoint %s is not valid, skipped: %s", path, exc)
            continue
        return path
    return None


def prune(
    directory: Path,
    keep_last: int,
    *,
    cache: ManifestCache | None = None,
    intact: Callable[[Listed], bool] | None = None,
) -> list[Path]:
    """Delete manifests older than the newest `keep_last` valid ones, then unused packs.

    Valid means a readable manifest, which is all a prune beside running saves can afford
    to check. With `intact` (``m27 checkpoints gc``: a full read of each checkpoint it
    would keep) a valid checkpoint counts only when ``intact(entry)`` is true, so a
    damaged pack never costs the older, intact checkpoints a restore would fall back to.
    """
    if keep_last < 1:
        raise CheckpointError(f"keep_last must be at least 1, not {keep_last}")
    listed = scan(directory, cache)
    counted = 0
    oldest_kept = None
    for entry in reversed(listed):
        if entry.valid and (intact is None or intact(entry)):
            counted += 1
            if counted == keep_last:
                oldest_kept = entry.seq
                break
    removed: list[Path] = []
    if oldest_kept is not None:
        for entry in listed:
            if entry.seq < oldest_kept:
                entry.path.unlink(missing_ok=True)
                removed.append(entry.path)
    return removed + collect_garbage(directory, cache=cache)


def collect_garbage(directory: Path, *, cache: ManifestCache | None = None) -> list[Path]:
    """Delete packs no readable manifest references, and leftover temporary files.

    Only files numbered below the newest manifest go: anything newer may belong to a save
    that is being written right now.
    """
    newest = 0
    referenced: set[int] = set()
    for path in manifests(directory):
        parsed = parse_name(path)
        newest = max(newest, parsed[0] if parsed else 0)
        try:
            referenced.update(_read_info(path, cache).packs)
        except (CorruptCheckpointError, KeyError, TypeError, ValueError):
            continue
    removed = []
    for path in sorted(directory.iterdir()):
        name = path.name
        if name.startswith(".") and name.endswith(".tmp"):
            parsed = parse_name(path.with_name(name[1:-4]))
            if parsed and parsed[0] < newest:
                path.unlink(missing_ok=True)
                removed.append(path)
            continue
        parsed = parse_name(path)
        if parsed and parsed[1] == "pack" and parsed[0] < newest and parsed[0] not in referenced:
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


class BackgroundPrune:
    """Retention off the save's critical path: one thread prunes after each commit.

    Deleting a 1 GiB pack takes ~0.3 s here; done inline, every save would be durable that
    much later. The writer calls :meth:`request` once a manifest is durable and moves on;
    requests made while a prune runs fold into one more run. Safe beside the writer's
    next save: that save references only chunks the newest manifest references or its
    own pack, which is numbered past every manifest, and :func:`prune` keeps the newest
    `keep_last` manifests and, in :func:`collect_garbage`, every file numbered past the
    newest manifest. A crash mid-prune leaves at worst unreferenced packs or manifests
    older than the kept ones: restore skips nothing it needs, the next prune removes them.
    """

    def __init__(self, directory: Path, keep_last: int) -> None:
        self.directory = directory
        self.keep_last = keep_last
        self._cond = threading.Condition()
        self._wanted = False
        self._running = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._manifests = ManifestCache()
        self._holds = 0  # saves hashing now: a prune waits for them (see `held`)

    def request(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._wanted = True
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="m27-ckpt-retention", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    @contextmanager
    def held(self) -> Iterator[None]:
        """No prune starts inside this block: a save's hashing pass holds the GIL between
        its 128 KiB chunks, and a prune beside it (parsing manifests, unlinking packs)
        takes it in turns with the pass, so back-to-back saves stalled ~5-10 ms longer.
        A prune already running goes on; a requested one starts after the block."""
        with self._cond:
            self._holds += 1
        try:
            yield
        finally:
            with self._cond:
                self._holds -= 1
                self._cond.notify_all()

    def wait_idle(self) -> None:
        """Until no prune runs or is requested (before a restore reads the directory)."""
        with self._cond:
            while self._wanted or self._running:
                self._cond.wait()

    def close(self) -> None:
        """Finish the requested prunes, then stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._wanted or self._holds):
                    self._cond.wait()
                if not self._wanted:
                    return
                self._wanted, self._running = False, True
            try:
                prune(self.directory, self.keep_last, cache=self._manifests)
            except (OSError, CheckpointError) as exc:
                log.warning("checkpoint retention in %s failed: %s", self.directory, exc)
            except Exception:  # a daemon thread must not die silently on a bug
                log.exception("checkpoint retention in %s failed", self.directory)
            finally:
                with self._cond:
                    self._running = False
                    self._cond.notify_all()
