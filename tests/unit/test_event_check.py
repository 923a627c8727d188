"""A log row changed by hand is named, not reported as a bug in m27.

Decoding does not check types (a replay would pay for it on every row), so an event whose
`attempt` was edited to ``"x"`` failed `m27 logs` and `m27 runs` with
``m27: internal error: TypeError: '>' not supported ...; this is a bug in m27``.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
import typing
from pathlib import Path
from typing import Any

import pytest

from m27 import events as ev
from m27.cli.main import main
from m27.events import EVENT_TYPES, Event, Recorded
from m27.events.check import first_misfit, misfit
from m27.store.sqlite import SqliteEventStore
from tests.unit.event_samples import sample_event
from tests.waiting import wait_until

KINDS = sorted(EVENT_TYPES.values(), key=lambda c: c.__name__)
RUN = "20261207-100000-aaaa"


@pytest.mark.parametrize("cls", KINDS, ids=lambda c: c.__name__)
def test_every_field_of_every_kind_is_checked(cls: type[Event]) -> None:
    sample = sample_event(cls)
    assert misfit(sample) is None  # what m27 writes fits
    hints = typing.get_type_hints(cls)
    checked = 0
    for field in dataclasses.fields(cls):
        if hints[field.name] is Any:
            continue  # any value fits
        wrong = _wrong(hints[field.name])
        edited = object.__new__(cls)  # as a replay builds it: no __post_init__
        edited.__dict__.update({**sample.__dict__, field.name: wrong})
        found = misfit(edited)
        assert found is not None and found[:2] == (field.name, wrong), field.name
        checked += 1
    assert checked >= 3  # time, run_id or host, and more


def _wrong(hint: Any) -> Any:
    """A value of another type than `hint` allows, as a hand edit or another program
    writes one: a word for a number, a number for a word."""
    args = typing.get_args(hint)
    if hint is str or str in args:
        return 2.5
    if typing.get_origin(hint) in (tuple, dict):
        return "x"
    return "slow"


def test_the_first_event_that_does_not_fit_is_named_with_its_sequence_number() -> None:
    good = ev.StepSucceeded(1.0, RUN, "a", 1, 0.5)
    bad = ev.StepSucceeded(2.0, RUN, "b", 1, 0.5)
    object.__setattr__(bad, "duration_s", "fast")
    found = first_misfit([Recorded(1, good), Recorded(2, bad)])
    assert found is not None
    assert (found.seq, found.kind, found.field, found.value) == (
        2,
        "StepSucceeded",
        "duration_s",
        "fast",
    )
    assert str(found) == "event #2 (StepSucceeded): duration_s is 'fast', not a number"
    assert first_misfit([Recorded(1, good)]) is None


@pytest.fixture
def edited_log(m27_home: Path) -> Path:
    """A run's log whose StepSucceeded row had its `attempt` changed to "x" with sqlite3."""
    path = m27_home / "events.db"
    store = SqliteEventStore(path)
    store.append(
        [
            ev.RunSubmitted(1.0, RUN, "p", "p.yaml", ("a",)),
            ev.StepStarted(1.1, RUN, "a", 1, pid=123, pgid=123, command=("true",)),
            ev.StepSucceeded(1.2, RUN, "a", 1, 0.1),
            ev.RunSucceeded(1.3, RUN, 0.3),
        ]
    )
    store.close()
    at = [f.name for f in dataclasses.fields(ev.StepSucceeded)].index("attempt")
    with sqlite3.connect(path) as db:
        ((seq, payload),) = db.execute(
            "select seq, payload from events where kind = 'StepSucceeded'"
        ).fetchall()
        values = json.loads(payload)
        assert values[at] == 1  # positional, as m27 writes it
        values[at] = "x"
        db.execute("update events set payload = ? where seq = ?", (json.dumps(values), seq))
    db.close()
    return path


@pytest.mark.parametrize("argv", [["logs", RUN], ["runs"]], ids=" ".join)
def test_a_command_that_fails_on_an_edited_row_names_the_row_not_a_bug(
    edited_log: Path, m27_home: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        f"m27: the event log {edited_log} holds an event m27 did not write: event #3 "
        "(StepSucceeded): attempt is 'x', not an integer. It was changed by hand"
    ), err
    assert f'sqlite3 {edited_log} "select * from events where seq = 3"' in err
    assert "bug in m27" not in err and "Traceback" not in err
    assert len(err.splitlines()) == 1
    (saved,) = (m27_home / "errors").iterdir()  # the failure's traceback, for the curious
    assert str(saved) in err and "TypeError" in saved.read_text()


def test_the_node_service_names_the_row_its_crash_watch_cannot_pass(
    edited_log: Path, m27_home: Path
) -> None:
    """The watcher's fold fails on the row at every pass (dead runs are then never
    closed): its line on the service log says which row, once, not only the TypeError."""
    from m27.node.serve import _Watcher

    lines: list[str] = []
    stop = threading.Event()
    watcher = _Watcher(m27_home, lines.append, stop)
    watcher.thread.start()
    try:
        wait_until(lambda: lines, timeout=60, what="the crash watch's failure on the service log")
    finally:
        stop.set()
        watcher.thread.join(timeout=60)
        watcher.store.close()
    assert lines[0].startswith("m27 agent: crash watch: TypeError: "), lines
    assert lines[0].endswith(
        " (the log holds an event m27 did not write: event #3 (StepSucceeded): attempt is "
        "'x', not an integer)"
    ), lines
