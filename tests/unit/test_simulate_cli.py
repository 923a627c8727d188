"""`m27 simulate` input a new user gets wrong: a clean message for a bad `lab:` option, and
an event log replayed on the GPU count of the node that wrote it."""

from __future__ import annotations

import json
import os
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
        ("lab:load=0", "load must be a number above 0 and at most 100"),
        # 10^11 jobs: the command never returned
        ("lab:load=1e9", "lab:load=1e9: load must be a number above 0 and at most 100"),
    ],
)
def test_a_bad_lab_option_is_a_clean_error(
    trace: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", trace]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and "invalid literal" not in err


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_trace_that_is_not_a_file_is_refused_at_once(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Reading a FIFO waited forever for a writer; /dev/zero never ended."""
    trace = tmp_path / "t.jsonl"
    if kind == "fifo":
        os.mkfifo(trace)
    else:
        trace = Path(kind)
    assert main(["simulate", str(trace)]) == 2
    err = capsys.readouterr().err
    what = "a pipe" if kind == "fifo" else "a device or a socket"
    hint = " (save the trace first)" if kind == "fifo" else ""
    assert err == f"m27: {trace} is {what}, not a trace file{hint}\n"


def test_an_alibaba_load_out_of_range_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """--load 1e-300 printed a makespan of 10^300 hours."""
    with pytest.raises(SystemExit) as exited:
        main(["simulate", "x.csv", "--load", "1e-300"])
    assert exited.value.code == 2
    assert "argument --load: '1e-300': give a number from 0.01 to 100" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"bad json', "bad trace line: not JSON: Invalid control character"),
        ('{"id": "a"}', "bad trace line: missing field 'phases'"),
        ("[1]", "bad trace line: a job is a JSON object, not list"),
        ('{"id": "a", "arrival": 0, "phases": [["compute", -5]]}', "a phase lasts from 0 to 1e+09"),
        # a busy % of nan and a 300-digit makespan; "not enough values to unpack"
        ('{"id": "a", "arrival": 0, "phases": [["compute", 1e308]]}', "a phase lasts from 0"),
        ('{"id": "a", "arrival": 0, "phases": "abc"}', 'phases is a list of ["compute"|'),
        ('{"id": "a", "arrival": 1e308, "phases": [["io", 1]]}', "arrival must be a number"),
        # `--gpus 2000`, the hint, was itself refused
        ('{"id": "a", "arrival": 0, "phases": [["io", 1]], "gpus": 2000}', "at most 1024"),
        ('{"id": "a", "arrival": 0, "phases": [["idle", 5]]}', "unknown phase kind 'idle'"),
        ('{"id": "a", "arrival": 0, "phases": []}', "job 'a': phases is empty"),
        ('{"id": "a", "arrival": -1, "phases": [["io", 1]]}', "arrival must be a number of"),
        ('{"id": "a", "arrival": 0, "phases": [["io", 1]], "type": "tpu"}', "unknown type"),
        ('{"id": "a", "arrival": 0, "phases": [["io", 1]], "gpus": 0}', "needs at least 1 GPU"),
        ('{"id": "a", "arrival": 0, "phases": [["io", 1]], "depends_on": "b"}', "a list of"),
        ('{"trace": {"gpus": 0}}', "trace gpus must be a whole number >= 1, not 0"),
        ('{"trace": {"gpu": 2}}', "unknown trace field 'gpu'"),
        ('{"trace": {"window": -1}}', "trace window must be a number of seconds > 0"),
    ],
)
def test_a_bad_trace_line_names_its_file_and_line(
    tmp_path: Path, line: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(f'{{"trace": {{"gpus": 1}}}}\n\n{line}\n')
    assert main(["simulate", str(trace)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"m27: {trace}:3: bad trace line: ") and message in err, err


@pytest.mark.parametrize(
    ("deps", "cycle"),
    [({"a": ["a"]}, "a -> a"), ({"a": ["b"], "b": ["a"]}, "a -> b -> a")],
    ids=["on-itself", "two-jobs"],
)
def test_jobs_that_depend_on_each_other_in_a_cycle_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], deps: dict[str, list[str]], cycle: str
) -> None:
    # no policy could start them: "0/2 done" and no word why
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"id": j, "arrival": 0, "phases": [["io", 1]], "depends_on": d}) + "\n"
            for j, d in deps.items()
        )
    )
    assert main(["simulate", str(trace)]) == 2
    assert capsys.readouterr().err == (
        f"m27: {trace}:1: bad trace line: jobs depend on each other in a cycle: {cycle}\n"
    )


def test_a_job_id_used_twice_names_both_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the simulator keys jobs by id: the second would silently never run (1/2 done)
    job = '{"id": "a", "arrival": 0, "phases": [["compute", 5]]}'
    trace = tmp_path / "t.jsonl"
    trace.write_text(f"{job}\n{job}\n")
    assert main(["simulate", str(trace)]) == 2
    assert capsys.readouterr().err == (
        f"m27: {trace}:2: bad trace line: job id 'a' is already used on line 1\n"
    )


def test_a_line_that_is_not_utf8_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(
        b'{"trace": {"gpus": 1}}\n{"id": "%s", "arrival": 0, "phases": [["io", 1]]}\n\xff\n'
        % (b"x" * 9000)
    )
    assert main(["simulate", str(trace)]) == 2
    assert capsys.readouterr().err.startswith(f"m27: {trace}:3: bad trace line: not UTF-8")


def test_a_job_wider_than_the_simulated_node_is_refused_not_reported_as_never_done(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"id": "wide", "arrival": 0, "phases": [["compute", 5]], "gpus": 3}\n')
    assert main(["simulate", str(trace), "--gpus", "2"]) == 2
    err = capsys.readouterr().err
    assert "1 job asking for more GPUs than the simulated node has (2)" in err
    assert "job 'wide' asks for 3: simulate a larger node with --gpus 3" in err
    assert main(["simulate", str(trace), "--gpus", "3", "--policy", "fifo", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["jobs_done"] == 1


def test_a_dependency_outside_the_trace_is_ignored_as_for_an_event_logs_unfinished_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"id": "r/b", "arrival": 0, "phases": [["compute", 5]], "depends_on": ["r/a"]}\n'
    )
    assert main(["simulate", str(trace), "--policy", "fifo", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["jobs_done"] == 1


HEADER = "name,cpu_milli,num_gpu,gpu_milli,qos,creation_time,deletion_time,scheduled_time"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("a,b\n1,2\n", "not an Alibaba openb_pod_list CSV: no column name, num_gpu"),
        (f"{HEADER}\np0,1000,1,1000,LS,abc,10,0\n", ":2: bad Alibaba trace row: creation_time"),
        (
            f"{HEADER}\np0,1000,1,1000,LS,0,10,0\np1,1000,x,1000,LS,5,9,5\n",
            ":3: bad Alibaba trace row: num_gpu 'x' is not a whole number",
        ),
        (f"{HEADER}\np0,1000,1,1000,LS,0,nan,0\n", "deletion_time 'nan' is not a number"),
        (f"{HEADER}\np0,1000\n", ":2: bad Alibaba trace row: num_gpu '' is not a whole number"),
    ],
)
def test_a_bad_alibaba_csv_names_the_file_the_line_and_the_column(
    tmp_path: Path, body: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "openb_pod_list_x.csv"
    trace.write_text(body)
    assert main(["simulate", str(trace)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"m27: {trace}") and message in err, err
    assert "Traceback" not in err and "invalid literal" not in err


def test_an_alibaba_csv_that_is_not_utf8_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "openb_pod_list_x.csv"
    trace.write_bytes(f"{HEADER}\n".encode() + b"p0,\xff\xfe,1,1000,LS,0,10,0\n")
    assert main(["simulate", str(trace)]) == 2
    assert capsys.readouterr().err == f"m27: {trace}: bad Alibaba trace: not UTF-8 text\n"


def test_an_event_log_replays_on_its_nodes_gpu_count(tmp_path: Path) -> None:
    store = SqliteEventStore(tmp_path / "events.db")
    try:
        assert _node_gpus(store.read()) is None  # no agent ever ran: the caller's default
        store.append([AgentStarted(at=1.0, pid=1, host="h", gpus=8, backend="nvml")])
        store.append([AgentStarted(at=2.0, pid=2, host="h", gpus=2, backend="sim")])
        assert _node_gpus(store.read()) == 2  # the node as it last ran
    finally:
        store.close()


@pytest.mark.parametrize("flag", ["--report", "--save-trace"])
@pytest.mark.parametrize("where", ["missing/r.out", "."])
def test_an_output_path_that_cannot_be_written_is_refused_before_simulating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, where: str
) -> None:
    """`--report` to a folder that is not there was found after the simulation (minutes on
    a large trace), its table printed and then lost."""
    out = tmp_path / where
    assert main(["simulate", "lab:seed=0", "--policy", "fifo", flag, str(out)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing simulated
    why = "No such file or directory" if where != "." else "Is a directory"
    assert captured.err == f"m27: cannot use {out}: {why}\n"


def test_a_terminal_sees_which_policy_is_being_simulated(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """100,000 jobs take ~40 s under m27's policy, and nothing was shown until the table."""
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    assert main(["simulate", "lab:seed=0,load=0.5", "--policy", "fifo,m27"]) == 0
    shown = [line.removeprefix("\x1b[2K") for line in err.getvalue().split("\r")]
    jobs = capsys.readouterr().out.split(": ", 1)[1].split(" jobs")[0]
    assert shown == [
        f"simulating fifo (1 of 2) on {jobs} jobs...",
        f"simulating m27 (2 of 2) on {jobs} jobs...",
        "",  # cleared before the table
    ]
    # not on a pipe (a script's stderr): nothing
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert main(["simulate", "lab:seed=0,load=0.5", "--policy", "fifo"]) == 0
    assert sys.stderr.getvalue() == ""  # type: ignore[attr-defined]
