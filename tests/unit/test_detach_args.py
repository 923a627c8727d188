"""`m27 run --detach`'s reading of its arguments, before argparse, and the run id the
waiting parent hands its child."""

from __future__ import annotations

import os

import pytest

from m27.cli import detach


@pytest.mark.parametrize(
    ("args", "rest"),
    [
        (["p.yaml", "--detach"], ["p.yaml"]),
        (["-d", "p.yaml", "--set", "N=3"], ["p.yaml", "--set", "N=3"]),
        (["--resume", "last", "--rerun", "ana", "-d"], ["--resume", "last", "--rerun", "ana"]),
        # a value of an option that takes one is not the flag
        (["p.yaml", "--set", "-d"], None),
        (["p.yaml", "--rerun", "--detach"], None),
        (["p.yaml", "--set=X=-d"], None),
        # after `--` everything is an argument; --help shows the help instead
        (["--", "-d"], None),
        (["-d", "--help"], None),
        (["p.yaml"], None),
    ],
)
def test_detach_is_read_where_argparse_would_read_it(
    args: list[str], rest: list[str] | None
) -> None:
    assert detach.detach_args(args) == rest


def test_the_given_run_id_leaves_the_environment_so_no_step_inherits_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(detach.RUN_ENV, "20261205-115416-e154")
    assert detach.given_run_id() == "20261205-115416-e154"
    assert detach.given_run_id() is None  # taken
    monkeypatch.setenv(detach.RUN_ENV, "../../etc")  # not a run id: a new one is made
    assert detach.given_run_id() is None
    assert detach.RUN_ENV not in os.environ
