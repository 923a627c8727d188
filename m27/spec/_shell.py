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

A command *without* a shell is split like a shell would split it, but nothing else a
shell does happens: `a | b`, `a; b`, `> file`, `$HOME`, `~/x` and `# note` reach the
program as literal arguments, and the step "succeeds" having done something else.
`shell_syntax` finds the first such place so that the file is refused with the fix
(`shell: true`, or quotes) instead.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from m27.spec._template import PIECE, Placeholder, join_lines, split_words
from m27.units import quoted

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


#: Characters that can start shell syntax; a command without any is read at once.
_MAYBE_SYNTAX = re.compile(r"[;&|<>()`$~#*?\[=\n]")
#: The pieces of a command as its split reads them: blanks, '...', "...", \x, plain text.
_TOKEN = re.compile(r"[ \t\r\n]+|" + PIECE)
#: Expansions a shell makes inside "..." too: $NAME, ${...} (not m27's `${{X}}`), $(...), `.
_EXPANSION = r"\$(?:[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-]|\(|\{(?!\{))|`"
_IN_DQUOTES = re.compile(r"\\[\s\S]|(" + _EXPANSION + ")")
_IN_PLAIN = re.compile(
    r"(?P<operator>[;&|<>()]+)"
    r"|(?P<expansion>" + _EXPANSION + ")"
    r"|(?P<pattern>[*?]|\[(?=[^\]]*\]))"  # `[` only with a `]` after it, as in sh
)
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_AT_WORD_START = {"~": "a home directory", "#": "a comment"}
_PLAIN_KINDS = {
    "operator": "an operator",
    "expansion": "an expansion",
    "pattern": "a file-name pattern",
}


@dataclass(frozen=True)
class ShellSyntax:
    """A place where a shell would act on a command's text instead of passing it on."""

    offset: int
    text: str
    kind: str  # what it is, in words: "an operator", "a comment", ...


def shell_syntax(text: str) -> ShellSyntax | None:
    """The first shell syntax in a command run without a shell, if any.

    Shell syntax is what /bin/sh would act on rather than pass along: an unquoted
    operator or redirection (`; & | < > ( )`), an expansion outside single quotes
    (`$NAME`, `${...}`, `$(...)`, backticks), a file-name pattern (`* ? [...]`), `~` or
    `#` starting a word, a line break between two commands, and `NAME=value` as the
    first word. Quoted or backslash-escaped, the same characters are plain text, as in a
    shell; `{{NAME}}` placeholders are not shell syntax (their values are never looked at).
    The script of `sh -c SCRIPT` is not looked at: the shell it is given to acts on it.
    Where this finds nothing else, m27's split gives the arguments sh would.
    """
    if _MAYBE_SYNTAX.search(text) is None:
        return None
    joined, removed = join_lines(text)
    found = _first_syntax(joined, _script_word(joined))
    if found is None or not removed:
        return found
    at = found.offset + 2 * bisect_right(removed, found.offset)  # where it is in `text`
    return ShellSyntax(at, found.text, found.kind)


#: Programs that run a script given after `-c` (as a path too: /bin/bash).
_SHELLS = frozenset({"sh", "bash", "dash", "ash", "ksh", "mksh", "zsh"})


def _script_word(text: str) -> int | None:
    """Which word is the script of `sh -c SCRIPT` (`bash -lc`, `bash -o pipefail -c`,
    `env bash -c`), or None. That shell acts on its script's `$i`, `|` and `;` itself: a
    loop in `sh -c "for i in 1 2; do echo $i; done"` is what the step means, not shell
    syntax left for a shell that is not there."""
    try:
        words = split_words(text)
    except ValueError:
        return None
    first = 1 if words and words[0].rsplit("/", 1)[-1] == "env" else 0
    if len(words) <= first or words[first].rsplit("/", 1)[-1] not in _SHELLS:
        return None
    i, script = first + 1, False
    while i < len(words):
        word = words[i]
        if word in ("-o", "+o"):  # takes the next word: -o pipefail
            i += 2
        elif word == "--":
            i += 1
            break
        elif len(word) > 1 and word[0] in "-+" and not word.startswith("--"):
            script = script or (word[0] == "-" and "c" in word[1:])
            i += 1
        elif word.startswith("--"):  # --norc, --login
            i += 1
        else:
            break
    return i if script and i < len(words) else None


def _first_syntax(text: str, exempt: int | None = None) -> ShellSyntax | None:
    """`shell_syntax` of a text whose lines are already joined; word `exempt` (counted
    from 0) is not looked at."""
    word_start, first_word, word = True, True, -1
    for token in _TOKEN.finditer(text):
        piece, at = token.group(), token.start()
        lead = piece[0]
        if lead in " \t\r\n":
            if "\n" in piece and token.end() < len(text):
                return ShellSyntax(at + piece.index("\n"), "\n", "a line break")
            word_start, first_word = True, first_word and word_start
            continue
        if word_start:
            word += 1
        if word == exempt:
            word_start = False
            continue
        if lead == '"':
            found = next((m for m in _IN_DQUOTES.finditer(piece) if m.group(1)), None)
            if found is not None:
                return ShellSyntax(at + found.start(), found.group(1), "an expansion")
        elif lead not in "'\\":
            if word_start and lead in _AT_WORD_START:
                return ShellSyntax(at, lead, _AT_WORD_START[lead])
            if first_word and word_start and (named := _ASSIGNMENT.match(piece)):
                return ShellSyntax(at, named.group(), "a variable assignment")
            if (plain := _IN_PLAIN.search(piece)) is not None:
                kind = _PLAIN_KINDS[plain.lastgroup or "operator"]
                return ShellSyntax(at + plain.start(), plain.group(), kind)
        word_start = False
    return None


_FIXES = {
    "a line break": "in sh a line break ends the command: join the lines (end a line with \\ "
    "to go on), or add `shell: true`",
    "a variable assignment": "set the variable under env: instead",
    "a home directory": "write the path out (m27 expands `~` in output: and workdir:, "
    "not in commands)",
}
#: Operators that run one command after another: each could be a step.
_SEQUENCES = frozenset({";", "&&", "||", "&"})
_SEQUENCE_FIX = (
    "make each command a step of its own (depends_on orders them), add `shell: true` to "
    "run the command with /bin/sh, or quote it to pass it as text"
)
_DEFAULT_FIX = "add `shell: true` to run the command with /bin/sh, or quote it to pass it as text"


def unshelled(text: str) -> tuple[int, str] | None:
    """(offset, problem) for the first shell syntax in a command run without a shell."""
    found = shell_syntax(text)
    if found is None:
        return None
    fix = _SEQUENCE_FIX if found.text in _SEQUENCES else _FIXES.get(found.kind, _DEFAULT_FIX)
    return found.offset, (
        f"{quoted(found.text)} is shell syntax ({found.kind}), but the command runs without a "
        f"shell, so nothing acts on it; {fix}"
    )
