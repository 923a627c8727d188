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
from m27.step import gate, io_wait

if _typing.TYPE_CHECKING:
    from m27.checkpoint import Checkpointer
    from m27.config import Settings, load_settings
    from m27.spec import Pipeline, Problem, Step, load_pipeline

#: Public names imported on first use: a step process that only calls ``m27.io_wait()``
#: and ``m27.gate()`` starts without numpy, the checkpointer or the spec parser, so it
#: reaches its gate in milliseconds (a guest still importing is computing, as far as a
#: GPU's utilization can tell, and would be stopped by signal).
_LAZY = {
    "Checkpointer": "m27.checkpoint",
    "Settings": "m27.config",
    "load_settings": "m27.config",
    "Pipeline": "m27.spec",
    "Problem": "m27.spec",
    "Step": "m27.spec",
    "load_pipeline": "m27.spec",
}


def __getattr__(name: str) -> object:
    return _lazy.load(__name__, _LAZY, globals(), name)


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
]
