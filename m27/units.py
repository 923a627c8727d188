"""Durations (`300s`, `5m`, `1h30m`, `50ms`) and sizes (`128KB`, `8GiB`) as users write them.

KB/MB/GB are read as powers of 1024, like the seed's `diff_threshold = 128KB` meant; the
IEC spellings KiB/MiB/GiB mean the same. A bare number is seconds or bytes.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections.abc import Collection, Iterable

_SECONDS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*", re.IGNORECASE)
#: largest first: the order the parts of a compound duration (`1h30m`) come in
_DURATION_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_DURATION_FORMS = "use e.g. 50ms, 300s, 5m, 1h30m"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?i?B?)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


def parse_duration(text: str | int | float) -> float:
    """Seconds in `text`; raises ValueError with the accepted forms."""
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {quoted(text)}")
    if isinstance(text, int | float):
        if text < 0:
            raise ValueError(f"a duration cannot be negative: {quoted(text)}")
        return float(text)
    text = str(text)
    bare = _SECONDS.match(text)
    if bare:
        return float(bare[1])
    # parts from days down to milliseconds, as format_duration writes them (`2h03m`)
    total, pos, last = 0.0, len(text) - len(text.lstrip()), -1
    order = list(_DURATION_UNITS)
    while pos < len(text):
        part = _DURATION_PART.match(text, pos)
        if part is None:
            raise ValueError(f"not a duration: {quoted(text)} ({_DURATION_FORMS})")
        unit = part[2].lower()
        if order.index(unit) <= last:
            raise ValueError(
                f"not a duration: {quoted(text)} (the parts go from days down to milliseconds, "
                f"each once: {_DURATION_FORMS})"
            )
        last = order.index(unit)
        total += float(part[1]) * _DURATION_UNITS[unit]
        pos = part.end()
    if last < 0:
        raise ValueError(f"not a duration: {quoted(text)} ({_DURATION_FORMS})")
    return total


def parse_size(text: str | int) -> int:
    """Bytes in `text`; raises ValueError with the accepted forms."""
    if isinstance(text, bool):
        raise ValueError(f"not a size: {quoted(text)}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"a size cannot be negative: {quoted(text)}")
        return text
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"not a size: {quoted(text)} (use e.g. 128KB, 256MiB, 8GiB)")
    value, unit = match.groups()
    prefix = (unit or "").upper().rstrip("B").rstrip("I")
    if prefix not in _SIZE_UNITS:
        raise ValueError(f"not a size: {quoted(text)} (use e.g. 128KB, 256MiB, 8GiB)")
    return int(float(value) * _SIZE_UNITS[prefix])


def format_duration(seconds: float) -> str:
    """Short human form: 850ms, 12.3s, 4m05s, 2h03m."""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def format_size(n: float) -> str:
    """Short human form in IEC units."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}TiB"


def count(n: int, noun: str) -> str:
    """`n` and `noun`, plural unless n is 1: "1 step", "2 steps", "0 steps"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


#: The most characters of a value that a message quotes.
QUOTE_MAX = 80


def quoted(value: object, most: int = QUOTE_MAX) -> str:
    """`repr(value)`, cut to its first `most` characters and how long it was when longer.

    Messages quote what the user wrote so it can be found; a 5,000-character value quoted
    whole buried the message (`not a duration: 'xxxx...` ran on for a screen, once for each
    field it was in) and the problem said nothing the first characters do not."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= most:
        return repr(value)
    return f"{text[:most]!r}... ({len(text):,} characters)"


#: Unicode's bidirectional overrides and isolates: they reorder the text printed after them
#: (a name that reads `rm` on screen and is `mr`), so they count as control characters.
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def is_control(char: str) -> bool:
    """True for a character a terminal acts on instead of showing: C0 and C1 controls (ESC
    starts the sequences that retitle a terminal or clear it) and bidirectional overrides."""
    return unicodedata.category(char) == "Cc" or char in _BIDI


def printable(text: str) -> str:
    """`text` with each control character written as its escape (``\\x1b``, ``\\n``).

    For values m27 prints but did not choose (a variable's value, a name recorded before
    names were checked): shown as they are, an escape sequence in one would act on the
    terminal of whoever runs `m27 status`."""
    if not any(is_control(c) for c in text):
        return text
    return "".join(repr(c)[1:-1] if is_control(c) else c for c in text)


def listed(names: Iterable[str], most: int) -> str:
    """`a, b, c and 197 more`: the first `most` of `names`, and how many are left out.

    A message naming a run's 201 steps (or a node's pipelines, a run id's matches) is a
    screenful that hides what it says; the first few say what kind of names they are."""
    items = list(names)
    shown = ", ".join(items[:most])
    return shown + (f" and {len(items) - most} more" if len(items) > most else "")


def closest(word: str, choices: Collection[str]) -> str | None:
    """The choice `word` was most likely a typo of, ignoring case, or None: what every
    `did you mean ...?` of m27 names (a pipeline's keys, a setting, a lab option, a
    pipeline's name in `m27 runs --pipeline`)."""
    lowered = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[close[0]] if close else None


def cpu_list(cpus: Iterable[int]) -> str:
    """``0-3,8-11``: CPU numbers as taskset and /proc write them (m27.gpu.cpus's shares)."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)
