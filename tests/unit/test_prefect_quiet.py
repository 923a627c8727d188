"""What of Prefect's logging reaches the terminal of `m27 run`: its senders' "still
processing" notes at exit do not (m27's summary is the last word), their real warnings do."""

from __future__ import annotations

import logging

import pytest

from m27.cli.prefect_run import quiet_run_loggers, silence_prefect


@pytest.mark.parametrize("name", ["EventsWorker", "APILogWorker"])
def test_draining_notes_are_dropped_and_dropped_items_still_warn(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    quiet_run_loggers()
    quiet_run_loggers()  # a second call (the warm runner's next run) adds nothing
    logger = logging.getLogger(name)
    assert len(logger.filters) == 1
    with caplog.at_level(logging.WARNING):
        logger.warning("Still processing items: 6 items remaining...")
        logger.warning("Service %r queue is full (%d items), dropping item", name, 10000)
    assert [r.getMessage() for r in caplog.records] == [
        f"Service '{name}' queue is full (10000 items), dropping item"
    ]


def test_after_an_abort_prefects_shutdown_errors_are_not_printed() -> None:
    # Prefect's task threads, still ending as the aborted run's interpreter shut down,
    # printed `Error emitting event ... can't register atexit after shutdown` tracebacks.
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    names = ("prefect", "prefect._internal", "EventsWorker", "APILogWorker")
    levels = {name: logging.getLogger(name).level for name in names}
    keep = Keep()
    logging.getLogger().addHandler(keep)
    logging.getLogger("prefect").addHandler(keep)
    try:
        logging.getLogger("prefect.events.utilities").error("before the abort")
        silence_prefect()
        logging.getLogger("prefect.events.utilities").error("Error emitting event")
        logging.getLogger("EventsWorker").error("can't register atexit after shutdown")
        logging.getLogger("prefect._internal.concurrency").error("Service failed")
        logging.getLogger("m27").error("m27's own")
    finally:
        logging.getLogger().removeHandler(keep)
        logging.getLogger("prefect").removeHandler(keep)
        for name, level in levels.items():  # as they were (setLevel clears the level cache)
            logging.getLogger(name).setLevel(level)
    assert seen[0] == "before the abort" and "Error emitting event" not in seen
    assert "can't register atexit after shutdown" not in seen and "m27's own" in seen
    assert "Service failed" not in seen  # its level is its own, not prefect's


def test_prefects_complaints_at_the_terminal_show_once_without_tracebacks() -> None:
    # A lab server down during a run: every event Prefect could not send was an ERROR with
    # a traceback and the whole event, and each retry warned again.
    from m27.cli.prefect_run import _Terse

    terse = _Terse()

    def record(name: str, level: int, msg: str, exc: bool = False) -> logging.LogRecord:
        info = None
        if exc:
            try:
                raise ConnectionRefusedError(111, "Connection refused")
            except OSError:
                import sys

                info = sys.exc_info()
        return logging.LogRecord(name, level, __file__, 1, msg, None, info)

    unable = "Unable to connect to 'ws://127.0.0.1:4311/api/events/in'. Reason: [Errno 111]"
    first = record("prefect.events.clients", logging.WARNING, unable, exc=True)
    assert terse.filter(first) and first.exc_info is None  # shown, in one line
    assert not terse.filter(record("prefect.events.clients", logging.WARNING, unable))
    failed = "Service 'EventsWorker' failed to process item Event(occurred=...)"
    assert not terse.filter(record("prefect._internal.concurrency", logging.ERROR, failed, True))
    other = record("prefect.client", logging.WARNING, "something else")
    assert terse.filter(other)
    mine = record("m27.executors.local", logging.WARNING, "a warning of m27's", exc=True)
    assert terse.filter(mine) and mine.exc_info is None
    assert terse.filter(record("m27.executors.local", logging.WARNING, "a warning of m27's"))
