"""The one way m27 prints a table: rich.table laid out as plain text.

Every listing (``m27 runs``, ``status``, ``queue``, ``gpus``, ``checkpoints``, ``config``,
the simulator's report) goes through :func:`show` or :func:`render`, so the columns line
up the same way everywhere and no command aligns f-strings by hand.

Two rules shape the output:

- In a terminal the table fits its width, so it stays readable at 80 columns: cells wrap
  inside their column instead of a column being dropped. Columns marked ``wrap`` (free
  text and names: notes, reasons, run and step names) may break anywhere and lose no
  character; the others break at spaces and cut a longer word with "…".
- Anywhere else (a pipe, a file, a test) a row is one line, however long, so ``grep`` and
  ``awk`` keep working; lines carry no trailing blanks, no colour and no box drawing.

Why a top-level module: the CLI and the simulator (``m27.sim``, a lower layer) both print
tables, so the helper lives below both, as a leaf that imports nothing from m27 but the
leaf :mod:`m27.units`.
"""

from __future__ import annotations

import io
import shutil
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from m27.units import printable

__all__ = ["Col", "render", "show"]

#: The width a table may take when it is not shown in a terminal: wide enough that no row
#: is ever wrapped.
UNBOUNDED = 100_000


@dataclass(frozen=True)
class Col:
    """A column: its header, right-aligned (numbers) or not, and whether it holds free
    text that may break anywhere in a narrow terminal; values longer than `max_width`
    are cut with …"""

    header: str
    right: bool = False
    wrap: bool = False
    max_width: int | None = None


def render(
    cols: Sequence[Col | str],
    rows: Iterable[Sequence[object]],
    *,
    width: int = UNBOUNDED,
    indent: int = 0,
) -> str:
    """The table as text lines (no trailing newline), at most `width` columns wide where
    the ``wrap`` columns allow it. Cell values are shown as ``str(value)``, never as rich
    markup, so ``[brackets]`` in a path stay as they are; None shows as an empty cell, and
    a control character as its escape (``\\n``, ``\\x1b``)."""
    table = Table(box=None, pad_edge=False, show_edge=False, padding=(0, 1), header_style="")
    # Unbounded: nothing needs to wrap and nothing may (a value over max_width is cut).
    # Bounded (a terminal): every cell may wrap, so rich never drops a column to fit.
    one_line = width >= UNBOUNDED
    for c in cols:
        col = Col(c) if isinstance(c, str) else c
        table.add_column(
            col.header,
            justify="right" if col.right else "left",
            no_wrap=one_line,
            overflow="fold" if col.wrap else "ellipsis",
            max_width=col.max_width,
        )
    for row in rows:
        # printable(): a newline in a cell would split its row, an ESC act on the terminal
        table.add_row(*(Text("" if v is None else printable(str(v))) for v in row))
    out = io.StringIO()
    console = Console(
        file=out,
        width=max(20, width - indent),
        color_system=None,
        force_terminal=False,
        highlight=False,
        emoji=False,
        legacy_windows=False,
    )
    console.print(table, crop=False)
    pad = " " * indent
    return "\n".join(pad + line.rstrip() for line in out.getvalue().rstrip("\n").split("\n"))


def show(
    cols: Sequence[Col | str],
    rows: Iterable[Sequence[object]],
    *,
    indent: int = 0,
    file: TextIO | None = None,
) -> None:
    """Print the table to `file` (stdout): fitted to the terminal, or one line a row."""
    file = file or sys.stdout
    isatty = getattr(file, "isatty", None)
    width = shutil.get_terminal_size().columns if isatty is not None and isatty() else UNBOUNDED
    print(render(cols, rows, width=width, indent=indent), file=file)
