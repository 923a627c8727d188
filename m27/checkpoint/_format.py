"""On-disk layout of a checkpoint directory and the manifest format.

One directory per step holds, side by side (so one directory fsync covers both)::

    ckpt-0000000007.pack    append-only: the chunks that changed in save 7
    ckpt-0000000007.json    the manifest of save 7: every array's chunks, in any pack

A manifest is one JSON object ``{"hash":"<xxh3_128 hex>","body":{...}}`` whose hash covers
the exact bytes of ``body`` as stored, so it is checked without re-serialising. Packs are
never overwritten: a save takes the number after every manifest and pack present, so a
pack orphaned by a crash is simply unreferenced until garbage collection removes it.

Commit protocol: pack written and fsynced, manifest written to a dot-file and fsynced,
renamed into place, directory fsynced. A crash anywhere before the rename leaves the
previous manifest as the newest one.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from m27._exceptions import CorruptCheckpointError

FORMAT_VERSION = 1
CODEC_RAW = "raw"
CODEC_ZSTD = "zstd"

_NAME = re.compile(r"^ckpt-(\d{10})\.(json|pack)$")
_HEAD = b'{"hash":"'
_MID = b'","body":'
_HASH_LEN = 32
_BODY_START = len(_HEAD) + _HASH_LEN + len(_MID)


def manifest_path(directory: Path, seq: int) -> Path:
    return directory / f"ckpt-{seq:010d}.json"


def pack_path(directory: Path, seq: int) -> Path:
    return directory / f"ckpt-{seq:010d}.pack"


def parse_name(path: Path) -> tuple[int, str] | None:
    """(seq, "json" | "pack") for a checkpoint file name, None for anything else."""
    match = _NAME.match(path.name)
    return (int(match.group(1)), match.group(2)) if match else None


def manifests(directory: Path) -> list[Path]:
    """Manifest files in `directory`, oldest first (by save number)."""
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        parsed = parse_name(path)
        if parsed and parsed[1] == "json":
            found.append((parsed[0], path))
    return [p for _, p in sorted(found)]


def next_seq(directory: Path) -> int:
    """The number of the next save: past every manifest and pack, so no pack is reused."""
    seqs = [p[0] for p in (parse_name(f) for f in directory.iterdir()) if p]
    return max(seqs, default=0) + 1


def encode_manifest(body: dict[str, Any]) -> bytes:
    data = json.dumps(body, separators=(",", ":"), allow_nan=True).encode()
    digest = xxhash.xxh3_128_hexdigest(data).encode()
    return _HEAD + digest + _MID + data + b"}\n"


def decode_manifest(data: bytes, path: Path) -> dict[str, Any]:
    """The body of a manifest file, after its hash and format version are checked."""
    end = data.rfind(b"}")
    if not data.startswith(_HEAD) or data[_BODY_START - len(_MID) : _BODY_START] != _MID:
        raise CorruptCheckpointError(f"{path}: not an m27 manifest (bad header)", file=str(path))
    if end < _BODY_START or data[end + 1 :].strip():
        raise CorruptCheckpointError(f"{path}: manifest is truncated", file=str(path))
    stored = data[len(_HEAD) : len(_HEAD) + _HASH_LEN].decode("ascii", "replace")
    body = data[_BODY_START:end]
    if xxhash.xxh3_128_hexdigest(body) != stored:
        raise CorruptCheckpointError(f"{path}: manifest hash mismatch", file=str(path))
    try:
        parsed = json.loads(body)
    except ValueError as exc:
        raise CorruptCheckpointError(
            f"{path}: manifest is not JSON: {exc}", file=str(path)
        ) from exc
    if not isinstance(parsed, dict) or parsed.get("format") != FORMAT_VERSION:
        raise CorruptCheckpointError(
            f"{path}: manifest format {parsed.get('format') if isinstance(parsed, dict) else '?'}"
            f" is not {FORMAT_VERSION}",
            file=str(path),
        )
    return parsed


def read_manifest(path: Path) -> dict[str, Any]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CorruptCheckpointError(
            f"{path}: cannot read manifest: {exc}", file=str(path)
        ) from exc
    return decode_manifest(data, path)


@dataclass(frozen=True)
class ManifestInfo:
    """What listings show about one checkpoint (from its manifest alone)."""

    path: Path
    seq: int
    time: float
    sim_step: int
    bytes_written: int
    bytes_total: int
    bytes_changed: int
    packs: dict[int, int]
    #: a file capture's program step (a GROMACS .cpt's MD step), when it could be read
    engine_step: int | None = None

    @property
    def percent_changed(self) -> float:
        return 100.0 * self.bytes_changed / self.bytes_total if self.bytes_total else 0.0


def info(path: Path, body: dict[str, Any]) -> ManifestInfo:
    """What a listing shows of the manifest `body` at `path`; CorruptCheckpointError naming
    the file when a field is not what a save writes (`"time": "x"`)."""
    try:
        return _info(path, body)
    except (AttributeError, KeyError, TypeError, ValueError, OverflowError) as exc:
        raise CorruptCheckpointError(
            f"{path}: manifest is malformed: {type(exc).__name__}: {exc}", file=str(path)
        ) from None


def _info(path: Path, body: dict[str, Any]) -> ManifestInfo:
    stats = body.get("stats", {})
    return ManifestInfo(
        path=path,
        seq=int(body["seq"]),
        time=float(body["time"]),
        sim_step=int(body["sim_step"]),
        bytes_written=int(stats.get("bytes_written", 0)),
        bytes_total=int(stats.get("bytes_total", 0)),
        bytes_changed=int(stats.get("bytes_changed", 0)),
        packs={int(k): int(v) for k, v in body.get("packs", {}).items()},
        engine_step=int(body["engine_step"]) if body.get("engine_step") is not None else None,
    )


def check_packs(directory: Path, manifest: ManifestInfo) -> None:
    """The cheap validity check: every referenced pack exists and is long enough."""
    for seq, needed in manifest.packs.items():
        pack = pack_path(directory, seq)
        try:
            size = pack.stat().st_size
        except OSError as exc:
            raise CorruptCheckpointError(
                f"{manifest.path}: pack {pack} is missing", file=str(pack)
            ) from exc
        if size < needed:
            raise CorruptCheckpointError(
                f"{manifest.path}: pack {pack} is truncated ({size} < {needed} bytes)",
                file=str(pack),
            )


def write_all(fd: int, data: memoryview | bytes) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write, fsync, rename into place, fsync the directory."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    except BaseException as exc:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
