"""A run's environment is kept (privately) for a resume that starts elsewhere: Telegram's
/resume runs in it, with the node's own settings (log, Prefect server, bot) its own."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from m27.executors import environ
from m27.executors.resume import run_environment


def test_a_run_environment_is_kept_private_and_read_back(
    m27_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    env = {
        "PATH": "/opt/gromacs/bin:/usr/bin",
        "OMP_NUM_THREADS": "8",
        "M27_HOME": str(m27_home),
        "PREFECT_API_URL": "http://127.0.0.1:4200/api",
        "M27_TELEGRAM_TOKEN": "123:secret",
    }
    assert environ.record(m27_home, "r1", env)
    path = m27_home / "runs" / "r1" / environ.ENVIRON_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it may hold secrets
    assert "123:secret" not in path.read_text()  # the bot's token is the bot's
    got = environ.recorded(m27_home, "r1")
    assert got is not None and got.cwd == str(tmp_path)
    assert got.env == {"PATH": "/opt/gromacs/bin:/usr/bin", "OMP_NUM_THREADS": "8"}
    # the resume: the run's own variables, the node's from the process that resumes
    bot = {"PATH": "/usr/bin", "M27_HOME": "/srv/m27", "PREFECT_API_URL": "http://lab/api"}
    assert environ.for_resume(got, bot) == {
        "PATH": "/opt/gromacs/bin:/usr/bin",
        "OMP_NUM_THREADS": "8",
        "M27_HOME": "/srv/m27",
        "PREFECT_API_URL": "http://lab/api",
    }


@pytest.mark.parametrize(
    "text",
    ["", "{", '{"env": {"A": 1}, "cwd": "/"}', '{"env": [], "cwd": "/"}', '{"cwd": "/"}', "[]"],
)
def test_a_torn_or_edited_record_reads_as_none(m27_home: Path, text: str) -> None:
    path = m27_home / "runs" / "r1" / environ.ENVIRON_NAME
    path.parent.mkdir(parents=True)
    path.write_text(text)
    assert environ.recorded(m27_home, "r1") is None
    assert environ.recorded(m27_home, "nosuchrun") is None


def test_a_record_that_cannot_be_written_leaves_the_run_going(m27_home: Path) -> None:
    (m27_home / "runs").write_text("not a folder")  # as a full disk or a bad home fails
    assert environ.record(m27_home, "r1", {"A": "1"}) is False
    assert environ.recorded(m27_home, "r1") is None


def test_a_run_started_in_a_deleted_folder_keeps_nothing_and_goes_on(
    m27_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "gone").mkdir()
    monkeypatch.chdir(tmp_path / "gone")
    os.rmdir(tmp_path / "gone")
    assert environ.record(m27_home, "r1", {"A": "1"}) is False
    assert environ.recorded(m27_home, "r1") is None


def test_the_bot_resumes_in_the_run_environment_or_says_it_uses_its_own(
    m27_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    environ.record(m27_home, "r1", {"PATH": "/opt/cp2k/bin", "M27_HOME": "/elsewhere"})
    bot = {"PATH": "/usr/bin", "M27_HOME": str(m27_home)}
    env, cwd, own = run_environment("r1", bot)
    assert env == {"PATH": "/opt/cp2k/bin", "M27_HOME": str(m27_home)}
    assert cwd == str(tmp_path) and own
    assert run_environment("../r1", bot)[0] == bot  # no run's id: the command says so
    env, cwd, own = run_environment("r2", bot)
    assert env == bot and cwd is None and not own  # the bot's reply says so
    # a folder gone since: the resume runs where the bot is (the spec's paths are its own)
    (tmp_path / "gone").mkdir()
    monkeypatch.chdir(tmp_path / "gone")
    environ.record(m27_home, "r3", {"PATH": "/opt/cp2k/bin"})
    monkeypatch.chdir(tmp_path)
    os.rmdir(tmp_path / "gone")
    assert run_environment("r3", bot)[1] is None


def test_a_resume_without_the_runs_programs_on_path_says_where_that_run_found_them(
    m27_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A resume from a fresh ssh session, without the `module load` of the shell that ran
    the pipeline: the note before it starts names the folder the run found the program in."""
    from m27 import events as ev
    from m27.cli.main import main
    from m27.store.sqlite import open_store

    tools = tmp_path / "modules" / "bin"
    tools.mkdir(parents=True)
    (tools / "lab-md").write_text("#!/bin/sh\nexit 0\n")
    (tools / "lab-md").chmod(0o755)
    spec = tmp_path / "p.yaml"
    spec.write_text("name: p\npipeline:\n  - {name: md, type: cpu, command: lab-md -v}\n")
    run = "20261207-030000-aaaa"
    store = open_store(m27_home)
    store.append(
        [
            ev.RunSubmitted(1.0, run, "p", str(spec), ("md",)),
            ev.RunCrashed(1.2, run, "process 4242 died"),
        ]
    )
    store.close()
    environ.record(m27_home, run, {"PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"})
    assert main(["run", "--resume", run, "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert (
        f"'lab-md' is not on PATH here; the step fails `command not found: lab-md` when it "
        f"starts, unless an earlier step installs it (run {run} found it at {tools}/lab-md: "
        f"put {tools} on PATH, as that run's shell had it, before resuming)"
    ) in err
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    assert main(["run", "--resume", run, "--dry-run"]) == 0
    assert "lab-md" not in capsys.readouterr().err  # on PATH now: nothing to say
