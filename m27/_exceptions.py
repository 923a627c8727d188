"""The one exception tree of m27.

Every error m27 raises on purpose derives from :class:`M27Error`, so a caller can catch
all of them in one place and still read the context (file, line, run, step) as
attributes instead of parsing a message::

    M27Error
    ├── SpecError            a pipeline file is invalid (carries every problem found)
    ├── ConfigError          ~/.m2config or an M27_* variable is invalid
    ├── StoreError           the event log cannot be read or written
    │   └── UnknownEventError   a stored event kind or version this code does not know
    ├── RunnerError          a step could not be started or supervised
    │   └── SlurmError          sbatch/scontrol/scancel failed (m27.executors.slurm)
    ├── CheckpointError      a checkpoint could not be written or restored
    │   └── CorruptCheckpointError  a manifest or pack failed its hash check
    ├── GpuError             a GPU backend failed in a way that is not "unknown"
    ├── PathError            a name would build a path outside its root (m27.paths)
    ├── NotifyError          Telegram configuration or delivery failed
    └── RunError             a run failed, was cancelled, or cannot be resumed
        └── RunIdError          no run, or several, match a run id (m27.runids; exit 2)

Every error carries the CLI's exit status for it, ``exit_code``: 2 for the user's input
(SpecError, ConfigError, RunIdError), else 1.
"""

from __future__ import annotations

from typing import Any


class M27Error(Exception):
    """Root of every error m27 raises on purpose.

    Context travels as keyword attributes (``file``, ``line``, ``run_id``, ``step`` ...)
    so tools can show or match them without parsing the message.
    """

    #: the command-line exit status for this error: 1, or 2 for the user's bad input
    exit_code: int = 1

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.context: dict[str, Any] = context
        for key, value in context.items():
            setattr(self, key, value)

    def __str__(self) -> str:
        return self.message


class SpecError(M27Error):
    """A pipeline file is invalid; ``problems`` lists every problem, not just the first."""

    problems: list[Any]
    exit_code = 2

    def __init__(self, message: str, **context: Any) -> None:
        context.setdefault("problems", [])
        super().__init__(message, **context)


class ConfigError(M27Error):
    """A configuration file or environment variable has an unknown key or a bad value."""

    exit_code = 2


class StoreError(M27Error):
    """The event log cannot be opened, read or appended to."""


class UnknownEventError(StoreError):
    """A stored event's kind or schema version is unknown: replay must stop, not guess."""


class RunnerError(M27Error):
    """A step's process could not be started or supervised."""


class CheckpointError(M27Error):
    """A checkpoint could not be written, committed or restored."""


class CorruptCheckpointError(CheckpointError):
    """A manifest or a pack chunk failed its hash or length check."""


class GpuError(M27Error):
    """A GPU backend failed as a whole (not a single unsupported field)."""


class PathError(M27Error):
    """A name (step, run, pipeline) would make a path that is not a plain child of its root."""


class NotifyError(M27Error):
    """Telegram configuration is invalid or a message could not be delivered."""


class RunError(M27Error):
    """A run failed, was cancelled, or cannot be resumed."""


def one_line(exc: BaseException) -> str:
    """An exception in one line: its message, and the first line of its cause's."""

    def first(e: BaseException) -> str:
        lines = str(e).strip().splitlines()
        return lines[0][:300] if lines else type(e).__name__

    cause = exc.__cause__
    return first(exc) + (f" ({first(cause)})" if cause is not None else "")
