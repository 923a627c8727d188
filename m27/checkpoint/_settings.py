"""Checkpoint tuning, read from the node's configuration (``m27.config``).

A step's child process has the same view as the agent: ``~/.m2config`` (or
``$M27_CONFIG``), then ``M27_*`` variables and ``M2_CHUNK_SIZE``. Where the step's own
checkpoint folder and interval come from the runner instead (``M27_CHECKPOINT_DIR``,
``M27_CHECKPOINT_INTERVAL``), they are read here too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from m27._exceptions import ConfigError
from m27.config import load_settings as load_node_settings
from m27.config import m27_home
from m27.units import parse_duration


@dataclass(frozen=True)
class CheckpointSettings:
    chunk_size: int
    compression_level: int
    keep_last: int
    max_in_flight: int
    #: 0 = one thread per core, at most four (see m27.checkpoint._parallel).
    threads: int


def load_settings() -> CheckpointSettings:
    """The node's checkpoint settings (config file, then M27_*/M2_CHUNK_SIZE overrides)."""
    node = load_node_settings()
    return CheckpointSettings(
        chunk_size=node.diff_threshold,
        compression_level=node.compression_level,
        keep_last=node.keep_last,
        max_in_flight=node.max_in_flight,
        threads=node.checkpoint_threads,
    )


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
    return m27_home() / "checkpoints"
