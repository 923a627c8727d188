"""`$NAME` in `env:` values, `workdir:` and `output:`: read from the environment m27 runs in.

`PATH: $HOME/bin:$PATH` and `workdir: $SCRATCH/run1` are how people write these in a shell,
a job script or a Compose file. Taken as written, the step got the text `$HOME/bin:$PATH`
as its PATH (every program it started by name was not found), and a folder named
`$SCRATCH` was made inside the pipeline's folder. So, as sh reads them: `$NAME`, `${NAME}`,
`${NAME:-default}` (the default as written), and `$$` for one `$` (as Compose writes it); a
name that is not set is empty, and :attr:`m27.spec.Pipeline.unset_env` says where, for a
note. Only the file's own text is expanded: a `{{VAR}}`'s value is data, a `$` in it too.
Commands are not expanded here: without a shell a `$` is refused, with one the shell reads
it (docs/pipelines.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from m27.spec._template import Placeholder

#: `$$`, `${NAME}`, `${NAME:-default}`, `$NAME`; any other `$` stays as written
_REF = re.compile(
    r"\$(?:(?P<dollar>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


def expand(
    text: str, placeholders: Sequence[Placeholder], environ: Mapping[str, str]
) -> tuple[str, list[Placeholder], list[str]]:
    """`text` with the references in its written parts (not inside a placeholder) replaced
    from `environ`, its placeholders moved to where they now are, and the names that were
    not set (each once, in order)."""
    if "$" not in text:
        return text, list(placeholders), []
    unset: list[str] = []

    def value(m: re.Match[str]) -> str:
        if m["dollar"]:
            return "$"
        name = m["braced"] or m["bare"]
        if name in environ:
            return environ[name]
        if m["default"] is not None:
            return m["default"]
        if name not in unset:
            unset.append(name)
        return ""

    pieces: list[str] = []
    moved: list[Placeholder] = []
    length = pos = 0
    for ph in placeholders:
        written = _REF.sub(value, text[pos : ph.start])
        pieces += [written, text[ph.start : ph.end]]
        length += len(written)
        moved.append(Placeholder(ph.name, length, length + ph.end - ph.start))
        length += ph.end - ph.start
        pos = ph.end
    pieces.append(_REF.sub(value, text[pos:]))
    return "".join(pieces), moved, unset
