"""The node's Prefect server dies with the node service, even after `kill -9` of the service:
its child asks the kernel for SIGTERM when its parent ends (Linux PR_SET_PDEATHSIG)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from m27 import liveness
from tests.e2e._helpers import m27_env
from tests.waiting import wait_until

PARENT = """
import subprocess, sys, time
from m27.node.prefect_server import _die_with_parent
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                         preexec_fn=_die_with_parent)
print(child.pid, flush=True)
time.sleep(300)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux only")
def test_the_server_process_ends_when_its_parent_is_killed_9() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], env=m27_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert liveness.alive(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(30)
        wait_until(lambda: not liveness.alive(child), timeout=30, what="the child to end")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
