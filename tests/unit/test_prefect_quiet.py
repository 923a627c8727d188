"""What of Prefect's logging reaches the terminal of `m27 run`: its senders' "still
processing" notes at exit do not (m27's summary is the last word), their real warnings do."""

from __future__ import annotations

import logging

import pytest

from m27.cli.prefect_run import quiet_run_loggers


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
