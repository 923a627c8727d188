"""Where in a `shell: true` script a quoted value stays literal.

A value is pasted in single-quoted ('...'). That keeps it literal only where the shell
reads quotes as quotes: in plain command text, in `( )` and in `$( )` (which start a
fresh quoting context even inside double quotes). Elsewhere the quote would not protect:

- inside '...' or "..." the pasted quotes would be literal text and `$(...)` in the
  value would run;
- inside backticks a backquote in the value ends the substitution;
- in a comment a newline in the value ends the comment;
- in a here-document body quotes are plain text;
- inside `${...}` and `$((...))` the rules differ between shells;
- after `\\` or `$` the value's first quote would be escaped or start `$'...'`;
- after a `$'...'` string, since bash reads `\\'` inside it as a quote and dash may not,
  the two disagree about what follows.

This is a small lexer, not a shell parser: where it is unsure it refuses the placeholder
(the user gets a validation problem and can pass the value through `env:` instead); it
never declares a doubtful place safe. `case ... esac` is tracked so that a pattern's `)`
does not end a `$(`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from m27.spec._template import Placeholder

_CODE = frozenset({"top", "paren", "cmdsub"})
_BOUNDARY = frozenset(" \t\n;&|()<>")

_IN_QUOTES = "is inside quotes; write it unquoted, m27 quotes the value itself"
_IN_COMMENT = "is inside a shell comment"
_IN_SPECIAL = 'is inside `...`, ${...} or $((...)); put the value in env: and use "$NAME"'
_AFTER_HEREDOC = 'comes after a here-document (<<); put the value in env: and use "$NAME"'
_AFTER_ANSI = "comes after a $'...' string, which shells read differently; use '...' there"
_ESCAPED = "follows a backslash, which would escape the value's opening quote"
_AFTER_DOLLAR = "follows '$', which would change how the value's quote is read"


@dataclass
class _Frame:
    kind: str
    cases: int = 0  # open `case` statements in this code frame
    parens: int = 0  # open parentheses inside $(( ))


def unsafe_placeholders(text: str, placeholders: Sequence[Placeholder]) -> dict[int, str]:
    """Index of each placeholder where a quoted value would not stay literal -> why."""
    if not placeholders:
        return {}
    starts = {ph.start: (index, ph.end) for index, ph in enumerate(placeholders)}
    unsafe: dict[int, str] = {}
    stack = [_Frame("top")]
    poisoned: str | None = None  # why every later placeholder is refused
    # Nothing after the last placeholder can change a verdict: stop there (a 5 MB script
    # with its one placeholder near the start is read that far, not to the end).
    i, n = 0, max(starts) + 1
    while i < n:
        if i in starts:
            index, end = starts[i]
            reason = poisoned or _judge(stack)
            if reason:
                unsafe[index] = reason
            i = end
            continue
        frame = stack[-1]
        kind = frame.kind
        ch = text[i]
        if kind == "comment":
            if ch == "\n":
                stack.pop()
            i += 1
        elif kind == "squote":
            if ch == "'":
                stack.pop()
            i += 1
        elif ch == "\\":
            if i + 1 in starts:
                unsafe[starts[i + 1][0]] = _ESCAPED
                i = starts[i + 1][1]
            else:
                i += 2
        elif kind == "backtick":
            if ch == "`":
                stack.pop()
            i += 1
        elif ch == "$":
            if i + 1 in starts:
                unsafe[starts[i + 1][0]] = _AFTER_DOLLAR
                i = starts[i + 1][1]
            elif text.startswith("'", i + 1) and kind != "dquote":
                poisoned = poisoned or _AFTER_ANSI
                i += 1
            elif text.startswith("((", i + 1):
                stack.append(_Frame("arith"))
                i += 3
            elif text.startswith("(", i + 1):
                stack.append(_Frame("cmdsub"))
                i += 2
            elif text.startswith("{", i + 1):
                stack.append(_Frame("param"))
                i += 2
            else:
                i += 1
        elif ch == "`":
            stack.append(_Frame("backtick"))
            i += 1
        elif ch == '"':
            if kind == "dquote":
                stack.pop()
            else:
                stack.append(_Frame("dquote"))
            i += 1
        elif kind == "dquote":
            i += 1
        elif ch == "'":
            stack.append(_Frame("squote"))
            i += 1
        elif kind == "param":
            if ch == "}":
                stack.pop()
            i += 1
        elif kind == "arith":
            i = _arith_step(text, i, stack)
        else:
            i, heredoc = _code_step(text, i, stack)
            if heredoc:
                poisoned = poisoned or _AFTER_HEREDOC
    return unsafe


def _judge(stack: list[_Frame]) -> str | None:
    kinds = [frame.kind for frame in stack]
    if kinds[-1] == "comment":
        return _IN_COMMENT
    if kinds[-1] in ("squote", "dquote"):
        return _IN_QUOTES
    if any(k in ("backtick", "param", "arith") for k in kinds) or kinds[-1] not in _CODE:
        return _IN_SPECIAL
    return None


def _arith_step(text: str, i: int, stack: list[_Frame]) -> int:
    frame = stack[-1]
    ch = text[i]
    if ch == "(":
        frame.parens += 1
    elif ch == ")":
        if frame.parens:
            frame.parens -= 1
        elif text.startswith(")", i + 1):
            stack.pop()
            return i + 2
    return i + 1


def _code_step(text: str, i: int, stack: list[_Frame]) -> tuple[int, bool]:
    """One step in plain command text (top level, `( )` or `$( )`); True: a `<<` began."""
    frame = stack[-1]
    ch = text[i]
    word_start = i == 0 or text[i - 1] in _BOUNDARY
    if ch == "#" and word_start:
        stack.append(_Frame("comment"))
    elif ch == "<" and text.startswith("<", i + 1):
        return i + 2, True
    elif ch == "(":
        stack.append(_Frame("paren"))
    elif ch == ")":
        if frame.cases:
            pass  # a case pattern's closing parenthesis
        elif frame.kind in ("paren", "cmdsub"):
            stack.pop()
    elif word_start and ch in "ce":
        for word, delta in (("case", 1), ("esac", -1)):
            after = i + len(word)
            if text.startswith(word, i) and (after == len(text) or text[after] in _BOUNDARY):
                frame.cases = max(0, frame.cases + delta)
                return after, False
    return i + 1, False
