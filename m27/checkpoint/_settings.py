"""Checkpoint tuning: from ``m27.config.load_settings()`` when present, else the environment.

The indirection exists so the checkpoint package works in a step's child process that has
no ``~/.m2config`` and on installs where the config module is older; every default here
matches the design (``diff_threshold = 128KB``, ``compression_level = 3``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from m27._exceptions import ConfigError
from m27.units import parse_duration, parse_size

DEFAULT_CHUNK_SIZE = 128 * 1024
DEFAULT_COMPRESSION_LEVEL = 3
DEFAULT_KEEP_LAST = 5
DEFAULT_MAX_IN_FLIGHT = 2


@dataclass(frozen=True)
class CheckpointSettings:
    chunk_size: int = DEFAULT_CHUNK_SIZE
    compression_level: int = DEFAULT_COMPRESSION_LEVEL
    keep_last: int = DEFAULT_KEEP_LAST
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT


def load_settings() -> CheckpointSettings:
    """The node's checkpoint settings (config file, then M27_*/M2_CHUNK_SIZE overrides)."""
    try:
        from m27.config import load_settings as load_node_settings
    except ImportError:
        return _from_env()
    node = load_node_settings()
    fallback = _from_env()
    return CheckpointSettings(
        chunk_size=int(getattr(node, "diff_threshold", fallback.chunk_size)),
        compression_level=int(getattr(node, "compression_level", fallback.compression_level)),
        keep_last=int(getattr(node, "keep_last", fallback.keep_last)),
        max_in_flight=int(getattr(node, "max_in_flight", fallback.max_in_flight)),
    )


def _from_env() -> CheckpointSettings:
    chunk = os.environ.get("M2_CHUNK_SIZE")
    return CheckpointSettings(
        chunk_size=_chunk_size(chunk) if chunk else DEFAULT_CHUNK_SIZE,
        compression_level=_int_env("M27_COMPRESSION_LEVEL", DEFAULT_COMPRESSION_LEVEL),
        keep_last=_int_env("M27_KEEP_LAST", DEFAULT_KEEP_LAST),
        max_in_flight=_int_env("M27_MAX_IN_FLIGHT", DEFAULT_MAX_IN_FLIGHT),
    )


def _chunk_size(text: str) -> int:
    """M2_CHUNK_SIZE as the seed wrote it: a bare number means KiB (``256`` = 256 KiB)."""
    try:
        return int(text) * 1024 if text.strip().isdigit() else parse_size(text)
    except ValueError as exc:
        raise ConfigError(f"M2_CHUNK_SIZE={text!r}: {exc}", variable="M2_CHUNK_SIZE") from exc


def _int_env(name: str, default: int) -> int:
    text = os.environ.get(name)
    if not text:
        return default
    try:
        return int(text)
    except ValueError as exc:
        raise ConfigError(f"{name}={text!r} is not an integer", variable=name) from exc


def default_directory() -> Path:
    """$M27_CHECKPOINT_DIR (the runner sets it per step), else ./checkpoints."""
    return Path(os.environ.get("M27_CHECKPOINT_DIR") or "checkpoints")


def env_interval() -> float | None:
    """The step's ``checkpoint:`` interval as the runner passes it (M27_CHECKPOINT_INTERVAL)."""
    text = os.environ.get("M27_CHECKPOINT_INTERVAL")
    if not text:
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise ConfigError(
            f"M27_CHECKPOINT_INTERVAL={text!r}: {exc}", variable="M27_CHECKPOINT_INTERVAL"
        ) from exc


def checkpoints_home() -> Path:
    """``$M27_HOME/checkpoints``: the CLI's root of ``<run>/<step>/`` directories."""
    try:
        from m27.config import m27_home
    except ImportError:
        return Path(os.environ.get("M27_HOME", "~/.m27")).expanduser() / "checkpoints"
    return m27_home() / "checkpoints"
