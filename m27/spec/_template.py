"""`{{NAME}}` placeholders: finding them, and substituting values without injection.

Substitution is single pass: a value is pasted in by slicing the template at the
placeholders' offsets, so nothing inside a value (another `{{X}}`, quotes, `$(...)`) is
ever looked at again. Three ways to render, one per kind of field:

- plain text (`output`, `workdir`, `env` values): the value replaces the placeholder;
- an argument list (`command` without a shell): the *template* is split with shlex first,
  so a value always lands inside exactly one argument, whatever characters it holds;
- a shell script (`shell: true`): the value is single-quoted, and only where
  :mod:`m27.spec._shell` proved the quote means what it says.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class Placeholder:
    """One `{{NAME}}` in a template; `start`/`end` are offsets of the braces."""

    name: str
    start: int
    end: int


@dataclass(frozen=True)
class TemplateProblem:
    """Why a template is malformed, and where (an offset in the template)."""

    offset: int
    message: str


def scan(text: str) -> tuple[list[Placeholder], list[TemplateProblem]]:
    """The placeholders in `text`, and every malformed one (reported, not raised)."""
    found: list[Placeholder] = []
    problems: list[TemplateProblem] = []
    pos = 0
    while (start := text.find("{{", pos)) != -1:
        close = text.find("}}", start + 2)
        if close == -1:
            problems.append(TemplateProblem(start, "'{{' is never closed by '}}'"))
            break
        inner = text[start + 2 : close]
        nested = inner.find("{{")
        if nested != -1:
            problems.append(TemplateProblem(start, "'{{' is never closed by '}}'"))
            pos = start + 2 + nested
            continue
        name = inner.strip()
        if not VAR_NAME.match(name):
            problems.append(
                TemplateProblem(
                    start,
                    f"bad variable name {name!r} in {text[start : close + 2]!r} "
                    "(use letters, digits and _, not starting with a digit)",
                )
            )
        else:
            found.append(Placeholder(name, start, close + 2))
        pos = close + 2
    return found, problems


def substitute(text: str, placeholders: Sequence[Placeholder], values: Mapping[str, str]) -> str:
    """`text` with each placeholder replaced by its value, in one pass."""
    pieces: list[str] = []
    pos = 0
    for ph in placeholders:
        pieces.append(text[pos : ph.start])
        pieces.append(values[ph.name])
        pos = ph.end
    pieces.append(text[pos:])
    return "".join(pieces)


def split_template(text: str, placeholders: Sequence[Placeholder]) -> list[str]:
    """Split the template like a shell would, each placeholder kept as an opaque marker.

    Raises ValueError (from shlex) for an unclosed quote. The markers are letters and
    digits only, so shlex keeps each inside the word it stands in.
    """
    return shlex.split(_marked(text, placeholders)[0])


def render_argv(
    text: str, placeholders: Sequence[Placeholder], values: Mapping[str, str]
) -> tuple[str, ...]:
    """The argument list of a command string, with values substituted after splitting."""
    marked, pattern = _marked(text, placeholders)
    names = [ph.name for ph in placeholders]
    return tuple(
        pattern.sub(lambda m: values[names[int(m.group(1))]], token)
        for token in shlex.split(marked)
    )


def shell_quote(value: str) -> str:
    """`value` as one single-quoted shell word, always quoted.

    shlex.quote leaves "safe" strings bare, but a bare `PATH=/x` at the head of a command
    is an assignment and a bare `for` is a keyword; quoting always keeps them literal.
    """
    return "'" + value.replace("'", "'\"'\"'") + "'"


def render_shell(text: str, placeholders: Sequence[Placeholder], values: Mapping[str, str]) -> str:
    """The shell script with every value single-quoted in place."""
    return substitute(text, placeholders, {k: shell_quote(v) for k, v in values.items()})


def _marked(text: str, placeholders: Sequence[Placeholder]) -> tuple[str, re.Pattern[str]]:
    tag = "m27" + secrets.token_hex(6)
    while tag in text:  # pragma: no cover - 48 random bits colliding with the template
        tag = "m27" + secrets.token_hex(6)
    pieces: list[str] = []
    pos = 0
    for index, ph in enumerate(placeholders):
        pieces.append(text[pos : ph.start])
        pieces.append(f"{tag}x{index}x{tag}")
        pos = ph.end
    pieces.append(text[pos:])
    return "".join(pieces), re.compile(re.escape(tag) + r"x(\d+)x" + re.escape(tag))
