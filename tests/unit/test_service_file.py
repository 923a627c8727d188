"""`service.json` as a command reads it: anything but what a service writes is no
service. A command must not trust, wait on or signal a process the file merely names."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from m27 import liveness
from m27.cli.main import main
from m27.node.info import find_service, read_info


def _written(pid: int, **changed: object) -> dict[str, object]:
    info: dict[str, object] = {
        "pid": pid,
        "pid_started": liveness.start_time(pid),
        "started_at": 1.0,
        "url": "http://127.0.0.1:1/api",
        "own_server": True,
        "port": 1,
        "prefect_pid": None,
        "state": "ready",
    }
    return {**info, **changed}


@pytest.mark.parametrize(
    "content",
    [
        [1, 2, 3],
        {"pid": "123"},
        {"pid": 1.5e300},
        "just text",
        None,
    ],
    ids=["a-list", "pid-text", "pid-huge", "a-string", "null"],
)
def test_json_of_another_shape_is_no_service_and_no_internal_error(
    m27_home: Path, capsys: pytest.CaptureFixture[str], content: object
) -> None:
    (m27_home / "service.json").write_text(json.dumps(content))
    assert read_info(m27_home) is None
    assert main(["agent", "status"]) == 1
    out, err = capsys.readouterr()
    assert "internal error" not in out + err and "no node service runs" in out + err


def test_an_unrelated_process_named_without_its_start_time_is_neither_trusted_nor_killed(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stranger = subprocess.Popen(["sleep", "300"])
    try:
        path = m27_home / "service.json"
        path.write_text(json.dumps(_written(stranger.pid, pid_started=None)))
        assert find_service(m27_home) is None  # `m27 run` waited on it as a service
        assert main(["agent", "stop"]) == 0
        assert "no node service runs" in capsys.readouterr().out
        assert stranger.poll() is None  # `m27 agent stop` killed it
        # with the start time it had, it would be the service: the check is the start time
        path.write_text(json.dumps(_written(stranger.pid)))
        assert find_service(m27_home) is not None
    finally:
        path.unlink()
        stranger.kill()
        stranger.wait()


def test_a_file_a_service_writes_reads_back(m27_home: Path) -> None:
    (m27_home / "service.json").write_text(json.dumps(_written(os.getpid())))
    try:
        info = read_info(m27_home)
        assert info is not None and info.pid == os.getpid() and info.state == "ready"
    finally:  # or the fixture's teardown stops "the service": this test process
        (m27_home / "service.json").unlink()
