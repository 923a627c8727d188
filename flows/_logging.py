"""Prefect's log lines for steps that did not succeed, without the empty traceback.

A task that *returns* a Failed or Cancelled state (every failed, skipped or cancelled m27
step does: the failure is the step's exit, not a Python exception) makes Prefect 3.9 log
``Task run failed with state: ...`` with ``exc_info=True`` outside any exception, which
prints a bogus ``NoneType: None`` line under it, in the terminal and in the UI. The filter
drops that empty exception info; the message stays.

A deployed run whose steps failed ends in a Failed flow state; Prefect's engine then reads
the result, which raises ``FailedRun``, and logs ``Engine execution exited with unexpected
exception`` with a 40-line traceback through Prefect's own code, in the worker's output
and in the UI, for an outcome that is neither unexpected nor an exception: the line
before it already says ``Finished in state Failed('run pf-...: step(s) make failed')``.
That one record is dropped; any other exception keeps its traceback.

When Prefect's server cannot store a batch of log records (its disk is full: a 500),
Prefect's log worker writes ``--- Error logging to API ---`` and the error to stderr with
no line break after it, once per batch, into the middle of `m27 run`'s output. It writes
only while :data:`logging.raiseExceptions` is true (the stdlib's switch for reporting
errors inside logging, meant to be off in production); m27 turns it off in the flow
process. The step's output is in its step log all the same, and a full disk is said once,
by m27, when the event log fails.
"""

from __future__ import annotations

import logging

from prefect.exceptions import FailedRun

__all__ = ["install"]

#: Prefect 3.9's message (prefect/flow_engine.py, run_flow) for the record dropped below.
ENGINE_ERROR = "Engine execution exited with unexpected exception"


class _NoEmptyTraceback(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        info = record.exc_info
        if info is not None and not isinstance(info, BaseException) and info[0] is None:
            record.exc_info = None
        return True


class _NoFailedRunTraceback(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        info = record.exc_info
        failed = isinstance(info, tuple) and isinstance(info[1], FailedRun)
        return not (failed and record.msg == ENGINE_ERROR)


_FILTER = _NoEmptyTraceback()
_FLOW_FILTER = _NoFailedRunTraceback()


def install() -> None:
    """Attach the filters to Prefect's task-run and flow-run loggers (once; idempotent);
    errors inside logging are not printed."""
    logging.raiseExceptions = False
    for name, one in (("prefect.task_runs", _FILTER), ("prefect.flow_runs", _FLOW_FILTER)):
        logger = logging.getLogger(name)
        if one not in logger.filters:
            logger.addFilter(one)
