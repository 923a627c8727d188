"""m27.tables: aligned plain-text tables, one line a row in a pipe, fitted at 80 columns."""

from __future__ import annotations

import io

from m27.tables import Col, render, show

COLS = [Col("STEP"), Col("TRY", right=True), Col("NOTE", wrap=True)]
ROWS = [("md_simulation", 1, "exit 3: " + "the solver diverged at step 400 " * 4), ("an", 12, "")]


def test_columns_line_up_and_numbers_align_right() -> None:
    head, first, second = render(COLS, ROWS).splitlines()
    assert head.split() == ["STEP", "TRY", "NOTE"]
    assert first.startswith("md_simulation    1  exit 3: the solver")
    assert second == "an              12"  # no trailing blanks
    assert head.index("NOTE") == first.index("exit 3")


def test_a_row_stays_one_line_however_long_outside_a_terminal() -> None:
    out = io.StringIO()
    show(COLS, ROWS, file=out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[1].endswith("diverged at step 400")


def test_at_80_columns_free_text_wraps_and_the_other_columns_stay_whole() -> None:
    lines = render(COLS, ROWS, width=80, indent=2).splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert all(line.startswith("  ") for line in lines)
    assert lines[1].startswith("  md_simulation    1  exit 3:")
    note = " ".join(line[lines[0].index("NOTE") :].strip() for line in lines[1:-1])
    assert note == ROWS[0][2].strip()  # every word of the note is there, in order
    assert lines[-1].split() == ["an", "12"]


def test_values_are_text_not_markup_and_long_values_are_cut() -> None:
    text = render([Col("PATH"), Col("NAME", max_width=8)], [("/x/[red]y[/red]", "abcdefghijkl")])
    row = text.splitlines()[1]
    assert "/x/[red]y[/red]" in row
    assert row.endswith("abcdefg…")
    assert render(["A", "B"], [(None, 0)]).splitlines()[1] == "   0"


def test_a_wide_table_at_80_columns_keeps_every_column() -> None:
    cols = [Col("GPU", right=True), Col("NAME", max_width=26), Col("UUID", max_width=14)]
    cols += [Col(h, right=True) for h in ("UTIL", "MEMORY", "TEMP", "POWER")]
    cols += [Col("PRIMARY", wrap=True), Col("GUESTS", wrap=True)]
    name = "NVIDIA H100 80GB HBM3 PCIe Gen5"
    row = ("0", name, "GPU-5d3c1a2b-7e8f", "100%", "71.3GiB / 80.0GiB", "65C", "650W")
    row += ("20260101-000000-abcd/md_simulation", "r2/analysis (paused)")
    head, *lines = render(cols, [row], width=80).splitlines()
    assert max(len(line) for line in [head, *lines]) <= 80
    assert head.split() == [c.header for c in cols]  # no column dropped to make it fit
    start, end = head.index("PRIMARY"), head.index("GUESTS")
    primary = "".join(line[start:end].strip() for line in lines)
    assert primary == "20260101-000000-abcd/md_simulation"  # wrapped, every character kept
    (one,) = render(cols, [row]).splitlines()[1:]  # in a pipe: one line, the long name cut
    assert name[:25] + "…" in one and one.endswith("r2/analysis (paused)")


def test_a_control_character_in_a_cell_is_shown_escaped_and_keeps_the_row_whole() -> None:
    """A name recorded with an escape sequence or a newline (a hostile pipeline file of an
    older m27) must neither act on the terminal nor split its row."""
    text = render(["RUN", "PIPELINE"], [("r1", "md\x1b]0;owned\x07\x1b[2J\nline2")])
    assert "\x1b" not in text and "\x07" not in text
    assert text.splitlines()[1].split() == ["r1", r"md\x1b]0;owned\x07\x1b[2J\nline2"]
