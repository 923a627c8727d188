"""Differential checkpoints: only the chunks that changed since the last save are written.

Public surface: :class:`Checkpointer` (also ``m27.Checkpointer``), :func:`latest_checkpoint`
and :func:`artifact_for` for the flow, and the listing/verify/gc helpers and settings the
CLI uses.
See docs/checkpoints.md for the format and the guarantees.
"""

from __future__ import annotations

from m27.checkpoint._checkpointer import Checkpointer
from m27.checkpoint._chunks import native_hashing
from m27.checkpoint._format import ManifestInfo
from m27.checkpoint._reader import verify
from m27.checkpoint._report import artifact_for, artifact_key
from m27.checkpoint._retention import Listed, collect_garbage, latest_checkpoint, prune, scan
from m27.checkpoint._settings import CheckpointSettings, checkpoints_home, load_settings

__all__ = [
    "CheckpointSettings",
    "Checkpointer",
    "Listed",
    "ManifestInfo",
    "artifact_for",
    "artifact_key",
    "checkpoints_home",
    "collect_garbage",
    "latest_checkpoint",
    "load_settings",
    "native_hashing",
    "prune",
    "scan",
    "verify",
]
