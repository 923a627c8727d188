"""Prefect's log lines for steps that did not succeed, without the empty traceback.

A task that *returns* a Failed or Cancelled state (every failed, skipped or cancelled m27
step does: the failure is the step's exit, not a Python exception) makes Prefect 3.9 log
``Task run failed with state: ...`` with ``exc_info=True`` outside any exception, which
prints a bogus ``NoneType: None`` line under it, in the terminal and in the UI. The filter
drops that empty exception info; the message stays.
"""

from __future__ import annotations

import logging

__all__ = ["install"]


class _NoEmptyTraceback(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        info = record.exc_info
        if info is not None and not isinstance(info, BaseException) and info[0] is None:
            record.exc_info = None
        return True


_FILTER = _NoEmptyTraceback()


def install() -> None:
    """Attach the filter to Prefect's task-run logger (once; idempotent)."""
    logger = logging.getLogger("prefect.task_runs")
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
