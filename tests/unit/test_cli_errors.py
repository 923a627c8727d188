"""Bad input and failing tools reach the user as one clear line: exit 2 for bad input,
never a traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from m27 import M27Error, RunError
from m27 import events as ev
from m27._exceptions import RunnerError
from m27.cli.main import main
from m27.events.state import fold
from m27.executors.slurm._jobs import SubprocessSlurm
from m27.runids import RunIdError, resolve
from m27.store.sqlite import SqliteEventStore

RUNS = ("20261129-100000-aaaa", "20261129-110000-bbbb")


@pytest.fixture
def two_runs(m27_home: Path) -> Path:
    store = SqliteEventStore(m27_home / "events.db")
    store.append(
        [
            ev.RunSubmitted(at=1.0, run_id=r, pipeline="p", spec_path="p.yaml", steps=("s",))
            for r in RUNS
        ]
    )
    store.close()
    return m27_home


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "nope"],
        ["status", "20261129"],  # matches both runs
        ["cancel", "nope"],
        ["cancel", "20261129"],
        ["logs", "nope", "s"],
        ["bump", "nope", "s", "1"],
    ],
    ids=lambda argv: "-".join(argv),
)
def test_unknown_or_ambiguous_run_ids_exit_2_with_one_line(
    two_runs: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert ("matches 2 runs" in err) if argv[1] == "20261129" else ("no run matches" in err)


@pytest.mark.parametrize(
    ("argv", "usage", "unknown"),
    [
        (["exporter", "--port", "1"], "usage: m27 exporter [-h] [--listen HOST:PORT]", "--port 1"),
        (["agent", "status", "--bogus"], "usage: m27 agent [-h]", "--bogus"),
        (["runs", "x"], "usage: m27 runs [-h]", "x"),
    ],
    ids=lambda v: "-".join(v) if isinstance(v, list) else "",
)
def test_an_unknown_argument_shows_the_subcommands_usage(
    m27_home: Path, argv: list[str], usage: str, unknown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage), err
    assert f"m27 {argv[0]}: error: unrecognized arguments: {unknown}" in err


@pytest.mark.parametrize("argv", [["pool", "init"], ["deploy", "SPEC", "--name", "x"]])
def test_a_prefect_server_that_cannot_be_reached_is_one_line(
    m27_home: Path,
    tmp_path: Path,
    argv: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/api"
    monkeypatch.setenv("PREFECT_API_URL", url)
    spec = tmp_path / "p.yaml"
    spec.write_text("pipeline:\n  - name: a\n    type: cpu\n    command: 'true'\n")
    assert main([str(spec) if a == "SPEC" else a for a in argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"m27: cannot reach the Prefect server at {url}: "), err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--cron", "bad cron"], "--cron 'bad cron': Invalid cron string: \"bad cron\""),
        (["--cron", "0 2 * * *", "--timezone", "Mars/Base"], "--timezone 'Mars/Base': Invalid"),
        (["--name", "a/b"], "--name 'a/b': a deployment name cannot contain / % & < >"),
        (
            ["--cron", "0 2 * * *"],
            "--cron: a scheduled run gives no variables, and `vars:` declares NEEDED without"
            " a value; give it here: --set NEEDED=...",
        ),
    ],
)
def test_a_bad_deployment_option_is_one_line_before_any_server_starts(
    m27_home: Path,
    tmp_path: Path,
    options: list[str],
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    spec = tmp_path / "p.yaml"
    spec.write_text(
        "vars:\n  NEEDED:\npipeline:\n  - name: a\n    type: cpu\n    command: echo {{NEEDED}}\n"
    )
    assert main(["deploy", str(spec), "--name", "n", *options]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"m27: {said}") and len(err.strip().splitlines()) == 1, err
    assert not (m27_home / "service.json").exists()  # no node service started for it


def test_run_id_errors_carry_what_was_typed_and_what_it_could_mean() -> None:
    with pytest.raises(RunIdError) as info:
        resolve("20261129", RUNS)
    assert isinstance(info.value, RunError) and info.value.exit_code == 2
    assert info.value.run_id == "20261129" and info.value.matches == list(RUNS)  # type: ignore[attr-defined]
    with pytest.raises(RunIdError, match="no run matches ''"):
        resolve("", RUNS)  # an empty prefix is no prefix of everything
    with pytest.raises(RunIdError, match="no runs recorded yet"):
        resolve("last", [])


def _failing_scancel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `scancel` on PATH that refuses, as a real one does for another user's job."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scancel = bin_dir / "scancel"
    scancel.write_text(
        "#!/bin/sh\necho 'scancel: error: Kill job error on job id 4242: Access denied' >&2\n"
        "exit 1\n"
    )
    scancel.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_slurm_errors_are_m27_errors_with_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _failing_scancel(tmp_path, monkeypatch)
    with pytest.raises(M27Error) as info:
        SubprocessSlurm(os.environ).cancel("4242")
    assert isinstance(info.value, RunnerError)
    assert info.value.context == {"transient": False, "command": "scancel", "job_id": "4242"}
    assert "cannot cancel Slurm job 4242" in str(info.value) and "Access denied" in str(info.value)


def test_cancel_of_a_crashed_slurm_run_whose_scancel_fails_prints_no_traceback(
    m27_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _failing_scancel(tmp_path, monkeypatch)
    dead = subprocess.Popen(["true"])
    dead.wait()  # the run's flow process: gone
    run_id = "20261130-090000-cccc"
    store = SqliteEventStore(m27_home / "events.db")
    store.append(
        [
            ev.RunSubmitted(
                at=1.0,
                run_id=run_id,
                pipeline="p",
                spec_path="p.yaml",
                steps=("long",),
                pid=dead.pid,
                host=socket.gethostname(),
            ),
            ev.StepStarted(2.0, run_id, "long", attempt=1, pid=0, pgid=0, command=("x",)),
            ev.SlurmJobSubmitted(2.0, run_id, "long", job_id="4242", attempt=1),
        ]
    )
    done = subprocess.run(
        [sys.executable, "-m", "m27.cli", "cancel", run_id],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert "4242" in done.stderr and "Access denied" in done.stderr, done.stderr
    assert done.returncode == 0, done.stdout + done.stderr
    run = fold(store.read()).runs[run_id]
    assert run.status == "cancelled" and run.steps["long"].status == "cancelled"
    store.close()


def _home_inside_a_file(m27_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An M27_HOME that cannot be created: its parent is a regular file."""
    blocker = m27_home.parent / "a-file"
    blocker.write_text("")
    home = blocker / "home"
    monkeypatch.setenv("M27_HOME", str(home))
    return home


def test_a_home_that_cannot_be_made_stops_run_with_one_line_naming_m27_home(
    m27_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    home = _home_inside_a_file(m27_home, monkeypatch)
    monkeypatch.setenv("M27_GPUS", "sim:1")
    spec = tmp_path / "p.yaml"
    spec.write_text("name: p\npipeline:\n  - name: s\n    type: cpu\n    command: 'true'\n")
    assert main(["run", "--plain", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"cannot create {home}: Not a directory" in err, err
    assert "set M27_HOME to a folder m27 can write" in err, err
    assert not home.exists()


@pytest.mark.parametrize(("kind", "what"), [("file", "a file"), ("fifo", "a pipe")])
def test_a_home_that_is_a_file_says_so(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    kind: str,
    what: str,
) -> None:
    """`M27_HOME=results.txt` said `cannot create results.txt: File exists`."""
    home = tmp_path / "home"
    if kind == "fifo":
        os.mkfifo(home)
    else:
        home.write_text("")
    monkeypatch.setenv("M27_HOME", str(home))
    assert main(["runs"]) == 1  # as for any home that cannot be made (above)
    assert capsys.readouterr().err.strip().splitlines() == [
        f"m27: cannot create {home}: it is {what} (m27's home, for its event log and locks: "
        "set M27_HOME to a folder m27 can write)"
    ]


def test_an_os_error_in_m27_home_is_one_line_naming_m27_home_exit_2(
    m27_home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last net under every command: an OSError that escapes a command (here from
    `m27 runs` reading a home made unreadable) is one line, with the path and M27_HOME."""
    import m27.cli.commands.runs as runs_cmd

    def unreadable(args: object) -> int:
        raise PermissionError(13, "Permission denied", str(m27_home / "events.db"))

    monkeypatch.setattr(runs_cmd, "run", unreadable)
    assert main(["runs"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"m27: cannot use {m27_home / 'events.db'}: Permission denied "
        f"(M27_HOME is {m27_home}: set M27_HOME to a folder m27 can write)"
    ]


def test_a_home_that_cannot_be_made_is_one_line_for_the_event_log_commands(
    m27_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = _home_inside_a_file(m27_home, monkeypatch)
    assert main(["status"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"cannot create {home}: Not a directory" in err and "set M27_HOME" in err, err


def test_an_os_error_outside_the_home_names_the_path_and_exits_1(m27_home: Path) -> None:
    from m27.cli.main import _os_error

    text, code = _os_error(PermissionError(13, "Permission denied", "/data/out/x.pdb"))
    assert (text, code) == ("cannot use /data/out/x.pdb: Permission denied", 1)
    text, code = _os_error(OSError(28, "No space left on device"))
    assert (text, code) == ("write error: No space left on device", 1)


def test_output_to_a_full_disk_is_a_write_error_in_one_line(two_runs: Path) -> None:
    # `m27 runs > out.txt` on a full disk (/dev/full: every write is ENOSPC) said
    # `m27: [Errno 28] No space left on device`, not what failed.
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "m27.cli", "runs"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    assert (done.returncode, done.stderr) == (1, "m27: write error: No space left on device\n")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["gpus", "--watch", "inf"], "argument --watch: 'inf': give a number of seconds"),
        (["gpus", "--watch", "nan"], "argument --watch: 'nan': give a number of seconds"),
        (["gpus", "--watch", "0"], "argument --watch: '0': give a number of seconds from 0.05"),
        (["cancel", "r", "--wait", "-1"], "argument --wait: '-1': give a number of seconds"),
        (["simulate", "lab", "--gpus", "0"], "argument --gpus: '0': give a whole number from 1"),
        (["simulate", "lab", "--jobs", "-5"], "argument --jobs: '-5': give a whole number of 1"),
        (["simulate", "lab", "--load", "nan"], "argument --load: 'nan': give a number from 0.01"),
        (["agent", "--port", "99999"], "argument --port: '99999': give a whole number from 1"),
        # `worker --limit -1` was an internal error (a ValueError from anyio), `--limit 0`
        # a worker that took nothing; `gpus --watch --count 0` never stopped; `agent --idle
        # 0` stopped at once where `service_idle = 0` is refused; `bot --poll-timeout -5`
        # polled; `simulate --window xx` named no option
        (["worker", "--limit", "-1"], "argument --limit: '-1': give a whole number of 1 or"),
        (["worker", "--limit", "0"], "argument --limit: '0': give a whole number of 1 or more"),
        (["gpus", "--watch", "--count", "0"], "argument --count: '0': give a whole number of 1"),
        (["agent", "--idle", "0"], "argument --idle: '0': give a duration above 0, e.g. 10m"),
        (["agent", "--idle", "inf"], "argument --idle: not a duration: 'inf'"),
        (["bot", "--poll-timeout", "-5"], "argument --poll-timeout: '-5': give a whole number"),
        (["simulate", "lab", "--window", "xx"], "argument --window: not a duration: 'xx'"),
        (["simulate", "lab", "--window", "0"], "argument --window: '0': give a duration above 0"),
    ],
)
def test_a_number_no_wait_or_model_can_use_is_refused_by_argparse(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # `m27 gpus --watch inf` died in time.sleep with OverflowError; `nan` and `0` redrew
    # the table in a loop that spun a core; `simulate --load nan` simulated NaN arrivals;
    # `agent --port 99999` started, then stopped with "crash watch: ExceptionGroup"
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_count_of_tables_without_watch_is_refused_not_ignored(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["gpus", "--count", "2"]) == 2
    assert capsys.readouterr() == (
        "",
        "m27 gpus: --count goes with --watch: m27 gpus --watch --count 2\n",
    )


def test_a_deleted_current_folder_is_named_not_an_errno(m27_home: Path, tmp_path: Path) -> None:
    # From a folder deleted under the shell, `m27 validate /abs/p.yaml` and `m27 run` said
    # `m27: [Errno 2] No such file or directory`, naming nothing.
    spec = tmp_path / "p.yaml"
    spec.write_text("name: p\nsteps:\n  - name: a\n    type: cpu\n    command: 'true'\n")
    gone = tmp_path / "gone"
    gone.mkdir()
    script = 'cd "$1" && rm -r "$1" && exec "$2" -m m27.cli validate "$3"'
    done = subprocess.run(
        ["sh", "-c", script, "sh", str(gone), sys.executable, str(spec)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stderr) == (
        2,
        "m27: the current folder was deleted: cd to one that exists\n",
    )


def _runs(home: Path) -> dict[str, object]:
    store = SqliteEventStore(home / "events.db")
    try:
        return dict(fold(store.read()).runs)
    finally:
        store.close()


def _run_m27(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "m27.cli", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_m27_run_against_a_lab_server_that_is_down_is_one_line(
    m27_home: Path, tmp_path: Path
) -> None:
    # Prefect's engine met it with a page of traceback, after the run was announced.
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/api"
    spec = tmp_path / "p.yaml"
    spec.write_text("pipeline:\n  - name: a\n    type: cpu\n    command: 'true'\n")
    done = _run_m27("run", str(spec), env={"PREFECT_API_URL": url})
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert done.stderr.splitlines()[-1] == (
        f"m27: cannot reach the Prefect server at {url} (PREFECT_API_URL): "
        "Connection refused; is it running?"
    )
    assert _runs(m27_home) == {}


def test_m27_run_against_a_server_that_is_not_prefect_is_one_line(
    m27_home: Path, tmp_path: Path
) -> None:
    # It answers (501 to everything), so it is reached; Prefect's engine then failed.
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/api"
        spec = tmp_path / "p.yaml"
        spec.write_text("pipeline:\n  - name: a\n    type: cpu\n    command: 'true'\n")
        done = _run_m27("run", str(spec), "--plain", env={"PREFECT_API_URL": url})
    finally:
        server.shutdown()
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith("m27: run ") and " did not start: Failed to reach API at " in last
    assert _runs(m27_home) == {}


def test_a_bug_in_a_command_is_one_line_naming_the_file_with_its_traceback(
    m27_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from m27.cli.commands import runs

    def broken(args: object) -> int:
        return undefined_name  # type: ignore[name-defined]  # noqa: F821

    monkeypatch.setattr(runs, "run", broken)
    assert main(["runs"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        "m27: internal error: NameError: name 'undefined_name' is not defined; this is a bug "
        "in m27 (its traceback is in "
    )
    assert "Traceback" not in err and len(err.splitlines()) == 1
    (saved,) = (m27_home / "errors").iterdir()
    assert str(saved) in err
    text = saved.read_text()
    assert text.startswith("m27 runs\n") and "in broken" in text and "NameError" in text


def test_a_bug_s_traceback_goes_to_the_temporary_folder_when_m27_home_cannot_hold_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from m27.cli.commands import runs

    home = tmp_path / "home"
    home.write_text("a file, not a folder")
    monkeypatch.setenv("M27_HOME", str(home))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setattr(runs, "run", lambda args: 1 / 0)
    assert main(["runs"]) == 1
    assert f"its traceback is in {tmp_path}/m27-error-" in capsys.readouterr().err
    assert list(tmp_path.glob("m27-error-*.txt"))
