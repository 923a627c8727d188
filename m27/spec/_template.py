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

import functools
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from m27.units import quoted

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
                    f"bad variable name {quoted(name)} in {quoted(text[start : close + 2])} "
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
    return list(_split(_marked(text, placeholders)[0]))


def render_argv(
    text: str,
    placeholders: Sequence[Placeholder],
    values: Mapping[str, str],
    lists: Collection[str] = (),
) -> tuple[str, ...]:
    """The argument list of a command string, with values substituted after splitting;
    an argument that is a placeholder of a list variable (named in `lists`) alone becomes
    one argument per value (:func:`list_words`)."""
    marked, pattern, tag = _marked(text, placeholders)
    tokens = _split(marked)
    if not placeholders:
        return tokens
    names = [ph.name for ph in placeholders]
    out: list[str] = []
    for token in tokens:
        if tag not in token:
            out.append(token)
        elif (m := pattern.fullmatch(token)) and names[int(m[1])] in lists:
            out += list_words(values[names[int(m[1])]])
        else:
            out.append(pattern.sub(lambda m: values[names[int(m.group(1))]], token))
    return tuple(out)


#: What separates the values of a list variable given as text (`--set TEMPS=300,310`)
LIST_SEPARATORS = re.compile(r"[\s,]+")


def list_words(value: str) -> list[str]:
    """The values of a list variable: `vars:` keeps them as one text, blank-separated,
    and `--set TEMPS="300 310"` or `--set TEMPS=300,310` gives them so."""
    return [word for word in LIST_SEPARATORS.split(value) if word]


def bare_word(text: str, ph: Placeholder) -> bool:
    """Whether `ph` stands alone as an unquoted word of the command `text`."""
    before = text[ph.start - 1] if ph.start else " "
    after = text[ph.end] if ph.end < len(text) else " "
    return before in _SPACE and after in _SPACE


@functools.lru_cache(maxsize=2)
def _split(text: str) -> tuple[str, ...]:
    """split_words, remembered: validation splits the same command twice (check, render)."""
    return tuple(split_words(text))


_SPACE = " \t\r\n"
_SPACES = re.compile(r"[ \t\r\n]+")
#: Characters str.split() treats as blanks and shlex does not.
_ODD_SPACE = re.compile(
    "[\x0b\x0c\x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
)
_NONSPACE = re.compile(r"[^ \t\r\n]")
_SPECIAL = re.compile(r"['\"\\]")
#: One piece of a word: plain text, '...', "..." or a backslash and what it escapes.
PIECE = r"[^ \t\r\n'\"\\]+|'[^']*'|\"[^\"\\]*(?:\\[\s\S][^\"\\]*)*\"|\\[\s\S]"
_WORD = re.compile(f"(?:{PIECE})+")
_PIECES = re.compile(PIECE)
#: Inside "...", sh reads a backslash as an escape only before these (and a line break).
_DQ_ESCAPE = re.compile(r'\\([\\"$`])')
_QUOTED_OR_ESCAPED = re.compile(r"""'[^']*'|"(?:[^"\\]|\\[\s\S])*"|\\[\s\S]""")
_ESCAPE = re.compile(r"\\[\s\S]")


def join_lines(text: str) -> tuple[str, list[int]]:
    """`text` without its backslash-newlines outside '...', as sh joins lines before it
    splits words, and where each one was (offsets in the joined text, ascending)."""
    if "\\\n" not in text:
        return text, []
    out: list[str] = []
    removed: list[int] = []
    size = last = 0
    for match in _QUOTED_OR_ESCAPED.finditer(text):
        if match.group()[0] == "'":
            continue
        for escape in _ESCAPE.finditer(text, match.start(), match.end()):
            if escape.group() == "\\\n":
                out.append(text[last : escape.start()])
                size += escape.start() - last
                removed.append(size)
                last = escape.end()
    out.append(text[last:])
    return "".join(out), removed


def split_words(text: str) -> list[str]:
    """The words /bin/sh would split `text` into, before it expands anything.

    Quotes and backslashes as in sh (so not quite ``shlex.split``: a backslash-newline
    joins lines, and inside "..." a backslash also escapes `$` and a backquote), in linear
    time: shlex reads one character per Python call (about 3 s for 5 MB); this matches
    whole words with regular expressions and only looks inside the words that quote or
    escape. Raises ValueError with shlex's messages for an unclosed quote or a trailing
    backslash. Whether sh would also *expand* something is `_shell.shell_syntax`'s part.
    """
    if _SPECIAL.search(text) is None:
        if _ODD_SPACE.search(text) is None:
            return text.split()  # same words: no blank here that str.split and shlex differ on
        stripped = text.strip(_SPACE)
        return _SPACES.split(stripped) if stripped else []
    text = join_lines(text)[0]
    words: list[str] = []
    pos = 0
    for match in _WORD.finditer(text):
        _check_gap(text, pos, match.start())
        word = match.group()
        words.append(_unquote(word) if _SPECIAL.search(word) else word)
        pos = match.end()
    _check_gap(text, pos, len(text))
    return words


def _check_gap(text: str, start: int, end: int) -> None:
    """Between words only blanks may stand; anything else is an unfinished quote or escape
    (shlex's message: an unclosed `'`, or a `"` or `\\` that reaches the end escaping)."""
    if end == start or (bad := _NONSPACE.search(text, start, end)) is None:
        return
    if bad.group() == "'":
        raise ValueError("No closing quotation")
    trailing = len(text) - len(text.rstrip("\\"))
    raise ValueError("No escaped character" if trailing % 2 else "No closing quotation")


def _unquote(word: str) -> str:
    out: list[str] = []
    for piece in _PIECES.findall(word):
        first = piece[0]
        if first == "'":
            out.append(piece[1:-1])
        elif first == '"':
            out.append(_DQ_ESCAPE.sub(r"\1", piece[1:-1]))
        elif first == "\\":
            out.append(piece[1:])
        else:
            out.append(piece)
    return "".join(out)


def shell_quote(value: str) -> str:
    """`value` as one single-quoted shell word, always quoted.

    shlex.quote leaves "safe" strings bare, but a bare `PATH=/x` at the head of a command
    is an assignment and a bare `for` is a keyword; quoting always keeps them literal.
    """
    return "'" + value.replace("'", "'\"'\"'") + "'"


def render_shell(text: str, placeholders: Sequence[Placeholder], values: Mapping[str, str]) -> str:
    """The shell script with every value single-quoted in place."""
    return substitute(text, placeholders, {k: shell_quote(v) for k, v in values.items()})


def _marked(text: str, placeholders: Sequence[Placeholder]) -> tuple[str, re.Pattern[str], str]:
    # Any tag absent from the template works (values are pasted in after splitting and
    # never scanned); a fixed first choice lets the two splits of one command share work.
    tag, n = "m27ph", 0
    while tag in text:
        n += 1
        tag = f"m27ph{n}q"
    pieces: list[str] = []
    pos = 0
    for index, ph in enumerate(placeholders):
        pieces.append(text[pos : ph.start])
        pieces.append(f"{tag}x{index}x{tag}")
        pos = ph.end
    pieces.append(text[pos:])
    return "".join(pieces), re.compile(re.escape(tag) + r"x(\d+)x" + re.escape(tag)), tag
