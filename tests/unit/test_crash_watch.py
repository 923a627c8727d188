"""The node service's crash watcher closes a dead run in the log without Prefect."""

from __future__ import annotations

import socket
import subprocess
import threading
from pathlib import Path

from m27 import events as ev
from m27.events.state import fold
from m27.node.serve import _Watcher
from m27.store.sqlite import open_store


def test_a_dead_run_is_closed_in_the_log_before_prefect_is_asked(tmp_path: Path) -> None:
    """Prefect may not answer (restarting, its own disk full): the log is the truth, so the
    run is closed there first and only remembered for marking Crashed in Prefect."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    with open_store(tmp_path) as store:
        store.append(
            [
                ev.RunSubmitted(
                    at=1.0,
                    run_id="r",
                    pipeline="p",
                    spec_path="",
                    steps=("s",),
                    flow_run_id="00000000-0000-0000-0000-000000000001",
                    pid=gone.pid,
                    host=socket.gethostname(),
                )
            ]
        )
    lines: list[str] = []
    watcher = _Watcher(tmp_path, lines.append, threading.Event())
    watcher.close_dead()  # no Prefect server anywhere: nothing here may need one
    with open_store(tmp_path) as store:
        run = fold(store.read()).runs["r"]
    assert run.status == "failed" and run.reason.startswith("crashed"), run
    assert list(watcher.unmarked) == ["00000000-0000-0000-0000-000000000001"]
    assert any("crashed" in line for line in lines), lines
