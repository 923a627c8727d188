"""A disk that fills up during `m27 run` (issue 15): one clear message and no traceback;
once space is back the next m27 command records the run crashed, with no step `running`.

The step itself fills `$M27_HOME` (a real 8 MiB tmpfs) to 64 KiB free, then prints, so the
step log, then the event log run out of space mid-run. Skips where a tmpfs cannot be
mounted, unless CI=true (then it fails).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e._helpers import M27, call_m27, node_state
from tests.services import small_tmpfs
from tests.waiting import wait_until

FILL = (
    "import os\n"
    "h = os.environ['M27_HOME']\n"
    "st = os.statvfs(h)\n"
    "open(h + '/filler', 'wb').write(b'\\0' * max(0, st.f_bavail * st.f_frsize - 65536))\n"
    "for i in range(2000): print('x' * 200, flush=True)\n"
)


@pytest.fixture
def full_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "home", "8m") as home:
        monkeypatch.setenv("M27_HOME", str(home))
        monkeypatch.setenv("M27_GPUS", "sim:1")
        try:
            yield home
        finally:
            call_m27("agent", "stop", timeout=60)  # the node service the run started


@pytest.mark.slow
def test_a_disk_filling_up_during_a_run_ends_it_truthfully(
    m27: M27, full_home: Path, tmp_path: Path
) -> None:
    spec = tmp_path / "fill.yaml"
    spec.write_text(
        "pipeline:\n"
        f"  - {{name: a, type: cpu, command: [python3, -c, {FILL!r}]}}\n"
        "  - {name: b, type: cpu, depends_on: [a], command: 'true'}\n"
    )
    done = m27("run", "--plain", "--quiet", str(spec), timeout=280)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert "m27: run " in done.stderr and "disk is full" in done.stderr, done.stderr[-2000:]
    # The step log's failure names the file; Prefect's own log worker, whose server could
    # not store the logs either, printed `--- Error logging to API ---` per batch.
    assert f"cannot write the step log {full_home}/runs/" in out, out[-3000:]
    assert "No space left on device; the step goes on" in out, out[-3000:]
    assert "Error logging to API" not in out, out[-3000:]
    # The node service lived through it: its agent keeps what it could not record instead
    # of ending (the service, and its Prefect server, stopped with it before)
    service = service_pid()
    (full_home / "filler").unlink()
    runs = m27("runs", timeout=120)  # the next command (the node service closes the run)
    assert runs.returncode == 0, runs.stderr

    def closed() -> bool:
        (run,) = node_state(full_home).runs.values()
        return run.status != "running"

    wait_until(closed, timeout=120)
    (run,) = node_state(full_home).runs.values()
    assert all(s.status != "running" for s in run.steps.values()), run.steps
    assert service_pid() == service, (full_home / "service.log").read_text()[-3000:]
    assert "ended unexpectedly" not in (full_home / "service.log").read_text()


def service_pid() -> int:
    status = call_m27("agent", "status", "--json", timeout=60)
    info = json.loads(status.stdout)
    assert info["running"] and info["state"] == "ready", status.stdout
    return int(info["pid"])
