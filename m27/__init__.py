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
from m27.checkpoint import Checkpointer
from m27.clock import Clock, FakeClock, SystemClock
from m27.config import Settings, load_settings
from m27.spec import Pipeline, Problem, Step, load_pipeline
from m27.step import gate, io_wait

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "Clock",
    "ConfigError",
    "CorruptCheckpointError",
    "FakeClock",
    "GpuError",
    "M27Error",
    "NotifyError",
    "Pipeline",
    "Problem",
    "RunError",
    "RunnerError",
    "Settings",
    "SpecError",
    "Step",
    "StoreError",
    "SystemClock",
    "UnknownEventError",
    "__version__",
    "gate",
    "io_wait",
    "load_pipeline",
    "load_settings",
]
