"""Keep-last-N retention, garbage collection of packs, and the `m27 checkpoints` command."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from m27.checkpoint import Checkpointer, collect_garbage, latest_checkpoint, prune, scan
from m27.cli import main
from m27.events import CheckpointWritten
from m27.store.memory import MemoryEventStore

CHUNK = 1024


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("M27_RUN_ID", "M27_RESUME_FROM", "M27_CHECKPOINT_DIR", "M2_CHUNK_SIZE"):
        monkeypatch.delenv(name, raising=False)


def states(n: int) -> list[dict[str, Any]]:
    x = np.random.default_rng(3).integers(0, 2**62, 16 * CHUNK // 8)  # 16 chunks
    out = []
    for step in range(1, n + 1):
        x = x.copy()
        x[(step % 8) * 128] = -step  # chunk step % 8 changes; chunks 8-15 never do
        out.append({"x": x, "step": step})
    return out


def names(directory: Path, suffix: str) -> list[int]:
    return sorted(int(p.name[5:15]) for p in directory.glob(f"ckpt-*.{suffix}"))


def test_only_the_last_n_checkpoints_are_kept_and_their_packs_survive(tmp_path: Path) -> None:
    saved = states(12)
    with Checkpointer(tmp_path, chunk_size=CHUNK, keep_last=3) as ck:
        for s in saved:
            ck.save(s, step=s["step"])
    assert names(tmp_path, "json") == [10, 11, 12]
    # Pack 1 holds the chunks no later save rewrote; it must outlive manifest 1.
    assert 1 in names(tmp_path, "pack")
    assert all(p.valid for p in scan(tmp_path))
    for manifest in tmp_path.glob("*.json"):
        body = json.loads(manifest.read_bytes())["body"]
        assert {int(k) for k in body["packs"]} <= set(names(tmp_path, "pack"))
    with Checkpointer(tmp_path, chunk_size=CHUNK, keep_last=3) as ck:
        got = ck.restore()
    assert got is not None and got[1] == 12 and np.array_equal(got[0]["x"], saved[-1]["x"])


def test_gc_removes_unreferenced_packs_and_crash_leftovers_only(tmp_path: Path) -> None:
    x = np.random.default_rng(4).integers(0, 2**62, 4 * CHUNK // 8)
    with Checkpointer(tmp_path, chunk_size=CHUNK, keep_last=100) as ck:
        for step in range(1, 5):
            x[0] = -step  # only chunk 0 changes: each pack after the first is superseded
            ck.save({"x": x}, step=step)
    (tmp_path / "ckpt-0000000002.json").unlink()  # pack 2 now unreferenced
    (tmp_path / ".ckpt-0000000001.json.tmp").write_bytes(b"torn")  # an old crash's leftover
    (tmp_path / "ckpt-0000000009.pack").write_bytes(b"in flight")  # a save being written now
    removed = collect_garbage(tmp_path)
    assert sorted(p.name for p in removed) == [".ckpt-0000000001.json.tmp", "ckpt-0000000002.pack"]
    assert (tmp_path / "ckpt-0000000009.pack").exists()
    assert latest_checkpoint(tmp_path) == tmp_path / "ckpt-0000000004.json"


def test_prune_counts_only_valid_checkpoints(tmp_path: Path) -> None:
    with Checkpointer(tmp_path, chunk_size=CHUNK, keep_last=100) as ck:
        for s in states(5):
            ck.save(s, step=s["step"])
    newest = tmp_path / "ckpt-0000000005.json"
    newest.write_bytes(newest.read_bytes()[:-20])  # corrupt: does not count as one to keep
    prune(tmp_path, keep_last=2)
    assert names(tmp_path, "json") == [3, 4, 5]
    with pytest.raises(Exception, match="keep_last"):
        prune(tmp_path, keep_last=0)


@pytest.fixture
def run_dir(m27_home: Path) -> Path:
    directory = m27_home / "checkpoints" / "20260101-000000-abcd" / "md_simulation"
    with Checkpointer(directory, chunk_size=CHUNK, keep_last=100) as ck:
        for s in states(4):
            ck.save(s, step=s["step"] * 100)
    return directory


def test_cli_lists_checkpoints_with_step_bytes_and_change(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["checkpoints", "20260101", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["sim_step"] for r in rows] == [100, 200, 300, 400]
    assert rows[0]["percent_changed"] == 100.0
    assert rows[1]["percent_changed"] == pytest.approx(6.25)
    assert rows[1]["bytes_written"] < rows[0]["bytes_written"]
    assert all(r["valid"] and r["step"] == "md_simulation" for r in rows)
    assert main(["checkpoints", "last", "md_simulation"]) == 0
    text = capsys.readouterr().out
    assert "md_simulation" in text and "6.2%" in text
    assert text.splitlines()[0].split()[-1] == "MANIFEST" and text.splitlines()[1].endswith("ok")


def test_cli_lists_the_bytes_the_run_log_said_were_written(
    m27_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the run's log line (`checkpoint at step 2 (481B written, ...)`) counts the manifest
    # with the packs; the listing said 0B for the same unchanged save
    monkeypatch.setenv("M27_RUN_ID", "20260101-000000-abcd")
    monkeypatch.setenv("M27_STEP", "s1")
    store = MemoryEventStore()
    directory = m27_home / "checkpoints" / "20260101-000000-abcd" / "s1"
    with Checkpointer(directory, chunk_size=CHUNK, store=store) as ck:
        ck.save({"x": np.zeros(10)}, step=1)
        ck.save({"x": np.zeros(10)}, step=2)  # nothing changed: only a manifest
    logged = [r.event.bytes_written for r in store.read() if isinstance(r.event, CheckpointWritten)]
    assert main(["checkpoints", "20260101", "--json"]) == 0
    listed = [r["bytes_written"] for r in json.loads(capsys.readouterr().out)]
    assert listed == logged and listed[1] > 0


def test_cli_lists_verifies_and_prunes_the_files_a_program_checkpoints_itself(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the runner keeps captures of a program's own files (a GROMACS .cpt) in STEP/files
    captures = run_dir / "files"
    with Checkpointer(captures, chunk_size=CHUNK, keep_last=100) as ck:
        for s in states(3):
            ck.save(s, step=s["step"])
    assert main(["checkpoints", "20260101", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    # captures count themselves (`#`); the program's MD step is its own, not known here
    assert [(r["step"], r["seq"], r["sim_step"]) for r in rows[-3:]] == [
        ("md_simulation/files", 1, None),
        ("md_simulation/files", 2, None),
        ("md_simulation/files", 3, None),
    ]
    assert main(["checkpoints", "20260101", "md_simulation/files", "--json"]) == 0
    assert [r["step"] for r in json.loads(capsys.readouterr().out)] == ["md_simulation/files"] * 3
    assert main(["checkpoints", "20260101", "md_simulation/other"]) == 2
    assert "has no checkpoints for step 'md_simulation/other'" in capsys.readouterr().err
    assert main(["checkpoints", str(captures)]) == 0
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[:2] == ["files", "1"] and row[4] == "-"  # STEP # DATE TIME SIM-STEP
    assert main(["checkpoints", "20260101", "md_simulation", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 4 + 3
    pack = sorted(captures.glob("ckpt-*.pack"))[-1]
    pack.write_bytes(b"\0" * pack.stat().st_size)
    assert main(["checkpoints", "verify", "20260101"]) == 1
    assert pack.name in capsys.readouterr().out
    assert main(["checkpoints", "gc", "20260101", "--keep", "1"]) == 0
    assert len(names(captures, "json")) < 3


def test_cli_verify_exits_1_naming_the_corrupt_file(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["checkpoints", "verify", "20260101"]) == 0
    assert "4 ok, 0 corrupt" in capsys.readouterr().out
    pack = run_dir / "ckpt-0000000003.pack"
    data = bytearray(pack.read_bytes())
    data[5] ^= 1
    pack.write_bytes(bytes(data))
    assert main(["checkpoints", "verify", "20260101", "md_simulation"]) == 1
    out = capsys.readouterr().out
    # Save 4 still points at the chunk of pack 3 it did not rewrite: both are corrupt.
    assert f"CORRUPT  {run_dir / 'ckpt-0000000003.json'}: pack {pack}" in out
    assert f"CORRUPT  {run_dir / 'ckpt-0000000004.json'}: pack {pack}" in out
    assert "2 ok, 2 corrupt" in out


def test_cli_gc_keeps_the_newest_n(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoints", "gc", "20260101", "--keep", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    removed = {Path(r["path"]).name for r in out["removed"]}
    assert {"ckpt-0000000001.json", "ckpt-0000000003.json"} <= removed
    assert out["corrupt"] == []
    assert names(run_dir, "json") == [4]
    with Checkpointer(run_dir, chunk_size=CHUNK) as ck:
        got = ck.restore()
    assert got is not None and got[1] == 400


def test_cli_gc_does_not_count_a_corrupt_checkpoint_toward_keep(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A damaged newest pack: gc --keep 1 used to keep only that checkpoint and delete the
    intact one a restore falls back to, leaving nothing to resume from."""
    pack = run_dir / "ckpt-0000000004.pack"
    data = bytearray(pack.read_bytes())
    data[-3] ^= 0xFF
    pack.write_bytes(bytes(data))
    assert main(["checkpoints", "gc", "20260101", "--keep", "1"]) == 0
    out = capsys.readouterr().out
    assert f"corrupt  {run_dir / 'ckpt-0000000004.json'}: " in out
    assert "(not counted toward --keep 1)" in out
    assert f"removed  {run_dir / 'ckpt-0000000002.json'}" in out
    assert "1 corrupt checkpoint(s) left in place" in out
    assert names(run_dir, "json") == [3, 4]
    with Checkpointer(run_dir, chunk_size=CHUNK) as ck:
        got = ck.restore()
    assert got is not None and got[1] == 300  # the intact one, as before gc


def test_cli_rejects_unknown_runs_and_steps(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["checkpoints", "nosuchrun"]) == 2
    assert main(["checkpoints", "20260101", "nosuchstep"]) == 2
    assert "nosuchstep" in capsys.readouterr().err


def test_cli_accepts_a_checkpoint_directory(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["checkpoints", "verify", str(run_dir)]) == 0
    assert "4 ok" in capsys.readouterr().out


def test_cli_verify_says_each_result_as_it_reads_it(
    run_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's checkpoints of tens of GiB take minutes to read: nothing was printed until
    every one had been read. Each result now comes as soon as it is known, and a terminal
    sees which checkpoint is being read."""
    from m27.cli.commands import checkpoints

    before: list[str] = []  # what had been printed when each checkpoint began to be read
    real = checkpoints.verify

    def spy(path: Path) -> object:
        before.append(capsys.readouterr().out)
        return real(path)

    monkeypatch.setattr(checkpoints, "verify", spy)
    assert main(["checkpoints", "verify", "20260101"]) == 0
    assert len(before) == 4 and before[0] == ""
    assert [b.split()[0] for b in before[1:]] == ["ok"] * 3
    assert before[1].strip().endswith("ckpt-0000000001.json")

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    shown = Terminal()
    monkeypatch.setattr(sys, "stdout", shown)
    assert main(["checkpoints", "verify", "20260101"]) == 0
    first = shown.getvalue().split("\r")[0]
    assert first.startswith("checking ") and first.endswith(
        "ckpt-0000000001.json (state 16.0KiB)..."
    )
    assert "\r\x1b[2Kok       " in shown.getvalue()  # the result over the `checking` line


def test_cli_verify_without_a_run_says_what_it_needs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoints", "verify"]) == 2
    err = capsys.readouterr().err
    assert "`m27 checkpoints verify RUN [STEP]`" in err and "m27 runs" in err
    assert "no run matches" not in err


def test_the_background_prune_parses_each_manifest_once_and_rereads_a_replaced_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from m27.checkpoint import _retention

    real_read = _retention.read_manifest
    reads: list[str] = []

    def counting_read(path: Path) -> dict[str, Any]:
        reads.append(path.name)
        return real_read(path)

    monkeypatch.setattr(_retention, "read_manifest", counting_read)
    with Checkpointer(tmp_path, chunk_size=CHUNK, keep_last=2) as ck:
        for state in states(6):
            ck.save(state, step=state["step"])
            ck.flush()
            ck._retention.wait_idle()  # each prune runs alone: every one is counted
    assert len(names(tmp_path, "json")) == 2
    assert sorted(reads) == sorted(set(reads)), f"a manifest was parsed twice: {reads}"
    assert len(reads) == 6

    # A manifest replaced under the same name (new inode) is read again, not taken from
    # the cache; an unchanged one is not.
    cache = _retention.ManifestCache()
    older, newer = sorted(tmp_path.glob("ckpt-*.json"))
    reads.clear()
    assert cache.info(newer).seq == cache.info(newer).seq == int(newer.name[5:15])
    assert reads == [newer.name], "the second look must come from the cache"
    copy = tmp_path / ".replacement"
    copy.write_bytes(older.read_bytes())
    copy.replace(newer)
    assert cache.info(newer).seq == int(older.name[5:15])
    assert reads == [newer.name, newer.name]


def test_cli_takes_a_matrix_entry_s_name_for_the_checkpoints_of_each_step_it_made(
    m27_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = m27_home / "checkpoints" / "20260101-000000-abcd"
    for seed in ("1", "2"):
        with Checkpointer(run / f"md.{seed}" / "files", chunk_size=CHUNK) as ck:
            ck.save(states(1)[0], step=0)
    with Checkpointer(run / "mdx", chunk_size=CHUNK) as ck:  # another step: not md's
        ck.save(states(1)[0], step=0)
    assert main(["checkpoints", "20260101", "md", "--json"]) == 0
    assert [r["step"] for r in json.loads(capsys.readouterr().out)] == ["md.1/files", "md.2/files"]
    assert main(["checkpoints", "verify", "20260101", "md"]) == 0
    assert capsys.readouterr().out.endswith("2 ok, 0 corrupt\n")
    assert main(["checkpoints", "20260101", "m"]) == 2
    assert "has no checkpoints for step 'm'" in capsys.readouterr().err
