"""`$NAME` in `env:` values, paths, `container:` and `binds:`: read from m27's environment.

`PATH: $HOME/bin:$PATH` and `workdir: $SCRATCH/run1` are how people write these in a shell,
a job script or a Compose file. Taken as written, the step got the text `$HOME/bin:$PATH`
as its PATH (every program it started by name was not found), and a folder named
`$SCRATCH` was made inside the pipeline's folder. So, as sh reads them: `$NAME`, `${NAME}`,
`${NAME:-default}` (when NAME is unset or empty; `${NAME-default}`: when unset), a default
that names others (`${DATA:-$SCRATCH/data}`), and `$$` for one `$` (as Compose writes it); a
name that is not set is empty, and :attr:`m27.spec.Pipeline.unset_env` says where, for a
note. Only the file's own text is expanded: a `{{VAR}}`'s value is data, a `$` in it too.
Commands are not expanded here: without a shell a `$` is refused, with one the shell reads
it (docs/pipelines.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from m27.spec._nodes import Template
from m27.spec._template import Placeholder

if TYPE_CHECKING:
    from m27.spec._check import Checker

#: A name, possessive: `$AB` is never re-split as `$A` + `B` when a match fails later.
_NAME = r"[A-Za-z_][A-Za-z0-9_]*+"
#: What a default may hold: text, `$$`, `$NAME`, `${NAME}`, `${NAME:-text}` (`${NAME-text}`),
#: two levels as sh nests them in practice (`${A:-${B:-/tmp}}`); no `$` in the inner text.
#: Every loop is possessive and its branches start differently, so a failed match is given
#: up at once: a hostile file of unclosed `${a:-` stays linear (with `[^}]*`, each read to
#: the end: 50 s for 200 KB).
_DEFAULT = rf"(?:[^}}$]++|\$\$|\$\{{{_NAME}(?::?-[^}}$]*+)?\}}|\${_NAME})*+"
#: `$$`, `${NAME}`, `${NAME:-default}`, `${NAME-default}`, `$NAME`; any other `$` stays as
#: written.
_REF = re.compile(
    rf"\$(?:(?P<dollar>\$)|\{{(?P<braced>{_NAME})(?:(?P<op>:?-)(?P<default>{_DEFAULT}))?\}}"
    rf"|(?P<bare>{_NAME}))"
)


def references(text: str) -> list[str]:
    """The names `text` refers to as `$NAME`, `${NAME}` or `${NAME:-...}`, each once."""
    found: list[str] = []
    for m in _REF.finditer(text):
        if not m["dollar"]:
            found += [m["braced"] or m["bare"], *references(m["default"] or "")]
    return list(dict.fromkeys(found))


class Expanded(NamedTuple):
    """A text with its references read: what it became, its placeholders where they now
    are, the names that were not set (each once), and the offset in the written text of
    the first `${` that starts no reference (None: none)."""

    text: str
    placeholders: list[Placeholder]
    unset: list[str]
    malformed: int | None


def expand(text: str, placeholders: Sequence[Placeholder], environ: Mapping[str, str]) -> Expanded:
    """`text` with the references in its written parts (not inside a placeholder) replaced
    from `environ`."""
    if "$" not in text:
        return Expanded(text, list(placeholders), [], None)
    unset: list[str] = []
    bad: list[int] = []

    def value(m: re.Match[str]) -> str:
        if m["dollar"]:
            return "$"
        name = m["braced"] or m["bare"]
        got = environ.get(name)
        if m["op"] is not None:  # `:-`: when unset or empty; `-`: when unset (as sh)
            use_default = not got if m["op"] == ":-" else got is None
            return _REF.sub(value, m["default"]) if use_default else got or ""
        if got is not None:
            return got
        if name not in unset:
            unset.append(name)
        return ""

    def written(start: int, end: int) -> str:
        """text[start:end] expanded; a `${` between its references is malformed."""
        out: list[str] = []
        pos = start
        for m in _REF.finditer(text, start, end):
            if (i := text.find("${", pos, m.start())) != -1:
                bad.append(i)
            out += [text[pos : m.start()], value(m)]
            pos = m.end()
        if (i := text.find("${", pos, end)) != -1:
            bad.append(i)
        out.append(text[pos:end])
        return "".join(out)

    pieces: list[str] = []
    moved: list[Placeholder] = []
    length = pos = 0
    for ph in placeholders:
        part = written(pos, ph.start)
        pieces += [part, text[ph.start : ph.end]]
        length += len(part)
        moved.append(Placeholder(ph.name, length, length + ph.end - ph.start))
        length += ph.end - ph.start
        pos = ph.end
    pieces.append(written(pos, len(text)))
    return Expanded("".join(pieces), moved, unset, bad[0] if bad else None)


def expanded(checker: Checker, tpl: Template) -> Template:
    """`tpl` with the `$NAME`s its file text holds read from the checker's environment:
    each name not set noted (`checker.unset_env`), a malformed `${` a problem, and what
    the references add counted toward what the file may expand to, as values are."""
    found = expand(tpl.text, tpl.placeholders, checker.environ)
    line = tpl.node.start_mark.line + 1
    checker.unset_env += [(line, tpl.field, name) for name in found.unset]
    ok = tpl.ok
    if found.malformed is not None:
        checker.add(
            tpl.node,
            tpl.field,
            "`${` starts no environment variable m27 reads: write ${NAME}, ${NAME:-default} "
            "or ${NAME-default} (a default may hold $NAME, ${NAME} or ${NAME:-text}), "
            "or $${ for the text `${`",
            found.malformed,
        )
        ok = False
    if ok and len(found.text) > len(tpl.text):
        ok = checker._fits(tpl.node, tpl.field, found.text, [])
    return Template(tpl.node, tpl.field, found.text, found.placeholders, ok)
