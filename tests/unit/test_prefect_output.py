"""A step's output in its Prefect task run log: batched, bounded, and honest about the cut."""

from __future__ import annotations

import logging

import pytest

from flows._run import _PrefectOutput


def _output(caplog: pytest.LogCaptureFixture, limit: int) -> _PrefectOutput:
    caplog.set_level(logging.INFO, logger="m27-test-output")
    return _PrefectOutput(logging.getLogger("m27-test-output"), limit, "r1", "sim")


def test_the_lines_of_a_read_are_one_record_at_their_streams_level(
    caplog: pytest.LogCaptureFixture,
) -> None:
    out = _output(caplog, 1000)
    out.add("stdout", ["step 1", "step 2"])
    out.add("stderr", ["note: slow"])
    out.add("stdout", [])
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "step 1\nstep 2"),
        ("WARNING", "note: slow"),
    ]


def test_output_stops_at_the_limit_with_whole_lines_and_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    out = _output(caplog, 20)
    out.add("stdout", ["0123456789"])  # 10 bytes
    out.add("stdout", ["abc", "defgh", "ijklmnop"])  # "abc\ndefgh" is 9 more: 19 <= 20
    out.add("stdout", ["never sent"])
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "0123456789",
        "abc\ndefgh",
        "the step's output after its first 20B is not sent to Prefect (prefect_log_limit);"
        " all of it is in the step log: m27 logs r1 sim",
    ]


def test_a_limit_of_zero_sends_no_output_only_where_it_is(
    caplog: pytest.LogCaptureFixture,
) -> None:
    out = _output(caplog, 0)
    out.add("stderr", ["first"])
    out.add("stderr", ["second"])
    assert [r.getMessage() for r in caplog.records] == [
        "the step's output after its first 0B is not sent to Prefect (prefect_log_limit);"
        " all of it is in the step log: m27 logs r1 sim"
    ]
