"""The public API is what m27.__all__ lists: sorted, importable, and nothing else public."""

from __future__ import annotations

import m27


def test_all_is_sorted_and_every_name_exists() -> None:
    assert list(m27.__all__) == sorted(m27.__all__)
    for name in m27.__all__:
        assert hasattr(m27, name), name


def test_every_public_attribute_is_listed_in_all() -> None:
    public = {
        n
        for n in vars(m27)
        if not n.startswith("_")
        and not isinstance(getattr(m27, n), type(m27))
        and n != "annotations"
    }
    assert public <= set(m27.__all__), public - set(m27.__all__)


def test_every_error_derives_from_the_one_root() -> None:
    errors = [getattr(m27, n) for n in m27.__all__ if n.endswith("Error")]
    assert errors and all(issubclass(e, m27.M27Error) for e in errors)
    err = m27.RunnerError("bad", file="p.yaml", line=3)
    assert (err.file, err.line, err.context) == ("p.yaml", 3, {"file": "p.yaml", "line": 3})
    assert m27.SpecError("bad").problems == []


def test_every_error_says_its_exit_status_and_bad_input_is_2() -> None:
    # the CLI exits with `exc.exit_code`; a library caller can tell bad input the same way
    from m27.runids import RunIdError

    user_input = {m27.SpecError, m27.ConfigError, RunIdError}
    for error in (m27.M27Error, m27.CheckpointError, m27.RunError, m27.GpuError, *user_input):
        assert error("x").exit_code == (2 if error in user_input else 1), error
