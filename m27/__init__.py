"""m27: a GPU pipeline engine for scientific labs.

The public API is what ``__all__`` lists; everything else is internal and may change.
"""

from __future__ import annotations

__version__ = "0.1.0"

from m27._exceptions import (
    CheckpointError,
    ConfigError,
    CorruptCheckpointError,
    GpuError,
    M27Error,
    NotifyError,
    RunError,
    RunnerError,
    SpecError,
    StoreError,
    UnknownEventError,
)

__all__ = [
    "CheckpointError",
    "ConfigError",
    "CorruptCheckpointError",
    "GpuError",
    "M27Error",
    "NotifyError",
    "RunError",
    "RunnerError",
    "SpecError",
    "StoreError",
    "UnknownEventError",
    "__version__",
]
