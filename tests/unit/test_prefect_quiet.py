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

    levels = {name: logging.getLogger(name).level for name in ("prefect", "EventsWorker")}
    levels["APILogWorker"] = logging.getLogger("APILogWorker").level
    keep = Keep()
    logging.getLogger().addHandler(keep)
    logging.getLogger("prefect").addHandler(keep)
    try:
        logging.getLogger("prefect.events.utilities").error("before the abort")
        silence_prefect()
        logging.getLogger("prefect.events.utilities").error("Error emitting event")
        logging.getLogger("EventsWorker").error("can't register atexit after shutdown")
        logging.getLogger("m27").error("m27's own")
    finally:
        logging.getLogger().removeHandler(keep)
        logging.getLogger("prefect").removeHandler(keep)
        for name, level in levels.items():  # as they were (setLevel clears the level cache)
            logging.getLogger(name).setLevel(level)
    assert seen[0] == "before the abort" and "Error emitting event" not in seen
    assert "can't register atexit after shutdown" not in seen and "m27's own" in seen
