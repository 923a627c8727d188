"""m27: a GPU pipeline engine for scientific labs.

The public API is what ``__all__`` lists; everything else is internal and may change.
"""

from __future__ import annotations

import typing as _typing

__version__ = "0.1.0"

from m27 import _lazy
from m27._exceptions import (
    CheckpointError,
    ConfigError,
    CorruptCheckpointError,
    GpuError,
    M27Error,
    NotifyError,
    PathError,
    RunError,
    RunnerError,
    SpecError,
    StoreError,
    UnknownEventError,
)
from m27.clock import Clock, FakeClock, SystemClock
from m27.signals import watch_stop
from m27.step import gate, io_wait

if _typing.TYPE_CHECKING:
    from m27.checkpoint import Checkpointer
    from m27.config import Settings, load_settings
    from m27.spec import Pipeline, Problem, Step, load_pipeline

#: Public names imported on first use: a step process that only calls ``m27.io_wait()``
#: and ``m27.gate()`` starts without numpy, the checkpointer or the spec parser, so it
#: reaches its gate in milliseconds (a guest still importing is computing, as far as a
#: GPU's utilization can tell, and would be stopped by signal).
__getattr__ = _lazy.module_getattr(
    globals(),
    {
        "m27.checkpoint": ("Checkpointer",),
        "m27.config": ("Settings", "load_settings"),
        "m27.spec": ("Pipeline", "Problem", "Step", "load_pipeline"),
    },
)


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
    "PathError",
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
    "watch_stop",
]
