"""Helpers to drive the `m27` command as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from m27.events.state import NodeState, fold
from m27.store.sqlite import SqliteEventStore

ROOT = Path(__file__).resolve().parents[2]

M27 = Callable[..., subprocess.CompletedProcess[str]]


def m27_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def call_m27(
    *args: str, timeout: float = 120, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "m27.cli", *args],
        env=m27_env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def spawn_m27(*args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "m27.cli", *args],
        env=m27_env(),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def node_state(home: Path) -> NodeState:
    store = SqliteEventStore(home / "events.db")
    try:
        return fold(store.read())
    finally:
        store.close()
