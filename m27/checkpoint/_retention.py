"""Finding, listing, pruning and garbage-collecting the checkpoints of one directory."""

from __future__ import annotations

import logging
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


def scan(directory: Path) -> list[Listed]:
    """Every manifest in `directory`, oldest first, with the cheap validity check applied."""
    out = []
    for path in manifests(directory):
        parsed = parse_name(path)
        seq = parsed[0] if parsed else -1
        try:
            manifest = info(path, read_manifest(path))
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


def prune(directory: Path, keep_last: int) -> list[Path]:
    """Delete manifests older than the newest `keep_last` valid ones, then unused packs."""
    if keep_last < 1:
        raise CheckpointError(f"keep_last must be at least 1, not {keep_last}")
    listed = scan(directory)
    valid = [entry for entry in listed if entry.valid]
    removed: list[Path] = []
    if len(valid) > keep_last:
        oldest_kept = valid[-keep_last].seq
        for entry in listed:
            if entry.seq < oldest_kept:
                entry.path.unlink(missing_ok=True)
                removed.append(entry.path)
    return removed + collect_garbage(directory)


def collect_garbage(directory: Path) -> list[Path]:
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
            referenced.update(info(path, read_manifest(path)).packs)
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
