"""kill -9 at any moment, or a full disk, leaves a restorable previous checkpoint."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from m27.checkpoint import Checkpointer
from m27.checkpoint._format import manifests, read_manifest

ROOT = Path(__file__).resolve().parents[2]
CHUNK = 1024

#: Shared by this test process and the children: the state saved at `step`.
EXPECTED = """
import numpy as np

def expected(step):
    x = np.arange(6000, dtype=np.int64)
    x[(step * 700) % 6000 : (step * 700) % 6000 + 500] = step  # a few chunks change per step
    return {"x": x, "e": np.full(10, step * 0.5), "step": step}
"""

#: Preloads everything once, then forks one saver per request. It waits (bounded) for the
#: saver to make two new checkpoints durable: so every round kills after at least one
#: durable save however loaded the machine is, and the time between the two is how long
#: one save takes right now. It then kills the saver with SIGKILL a random fraction of that
#: time later, i.e. somewhere inside the save in progress, whatever the machine's speed,
#: and prints the newest manifest it saw before the kill. No thread exists in this process
#: when it forks (the checkpointer lives in the child).
ZYGOTE = (
    EXPECTED
    + """
import glob, os, signal, sys, time
from m27.checkpoint import Checkpointer

directory = sys.argv[1]

def newest():
    names = sorted(glob.glob(os.path.join(directory, "ckpt-*.json")))
    return names[-1] if names else ""

def wait_for_newer(than):
    deadline = time.monotonic() + 120  # a bound for a broken saver, not a speed claim
    while newest() <= than and time.monotonic() < deadline:
        time.sleep(0.001)
    return newest() if newest() > than else None

for line in sys.stdin:
    fraction = float(line)
    before = newest()
    pid = os.fork()
    if pid == 0:
        try:
            ck = Checkpointer(directory, chunk_size=1024, keep_last=3, max_in_flight=2)
            got = ck.restore()
            step = got[1] if got else 0
            while True:
                step += 1
                ck.save(expected(step), step=step)
        finally:
            os._exit(1)
    first = wait_for_newer(before)
    began = time.monotonic()
    second = wait_for_newer(first) if first else None
    if second is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        print("no durable save in 120 s", flush=True)
        continue
    time.sleep(fraction * (time.monotonic() - began))
    seen = newest()
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    print("killed", os.path.basename(seen), flush=True)
"""
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("M27_RUN_ID", "M27_RESUME_FROM", "M27_CHECKPOINT_DIR", "M2_CHUNK_SIZE"):
        monkeypatch.delenv(name, raising=False)


def expected(step: int) -> dict[str, Any]:
    scope: dict[str, Any] = {}
    exec(EXPECTED, scope)
    result: dict[str, Any] = scope["expected"](step)
    return result


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_kill_9_at_random_moments_always_leaves_a_restorable_checkpoint(tmp_path: Path) -> None:
    """20 kills, each after at least one durable save, at a random moment of the next one.

    After each kill the newest manifest on disk is at least the one seen before the kill
    (a durable save is never lost), and it restores exactly (never torn: restore must not
    have to fall back to an older checkpoint).
    """
    directory = tmp_path / "ck"
    script = tmp_path / "zygote.py"
    script.write_text(ZYGOTE)
    rng = random.Random(27)
    zygote = subprocess.Popen(
        [sys.executable, str(script), str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    assert zygote.stdin is not None and zygote.stdout is not None
    steps = []
    try:
        for _ in range(20):
            zygote.stdin.write(f"{rng.random():.4f}\n")
            zygote.stdin.flush()
            said, _, seen = zygote.stdout.readline().strip().partition(" ")
            assert said == "killed", f"the saver made no checkpoint durable: {said} {seen}"
            newest = manifests(directory)[-1]
            assert newest.name >= seen, f"{seen} was durable before the kill, newest is {newest}"
            on_disk = int(read_manifest(newest)["sim_step"])
            with Checkpointer(directory, chunk_size=CHUNK, keep_last=3) as ck:
                got = ck.restore()
            assert got is not None, "a checkpoint that was durable was lost"
            state, step = got
            assert step == on_disk, f"{newest.name} (step {on_disk}) is torn: restored {step}"
            want = expected(step)
            assert state["step"] == step
            assert np.array_equal(state["x"], want["x"]) and np.array_equal(state["e"], want["e"])
            assert not steps or step > steps[-1], "a round made no durable save"
            steps.append(step)
    finally:
        zygote.stdin.close()
        zygote.wait(timeout=30)
    assert len(steps) == 20, steps


DISK_FULL = """
import resource, signal, sys
import numpy as np
from m27 import CheckpointError
from m27.checkpoint import Checkpointer

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
ck = Checkpointer(sys.argv[1], chunk_size=4096, compression_level=0)
small = np.arange(10_000, dtype=np.int64)          # 80 kB: fits
ck.save({"x": small, "note": "small"}, step=1)
ck.flush()
big = np.random.default_rng(0).integers(0, 2**62, 100_000)  # 800 kB: exceeds the limit
ck.save({"x": big, "note": "big"}, step=2)
try:
    ck.close()
except CheckpointError as exc:
    print("ERROR", exc)
    sys.exit(3)
sys.exit(0)
"""


def test_a_full_disk_gives_a_clear_error_and_keeps_the_previous_checkpoint(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "ck"
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(DISK_FULL), str(directory)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert "disk full or file size limit reached" in done.stdout
    assert "ckpt-0000000002.pack" in done.stdout
    assert "previous checkpoint is intact" in done.stdout
    assert sorted(p.name for p in directory.iterdir()) == [
        "ckpt-0000000001.json",
        "ckpt-0000000001.pack",
    ]
    with Checkpointer(directory, chunk_size=4096) as ck:
        got = ck.restore()
    assert got is not None
    state, step = got
    assert step == 1 and state["note"] == "small"
    assert np.array_equal(state["x"], np.arange(10_000, dtype=np.int64))


EXIT_WITHOUT_CLOSE = """
import atexit, sys, threading
import numpy as np
from m27.checkpoint import Checkpointer, _pack

real_commit = _pack.PackWriter.commit
exiting = threading.Event()

def slow_commit(self):
    exiting.wait()  # the disk does not finish a commit before the interpreter exits
    real_commit(self)

_pack.PackWriter.commit = slow_commit
ck = Checkpointer(sys.argv[1], chunk_size=1024, max_in_flight=3, keep_last=10)
atexit.register(exiting.set)  # atexit is LIFO: this runs before the checkpointer's hook
for step in range(1, 4):
    x = np.arange(6000, dtype=np.int64) * step
    ck.save({"x": x, "step": step}, step=step)
print("pending", len(list(__import__("pathlib").Path(sys.argv[1]).glob("*.json"))), flush=True)
# no close(), no flush(): the interpreter exits with the saves in flight
"""


def test_saves_pending_at_interpreter_exit_become_durable(tmp_path: Path) -> None:
    directory = tmp_path / "ck"
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(EXIT_WITHOUT_CLOSE), str(directory)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == ["pending", "0"], "the saves were meant to be in flight"
    assert sorted(p.name for p in directory.glob("*.json")) == [
        f"ckpt-{seq:010d}.json" for seq in (1, 2, 3)
    ]
    with Checkpointer(directory, chunk_size=1024) as ck:
        got = ck.restore()
    assert got is not None
    state, step = got
    assert step == 3 and state["step"] == 3
    assert np.array_equal(state["x"], np.arange(6000, dtype=np.int64) * 3)
