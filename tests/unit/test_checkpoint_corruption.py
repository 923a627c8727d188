"""A torn, truncated or corrupt checkpoint is never restored: the previous good one is."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from m27 import CorruptCheckpointError
from m27.checkpoint import Checkpointer, latest_checkpoint, verify
from m27.checkpoint._format import decode_manifest, encode_manifest

CHUNK = 1024


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("M27_RUN_ID", "M27_RESUME_FROM", "M27_CHECKPOINT_DIR", "M2_CHUNK_SIZE"):
        monkeypatch.delenv(name, raising=False)


def versions() -> list[dict[str, Any]]:
    rng = np.random.default_rng(5)
    first = {"x": rng.integers(0, 2**62, 1536, dtype=np.int64), "z": np.zeros(3000), "e": 1.0}
    second = {"x": first["x"].copy(), "z": first["z"].copy(), "e": 2.0}
    second["x"][200:400] = 7  # chunks 1-3 of x change
    second["z"][2000] = 1.0  # one compressible chunk of z changes
    return [first, second]


def write_two(directory: Path) -> list[dict[str, Any]]:
    states = versions()
    with Checkpointer(directory, chunk_size=CHUNK, keep_last=10) as ck:
        for step, state in enumerate(states, start=1):
            ck.save(state, step=step)
    return states


def restored(directory: Path) -> tuple[dict[str, Any], int] | None:
    with Checkpointer(directory, chunk_size=CHUNK, keep_last=10) as ck:
        return ck.restore()


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(
        np.array_equal(a[k], b[k]) if isinstance(b[k], np.ndarray) else a[k] == b[k] for k in b
    )


def flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x5A
    path.write_bytes(bytes(data))


def positions(size: int, count: int = 24) -> list[int]:
    return sorted({0, size - 1, *np.linspace(0, size - 1, count).astype(int).tolist()})


def test_every_corrupted_byte_of_the_newest_manifest_falls_back_to_the_previous(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    states = write_two(tmp_path / "base")
    manifest = tmp_path / "base" / "ckpt-0000000002.json"
    size = manifest.stat().st_size
    for pos in positions(size, 40):
        directory = tmp_path / f"m{pos}"
        _copy(tmp_path / "base", directory)
        flip(directory / manifest.name, pos)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="m27.checkpoint"):
            got = restored(directory)
        assert got is not None and got[1] == 1, f"byte {pos} of {size}"
        assert same(got[0], states[0])
        assert str(directory / manifest.name) in caplog.text


def test_every_truncation_of_the_newest_manifest_falls_back_to_the_previous(tmp_path: Path) -> None:
    states = write_two(tmp_path / "base")
    manifest = tmp_path / "base" / "ckpt-0000000002.json"
    data = manifest.read_bytes()
    for cut in positions(len(data) - 2, 30):  # -2: a lost trailing newline is harmless
        directory = tmp_path / f"t{cut}"
        _copy(tmp_path / "base", directory)
        (directory / manifest.name).write_bytes(data[:cut])
        got = restored(directory)
        assert got is not None and got[1] == 1 and same(got[0], states[0]), f"cut at {cut}"


def test_every_corrupted_or_truncated_position_of_the_newest_pack_falls_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    states = write_two(tmp_path / "base")
    pack = tmp_path / "base" / "ckpt-0000000002.pack"
    data = pack.read_bytes()
    for pos in positions(len(data), 30):
        for how in ("flip", "cut"):
            directory = tmp_path / f"{how}{pos}"
            _copy(tmp_path / "base", directory)
            if how == "flip":
                flip(directory / pack.name, pos)
            else:
                (directory / pack.name).write_bytes(data[:pos])
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="m27.checkpoint"):
                got = restored(directory)
            assert got is not None and got[1] == 1 and same(got[0], states[0]), (how, pos)
            assert str(directory / pack.name) in caplog.text


def test_corruption_of_an_older_pack_never_yields_wrong_data(tmp_path: Path) -> None:
    states = write_two(tmp_path / "base")
    pack = tmp_path / "base" / "ckpt-0000000001.pack"
    size = pack.stat().st_size
    outcomes = set()
    for pos in positions(size, 40):
        directory = tmp_path / f"o{pos}"
        _copy(tmp_path / "base", directory)
        flip(directory / pack.name, pos)
        got = restored(directory)
        if got is None:
            outcomes.add("none")
            continue
        assert same(got[0], states[got[1] - 1]), f"byte {pos}"
        outcomes.add(str(got[1]))
    # Bytes of chunks that save 2 rewrote leave save 2 intact; shared chunks break both.
    assert outcomes == {"none", "2"}


def test_a_missing_pack_makes_its_checkpoints_invalid(tmp_path: Path) -> None:
    write_two(tmp_path)
    (tmp_path / "ckpt-0000000002.pack").unlink()
    assert latest_checkpoint(tmp_path) == tmp_path / "ckpt-0000000001.json"
    (tmp_path / "ckpt-0000000001.pack").unlink()
    assert latest_checkpoint(tmp_path) is None
    assert restored(tmp_path) is None


def test_latest_checkpoint_skips_a_truncated_pack_cheaply(tmp_path: Path) -> None:
    write_two(tmp_path)
    pack = tmp_path / "ckpt-0000000002.pack"
    pack.write_bytes(pack.read_bytes()[:-1])
    assert latest_checkpoint(tmp_path) == tmp_path / "ckpt-0000000001.json"


def test_verify_names_the_corrupt_pack(tmp_path: Path) -> None:
    write_two(tmp_path)
    assert verify(tmp_path / "ckpt-0000000002.json")["sim_step"] == 2
    flip(tmp_path / "ckpt-0000000002.pack", 10)
    with pytest.raises(CorruptCheckpointError) as info:
        verify(tmp_path / "ckpt-0000000002.json")
    assert info.value.context["file"] == str(tmp_path / "ckpt-0000000002.pack")


def test_resume_from_a_corrupt_path_falls_back_to_an_older_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    states = write_two(tmp_path)
    flip(tmp_path / "ckpt-0000000002.json", 50)
    monkeypatch.setenv("M27_RESUME_FROM", str(tmp_path / "ckpt-0000000002.json"))
    got = restored(tmp_path / "elsewhere")
    assert got is not None and got[1] == 1 and same(got[0], states[0])


def _copy(src: Path, dst: Path) -> None:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())


def _rewrite(manifest: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """`manifest` with `change` made to its body and its hash made right again: what no
    save writes, yet what the hash check alone lets through."""
    body = decode_manifest(manifest.read_bytes(), manifest)
    change(body)
    manifest.write_bytes(encode_manifest(body))


def _set(where: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A change to `where` (`time`, `arrays`, `arrays.x.dtype`, ...) of a manifest body."""

    def change(body: dict[str, Any]) -> None:
        *path, last = where.split(".")
        node = body
        for key in path:
            node = node[key]
        node[last] = value

    return change


MALFORMED = {
    "arrays-a-list": _set("arrays", [1, 2]),
    "time-text": _set("time", "x"),
    "pack-name": _set("packs", {"../x": 10}),
    "object-dtype": _set("arrays.x.dtype", "|O"),
    "negative-shape": _set("arrays.x.shape", [-5]),
    "chunk-ref-text": _set("arrays.x.chunks", ["a"] * 12),
    "order-names-nothing": _set("order", ["nothing"]),
}


@pytest.mark.parametrize("change", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_rehashed_manifest_of_a_malformed_body_is_corrupt_and_the_previous_restores(
    tmp_path: Path, change: Callable[[dict[str, Any]], None]
) -> None:
    # `verify` stopped on a TypeError or called it ok, a restore died on an AttributeError
    states = write_two(tmp_path)
    newest = tmp_path / "ckpt-0000000002.json"
    _rewrite(newest, change)
    with pytest.raises(CorruptCheckpointError) as info:
        verify(newest)
    assert info.value.context["file"] == str(newest)
    got = restored(tmp_path)
    assert got is not None and got[1] == 1 and same(got[0], states[0])


def test_a_pack_replaced_by_a_folder_is_named_and_the_previous_restores(tmp_path: Path) -> None:
    states = write_two(tmp_path)
    pack = tmp_path / "ckpt-0000000002.pack"
    pack.unlink()
    pack.mkdir()
    with pytest.raises(CorruptCheckpointError) as info:
        verify(tmp_path / "ckpt-0000000002.json")
    assert str(pack) in str(info.value)
    got = restored(tmp_path)
    assert got is not None and got[1] == 1 and same(got[0], states[0])
