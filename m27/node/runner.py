"""The node's warm runner process: started, watched and stopped by the node service.

The runner (``python -m m27.cli --warm-runner HOME PID``, :mod:`m27.cli.warm`) has imported
Prefect and the flow once and forks a child per `m27 run`, so a run on a node whose
service is up does not pay those imports. The service starts it once its Prefect server
answers (the runner's Prefect settings must name that server), starts it again when it
dies, and stops it with the service; like the Prefect server it gets SIGTERM from the
kernel when the service dies (``PR_SET_PDEATHSIG``). Runs already forked are not its
children's business once it is gone: they end as they would have.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from m27.node.prefect_server import _die_with_parent, terminate

__all__ = ["WarmRunner"]

LOG_NAME = "runner.log"
#: A runner that dies younger than this is started again only this long after its start
#: (a runner that cannot start must not cost a core in a restart loop).
RESTART_AFTER_S = 30.0


class WarmRunner:
    """One warm runner for `home`, its output in ``$M27_HOME/runner.log``."""

    def __init__(self, home: Path, api_url: str, log: Callable[[str], None] = print) -> None:
        self.home = Path(home)
        self.api_url = api_url
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.started = 0.0

    def start(self) -> None:
        self.started = time.monotonic()
        argv = [sys.executable, "-m", "m27.cli", "--warm-runner", str(self.home), str(os.getpid())]
        env = {**os.environ, "PREFECT_API_URL": self.api_url}
        with (self.home / LOG_NAME).open("ab") as out:
            self.proc = subprocess.Popen(
                argv,
                env=env,
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )

    def check(self) -> None:
        """Start it again when it has died (runs fall back to their own process meanwhile)."""
        if self.proc is not None and self.proc.poll() is not None:
            if time.monotonic() - self.started < RESTART_AFTER_S:
                return
            self.restarts += 1
            self.log(f"m27 agent: warm runner exited (code {self.proc.returncode}); restarting it")
            self.start()

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        terminate(proc, timeout)
