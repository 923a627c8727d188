"""What every service fixture needs: a free port, waiting for health, the CI rule, and
whether the machine has an NVIDIA GPU (for the ``gpu`` tests).

Under ``CI=true`` a service that cannot start fails the run; elsewhere its tests are
skipped with the reason (a developer box without Slurm, say).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, NoReturn

import pytest


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(reason)
    pytest.skip(reason)


def need_program(program: str, what: str, install: str) -> None:
    """At the top of a module whose tests run a real engine (`gmx`, `lmp`): without it the
    module is skipped, or with CI=true, which installs every one
    (infra/scripts/install-services.sh), the run fails."""
    if shutil.which(program) is None:
        _missing(f"{program} ({what}) is not installed: {install}")


def need_module(module: str, what: str, install: str) -> None:
    """The same for an engine that is a Python library (`openmm`, in the test extra where
    PyPI has a wheel for the machine)."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        _missing(f"the Python module {module} ({what}) is not installed: {install}")


def _missing(reason: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        raise RuntimeError(f"{reason} (required with CI=true)")
    pytest.skip(reason, allow_module_level=True)


#: Ports handed out by free_port come from below the kernel's ephemeral range (32768+ on
#: Linux), so no `bind(0)` and no outgoing connection on the machine can take one between
#: the check and the service's own bind.
_PORTS = range(20000, 32000)
_RESERVED_DIR = Path(tempfile.gettempdir()) / "m27-test-ports"
#: Lock files held for the life of this process: other test processes skip these ports.
_held: list[IO[str]] = []


def nvidia_gpu_present() -> bool:
    """True when this machine has an NVIDIA GPU: a device node, or nvidia-smi listing one.

    Decided without CuPy or NVML, so that a broken library cannot make a GPU machine look
    like one without a GPU.
    """
    if any(Path("/dev").glob("nvidia[0-9]*")):
        return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def no_gpu(reason: str) -> NoReturn:
    """For `gpu` tests: skip where there is no NVIDIA GPU; fail where there is one, since
    then `reason` (CuPy or NVML not loading, no device seen) is a broken install."""
    if nvidia_gpu_present():
        pytest.fail(f"an NVIDIA GPU is present, but {reason}")
    pytest.skip(f"no NVIDIA GPU here ({reason})")


def free_port() -> int:
    """A localhost port reserved for this test process until it exits.

    Binding port 0, closing and handing the number to a service leaves a gap in which
    anything else may take the port. Here the port is outside the ephemeral range, and an
    exclusive lock file per port keeps concurrent pytest processes (several engineers, or
    xdist workers) from picking the same one; the bind check skips ports in use by others.
    """
    _RESERVED_DIR.mkdir(exist_ok=True)
    start = random.randrange(len(_PORTS))
    for i in range(len(_PORTS)):
        port = _PORTS[(start + i) % len(_PORTS)]
        lock = open(_RESERVED_DIR / f"{port}.lock", "a")  # noqa: SIM115 - held until exit
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                lock.close()
                continue
        _held.append(lock)
        return port
    raise RuntimeError(f"no free port in {_PORTS.start}-{_PORTS.stop - 1}")


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """True once `url` answers 200; False if `proc` exits or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def start_prefect_server(
    home: Path, port: int, env: Mapping[str, str], log: IO[bytes]
) -> subprocess.Popen[bytes]:
    """`prefect server start` on 127.0.0.1:`port`, offline and without its UI."""
    full = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        **env,
    }
    full.pop("PREFECT_API_URL", None)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prefect",
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env=full,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `where` (a small disk to fill), unmounted afterwards.

    Mounting needs root, which CI has: there a failed mount fails the test."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        unavailable(f"cannot mount a tmpfs: {done.stderr.strip() or done.returncode}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
