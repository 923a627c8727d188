"""A step's `command:`: its arguments, with the variables put in as data.

Without a shell the command is split as written, and each value put into the argument it
stands in (a list variable standing alone gives one argument per value); with `shell:
true` each value is single-quoted where m27.spec._shell proved the quotes hold. Either
way the result must be a command Linux can start (no NUL byte, within ARG_MAX).
"""

from __future__ import annotations

import os
from typing import Any

from yaml.nodes import Node, SequenceNode

from m27.spec._limits import ARG_BYTES_MAX
from m27.spec._nodes import LIST_ONLY, Template
from m27.spec._shell import unsafe_placeholders, unshelled
from m27.spec._template import (
    Placeholder,
    bare_word,
    list_words,
    render_argv,
    render_shell,
    split_template,
    substitute,
)
from m27.spec._vars import Variables

SHELL = "/bin/sh"
#: This machine's limit on a command line and its environment together (ARG_MAX).
_ARG_MAX = os.sysconf("SC_ARG_MAX")


class Commands(Variables):
    """The checker's part that reads a step's command."""

    def _command(self, node: Node, where: str, v: dict[str, Any]) -> None:
        shell = bool(v.get("shell"))
        if isinstance(node, SequenceNode):
            items = self.texts(node, where) or []
            v["command"] = tuple(t for t, _, _ in items)
            if shell:
                self.add(node, where, "shell: true needs the command as one string, not a list")
            elif not node.value:
                self.add(node, where, "the command is empty")
            elif len(items) == len(node.value):
                parts = [self._item(t, n, p) for t, n, p in items]
                if all(p is not None for p in parts):
                    argv = [arg for part in parts if part is not None for arg in part]
                    v["argv"] = self._checked_argv(node, where, argv)
            return
        text = self.text(node, where)
        if text is None:
            return
        v["command"] = text
        if not text.strip():
            self.add(node, where, "the command is empty")
            return
        tpl = self.template(node, where, text, lists=not shell)
        if shell:
            for index, reason in unsafe_placeholders(text, tpl.placeholders).items():
                ph = tpl.placeholders[index]
                tpl.ok = False
                self.add(node, where, f"{text[ph.start : ph.end]} {reason}", ph.start)
            if tpl.ok:
                script = render_shell(text, tpl.placeholders, self.values)
                v["argv"] = self._checked_argv(node, where, [SHELL, "-c", script])
            return
        words = self.split_words(node, where, text, tpl, "the command")
        if words is None:
            return
        if not words:
            self.add(node, where, "the command is empty")
        else:
            v["argv"] = self._checked_argv(node, where, list(words))

    def _item(self, text: str, node: Node, where: str) -> list[str] | None:
        """One item of a list command: one argument, or a list variable's values when the
        item is that variable's placeholder alone."""
        tpl = self.template(node, where, text, lists=True)
        whole = [ph for ph in tpl.placeholders if (ph.start, ph.end) == (0, len(text))]
        for ph in tpl.placeholders:
            if ph.name in self.lists and ph not in whole:
                self.add(node, where, f"{{{{{ph.name}}}}} {LIST_ONLY}", ph.start)
                return None
        if whole and whole[0].name in self.lists:
            return self._list_values(node, where, whole[0]) if tpl.ok else None
        rendered = self.render_plain(tpl)
        return None if rendered is None else [rendered]

    def _list_values(self, node: Node, where: str, ph: Placeholder) -> list[str] | None:
        words = list_words(self.values[ph.name])
        if not words:
            self.add(
                node,
                where,
                f"{{{{{ph.name}}}}} has no values: give them as `--set {ph.name}=a,b`",
                ph.start,
            )
            return None
        return words

    def split_words(
        self, node: Node, where: str, text: str, tpl: Template, what: str
    ) -> tuple[str, ...] | None:
        """`text` as arguments, as a command without a shell: split first, then each
        value put in (one argument whatever it holds); None after a problem."""
        try:
            split_template(text, tpl.placeholders)
        except ValueError as exc:
            self.add(node, where, f"cannot split {what} into arguments: {exc}")
            return None
        if (syntax := unshelled(text)) is not None:
            self.add(node, where, syntax[1], syntax[0])
            return None
        if not tpl.ok:
            return None
        for ph in tpl.placeholders:
            if ph.name not in self.lists:
                continue
            if not bare_word(text, ph):
                self.add(node, where, f"{{{{{ph.name}}}}} {LIST_ONLY}", ph.start)
                return None
            if self._list_values(node, where, ph) is None:
                return None
        words = render_argv(text, tpl.placeholders, self.values, self.lists)
        if "\0" in "\1".join(words):  # one scan, not one per argument
            self.add(
                node,
                where,
                f"{what} holds a NUL byte (written or from a variable)",
            )
            return None
        return words

    def _checked_argv(self, node: Node, where: str, argv: list[str]) -> tuple[str, ...] | None:
        if "\0" in "\1".join(argv):  # one scan, not one per argument
            self.add(
                node,
                where,
                "the command holds a NUL byte (written or from a variable)",
            )
            return None
        if not argv[0]:
            self.add(node, where, "the program name is empty after substitution")
            return None
        for i, arg in enumerate(argv):
            size = len(arg) if len(arg) * 4 < ARG_BYTES_MAX else len(os.fsencode(arg))
            if size >= ARG_BYTES_MAX:
                what = "the script" if argv[:2] == [SHELL, "-c"] and i == 2 else f"argument {i}"
                self.add(
                    node,
                    where,
                    f"{what} is {size:,} bytes; Linux starts no program with one argument of "
                    f"{ARG_BYTES_MAX // 1024} KiB or more (Argument list too long): pass large "
                    "data in a file",
                )
                return None
        total = sum(len(arg) + 1 for arg in argv)  # characters: a floor of the bytes
        if total >= _ARG_MAX:
            self.add(
                node,
                where,
                f"the command's {len(argv):,} arguments take {total:,} bytes or more; Linux "
                f"starts no program whose arguments and environment exceed {_ARG_MAX:,} bytes "
                "here (Argument list too long): pass large data in a file",
            )
            return None
        return tuple(argv)

    def render_plain(self, tpl: Template) -> str | None:
        if not tpl.ok:
            return None
        return substitute(tpl.text, tpl.placeholders, self.values)
