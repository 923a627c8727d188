"""Checkpoints give back exactly what was saved: every dtype, shape, view and value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from m27 import CheckpointError
from m27.checkpoint import Checkpointer

CHUNK = 256


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("M27_RUN_ID", "M27_RESUME_FROM", "M27_CHECKPOINT_DIR", "M2_CHUNK_SIZE"):
        monkeypatch.delenv(name, raising=False)


def roundtrip(directory: Path, state: dict[str, Any], step: int = 7) -> dict[str, Any]:
    with Checkpointer(directory, chunk_size=CHUNK) as ck:
        ck.save(state, step=step)
    with Checkpointer(directory, chunk_size=CHUNK) as ck:
        got = ck.restore()
    assert got is not None
    restored, restored_step = got
    assert restored_step == step
    return restored


def assert_same(restored: Any, original: Any) -> None:
    if isinstance(original, np.ndarray):
        assert isinstance(restored, np.ndarray)
        assert restored.dtype == original.dtype
        assert restored.shape == original.shape
        assert restored.tobytes() == np.ascontiguousarray(original).tobytes()
    else:
        assert type(restored) is type(original)
        assert restored == original


DTYPES = st.one_of(
    hnp.boolean_dtypes(),
    hnp.integer_dtypes(endianness="="),
    hnp.unsigned_integer_dtypes(endianness="="),
    hnp.floating_dtypes(endianness="=", sizes=(16, 32, 64)),
    hnp.complex_number_dtypes(endianness="="),
    hnp.datetime64_dtypes(endianness="="),
    hnp.byte_string_dtypes(max_len=5),
    hnp.unicode_string_dtypes(max_len=3),
    hnp.integer_dtypes(endianness=">"),
    hnp.floating_dtypes(endianness=">", sizes=(32, 64)),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    array=hnp.arrays(DTYPES, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=9)),
)
def test_any_dtype_and_shape_round_trips(
    tmp_path_factory: pytest.TempPathFactory, array: Any
) -> None:
    directory = tmp_path_factory.mktemp("rt")
    restored = roundtrip(directory, {"a": array})
    assert_same(restored["a"], array)


@settings(max_examples=30, deadline=None)
@given(
    data=st.data(),
    array=hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=40)),
)
def test_non_contiguous_views_round_trip_as_their_values(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, array: Any
) -> None:
    slices = tuple(
        slice(
            data.draw(st.integers(0, n - 1)),
            None,
            data.draw(st.sampled_from([1, 2, 3, -1])),
        )
        for n in array.shape
    )
    view = array[slices].T
    directory = tmp_path_factory.mktemp("views")
    restored = roundtrip(directory, {"view": view})
    assert_same(restored["view"], view)
    assert restored["view"].flags.c_contiguous


def test_fortran_order_and_strided_arrays_round_trip(tmp_path: Path) -> None:
    base = np.arange(5000, dtype=np.float64).reshape(50, 100)
    state = {"f": np.asfortranarray(base), "strided": base[::3, 1::7], "neg": base[::-1]}
    restored = roundtrip(tmp_path, state)
    for name, value in state.items():
        assert_same(restored[name], value)


def test_structured_dtype_round_trips(tmp_path: Path) -> None:
    dtype = np.dtype([("id", "<i4"), ("pos", ">f8", (3,)), ("tag", [("c", "S2"), ("ok", "?")])])
    array = np.zeros(300, dtype=dtype)
    array["id"] = np.arange(300)
    array["pos"] = np.arange(900).reshape(300, 3) * 0.5
    array["tag"]["c"] = b"xy"
    array["tag"]["ok"][::2] = True
    restored = roundtrip(tmp_path, {"atoms": array})
    assert restored["atoms"].dtype == dtype
    assert restored["atoms"].tobytes() == array.tobytes()


def test_zero_dim_empty_and_multi_chunk_arrays_round_trip(tmp_path: Path) -> None:
    state = {
        "zero_d": np.array(3.25),
        "empty": np.empty((0, 5), dtype=np.int16),
        "big": np.random.default_rng(1).random(10 * CHUNK + 13),
        "bools": np.random.default_rng(2).random(1001) > 0.5,
        "complex": np.arange(77, dtype=np.complex64) * (1 + 2j),
    }
    restored = roundtrip(tmp_path, state)
    for name, value in state.items():
        assert_same(restored[name], value)


def test_numpy_scalars_come_back_as_numpy_scalars_of_their_dtype(tmp_path: Path) -> None:
    restored = roundtrip(tmp_path, {"e": np.float32(1.5), "n": np.int64(-3)})
    assert isinstance(restored["e"], np.float32) and restored["e"] == np.float32(1.5)
    assert isinstance(restored["n"], np.int64) and restored["n"] == -3


def test_json_values_and_key_order_round_trip(tmp_path: Path) -> None:
    state = {
        "x": np.ones(10),
        "energy": -12.5,
        "step": 42,
        "name": "argon",
        "params": {"dt": 0.002, "list": [1, 2, None], "flag": True},
        "v": np.zeros(3, dtype=np.int8),
    }
    restored = roundtrip(tmp_path, state)
    assert list(restored) == list(state)
    assert restored["params"] == state["params"]
    assert restored["energy"] == -12.5 and restored["step"] == 42 and restored["name"] == "argon"


def test_values_that_are_not_json_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    with Checkpointer(tmp_path, chunk_size=CHUNK) as ck:
        with pytest.raises(CheckpointError, match="JSON") as err:
            ck.save({"x": np.ones(3), "bad": object()}, step=1)
        assert err.value.context == {"keys": ["bad"]}  # what is wrong, as context too
        with pytest.raises(CheckpointError, match="Python objects") as err:
            ck.save({"o": np.array([object()], dtype=object)}, step=1)
        assert err.value.context == {"array": "o"}
        with pytest.raises(CheckpointError, match="strings") as err:
            ck.save({1: np.ones(3)}, step=1)  # type: ignore[dict-item]
        assert err.value.context == {"key": "1"}
        with pytest.raises(CheckpointError, match="a state must be a dict") as err:
            ck.save([np.ones(3)], step=1)  # type: ignore[arg-type]
        assert err.value.context == {"directory": str(tmp_path)}
        ck.save({"ok": np.ones(3)}, step=2)
    assert [p.name for p in sorted(tmp_path.glob("*.json"))] == ["ckpt-0000000001.json"]
    with pytest.raises(CheckpointError, match="is closed") as err:
        ck.save({"ok": np.ones(3)}, step=3)
    assert err.value.context == {"directory": str(tmp_path)}


@pytest.mark.parametrize(
    ("option", "value"), [("keep_last", -1), ("max_in_flight", 0), ("chunk_size", 100)]
)
def test_a_bad_argument_is_refused_with_its_name_in_the_context(
    tmp_path: Path, option: str, value: int
) -> None:
    # keep_last=-1 turned retention off without a word, as keep_last=0 does on purpose
    with pytest.raises(CheckpointError, match=option.replace("_", " ") + "|" + option) as err:
        Checkpointer(tmp_path, **{option: value})
    assert err.value.context == {option: value}


def test_keep_last_0_keeps_every_checkpoint(tmp_path: Path) -> None:
    with Checkpointer(tmp_path, chunk_size=CHUNK, keep_last=0) as ck:
        for step in range(5):
            ck.save({"x": np.full(8, step, dtype=np.float32)}, step=step)
    assert len(list(tmp_path.glob("ckpt-*.json"))) == 5


def test_restore_from_an_empty_directory_returns_none(tmp_path: Path) -> None:
    with Checkpointer(tmp_path / "none") as ck:
        assert ck.restore() is None
