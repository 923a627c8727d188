"""`m27 exporter`: where it listens, and one scrape printed with --once."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pytest

from m27._exceptions import ConfigError
from m27.cli.commands import exporter as command
from m27.cli.main import main
from m27.monitoring.exporter import DEFAULT_LISTEN


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="m27")
    command.register(parser.add_subparsers())
    return parser.parse_args(["exporter", *argv])


def test_it_binds_localhost_unless_told_otherwise() -> None:
    assert parse().listen is None
    assert command.parse_listen(DEFAULT_LISTEN) == ("127.0.0.1", 9427)
    assert command.parse_listen(":9500") == ("127.0.0.1", 9500)
    assert command.parse_listen("0.0.0.0:9427") == ("0.0.0.0", 9427)
    assert command.parse_listen("[::1]:9427") == ("::1", 9427)


@pytest.mark.parametrize("bad", ["9427", "host:", "host:http", "h:0", "h:70000"])
def test_a_bad_listen_address_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="HOST:PORT"):
        command.parse_listen(bad)


def test_once_prints_one_scrape_of_the_nodes_gpus(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("M27_GPUS", "sim:3")
    args = parse("--once", "--node", "lab-1")
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert out.count("m27_gpu_utilization_ratio{") == 3
    assert 'node="lab-1"' in out
    assert 'm27_runs_total{outcome="failed"} 0.0' in out


@pytest.mark.parametrize("bad", ["-1", "nan", "inf", "7200", "often"])
def test_an_interval_that_is_not_a_sane_number_of_seconds_is_argparses_one_line(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # `inf` raised OverflowError from Event.wait (a traceback); `nan` waited not at all
    with pytest.raises(SystemExit) as stopped:
        parse("--interval", bad, "--once")
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "argument --interval: " in err and repr(bad) in err and "Traceback" not in err


def test_an_address_in_use_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("M27_GPUS", "sim:1")
    monkeypatch.setenv("M27_HOME", str(tmp_path))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["exporter", "--listen", f"127.0.0.1:{port}"]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"m27: cannot listen on 127.0.0.1:{port}: Address already in use "
        "(choose another address with --listen HOST:PORT)\n"
    )
