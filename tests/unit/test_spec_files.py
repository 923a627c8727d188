"""What `m27 validate`/`m27 run` are given that is not a pipeline file: a FIFO (opening it
waited forever for a writer), `/dev/zero` (read until memory ran out), `<(generate.sh)`,
a file of gigabytes. Each is refused at once, naming what it is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from m27.spec import FILE_BYTES_MAX


def _validate(path: str) -> subprocess.CompletedProcess[str]:
    """In a process of its own, bounded: a regression hangs it, not the test session."""
    return subprocess.run(
        [sys.executable, "-m", "m27.cli", "validate", path],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        ("fifo", "it is a pipe; m27 reads a pipeline from a file (save it first)"),
        ("link-to-fifo", "it is a pipe; m27 reads a pipeline from a file (save it first)"),
        ("/dev/zero", "it is a device or a socket, not a pipeline file"),
        ("huge", f"it is larger than {FILE_BYTES_MAX // 2**20} MiB: not a pipeline file"),
    ],
)
def test_what_is_not_a_pipeline_file_is_refused_at_once(
    tmp_path: Path, make: str, reason: str
) -> None:
    path = tmp_path / "p.yaml"
    if make == "fifo":
        os.mkfifo(path)
    elif make == "link-to-fifo":
        os.mkfifo(tmp_path / "fifo")
        path.symlink_to(tmp_path / "fifo")
    elif make == "huge":
        with path.open("wb") as f:
            f.truncate(FILE_BYTES_MAX + 1)  # sparse: no disk used
    else:
        path = Path(make)
    done = _validate(str(path))
    assert done.returncode == 2
    assert done.stdout == f"{path}: cannot read the pipeline file: {reason}\n"
    assert "Traceback" not in done.stderr


def test_a_file_of_the_largest_size_is_read(tmp_path: Path) -> None:
    """The bound is on the file, not below it: a file of FILE_BYTES_MAX is parsed (and its
    own problem reported)."""
    path = tmp_path / "p.yaml"
    with path.open("wb") as f:
        f.truncate(FILE_BYTES_MAX)
    done = _validate(str(path))
    assert done.returncode == 2
    assert "cannot read the pipeline file" not in done.stdout
