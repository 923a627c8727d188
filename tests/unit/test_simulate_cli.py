"""`m27 simulate` input a new user gets wrong: a clean message for a bad `lab:` option, and
an event log replayed on the GPU count of the node that wrote it."""

from __future__ import annotations

from pathlib import Path

import pytest

from m27.cli.commands.simulate import _node_gpus
from m27.cli.main import main
from m27.events import AgentStarted
from m27.store.sqlite import SqliteEventStore


@pytest.mark.parametrize(
    ("trace", "message"),
    [
        ("lab:seed=x", "lab:seed=x: seed must be a whole number, e.g. lab:seed=3, not 'x'"),
        ("lab:sed=1", "unknown option 'sed'; did you mean 'seed'?"),
        ("lab:load=0", "load must be a number > 0"),
    ],
)
def test_a_bad_lab_option_is_a_clean_error(
    trace: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", trace]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and "invalid literal" not in err


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"bad json', "bad trace line: Invalid control character"),
        ('{"id": "a"}', "bad trace line: missing field 'phases'"),
    ],
)
def test_a_bad_trace_line_names_its_file_and_line(
    tmp_path: Path, line: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(f'{{"trace": {{"gpus": 1}}}}\n\n{line}\n')
    assert main(["simulate", str(trace)]) == 2
    assert capsys.readouterr().err.startswith(f"m27: {trace}:3: {message}")


def test_an_event_log_replays_on_its_nodes_gpu_count(tmp_path: Path) -> None:
    store = SqliteEventStore(tmp_path / "events.db")
    try:
        assert _node_gpus(store.read()) is None  # no agent ever ran: the caller's default
        store.append([AgentStarted(at=1.0, pid=1, host="h", gpus=8, backend="nvml")])
        store.append([AgentStarted(at=2.0, pid=2, host="h", gpus=2, backend="sim")])
        assert _node_gpus(store.read()) == 2  # the node as it last ran
    finally:
        store.close()
