"""How values are said back in messages (`m27.units.quoted`) and read (`parse_*`)."""

from __future__ import annotations

import pytest

from m27.units import QUOTE_MAX, is_control, parse_duration, parse_size, printable, quoted


def test_quoted_is_repr_up_to_the_limit_then_the_start_and_the_length() -> None:
    assert quoted("5 m") == "'5 m'"
    assert quoted(300) == "300"
    assert quoted("x" * QUOTE_MAX) == repr("x" * QUOTE_MAX)
    assert quoted("x" * 5000) == f"{'x' * QUOTE_MAX!r}... (5,000 characters)"
    start = "it's\n" * 2
    assert quoted("it's\n" * 40, most=10) == f"{start!r}... (200 characters)"


def test_parse_errors_quote_a_long_value_by_its_start() -> None:
    with pytest.raises(ValueError) as err:
        parse_duration("9" * 100 + "parsecs")
    assert str(err.value).startswith(f"not a duration: {'9' * 80!r}... (107 characters)")
    with pytest.raises(ValueError, match=r"^not a size: 'GiB\+' \(use"):
        parse_size("GiB+")


def test_printable_escapes_what_a_terminal_would_act_on_and_keeps_the_rest() -> None:
    assert printable("gromacs ✓ é 水") == "gromacs ✓ é 水"
    assert printable("a\x1b[2Jb\nc\td\x9b") == r"a\x1b[2Jb\nc\td\x9b"
    # a bidirectional override would make the rest of the line read backwards
    assert printable("rm\u202egnp.exe") == r"rm\u202egnp.exe"
    assert is_control("\u2066") and not is_control("\u200d")  # ZWJ, in emoji, is kept


def test_sizes_go_up_to_pebibytes_so_the_largest_size_a_field_takes_can_be_written() -> None:
    # `gpu_memory:` says "must be at most 1PiB": the value it names is one it reads
    assert parse_size("1PiB") == parse_size("1024TiB") == 1024**5
    assert parse_size("2 pb") == 2 * 1024**5
    with pytest.raises(ValueError, match="not a size"):
        parse_size("1EiB")
