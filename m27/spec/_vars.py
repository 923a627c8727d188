"""`vars:` and `--set`: the values placeholders take, and the mistakes made with them."""

from __future__ import annotations

from yaml.nodes import Node, SequenceNode

from m27.spec._environ import references
from m27.spec._model import Problem
from m27.spec._nodes import Reader, is_null, suggest
from m27.spec._template import VAR_NAME, list_words, scan
from m27.units import QUOTE_MAX, listed, quoted


class Variables(Reader):
    """The checker's part that reads `vars:` and checks `--set` against it."""

    overrides: dict[str, str]
    #: leave the variables declared without a value to each run (`m27 deploy`): they stand
    #: for themselves, `{{NAME}}`, and are listed in `unset`
    each_run: bool = False
    unset: list[str]
    #: (line, field, name) of each `$NAME` a default holds: values are data, so it stays
    #: as written (a note: m27.spec._environ)
    env_in_defaults: list[tuple[int, str, str]]

    def _file_problem(self, message: str) -> Problem:
        return Problem(self.file, 1, 1, "", message)

    def _set_problem(self, message: str) -> Problem:
        """A `--set` on the command line: the file has no line to point at."""
        return Problem(self.file, 0, 0, "", message)

    def _vars(self, entry: tuple[Node, Node] | None) -> None:
        defaults: dict[str, tuple[str, Node]] = {}
        mapping = self.mapping(entry[1], "vars") if entry else {}
        for key, (key_node, value) in (mapping or {}).items():
            if not VAR_NAME.match(key):
                message = f"bad variable name {quoted(key)} (use A-Z, 0-9, _)"
                self.add(key_node, f"vars.{key[:QUOTE_MAX]}", message)
            elif isinstance(value, SequenceNode):
                words = self._list(value, f"vars.{key}")
                if words is not None:
                    defaults[key] = (" ".join(words), value)
                    self.lists.add(key)
                else:
                    self.broken.add(key)
            elif not is_null(value):  # null declares a variable that has no default
                text = self.text(value, f"vars.{key}")
                if text is not None:
                    defaults[key] = (text, value)
                else:
                    self.broken.add(key)  # reported once here, not again at each use
        for key in self.overrides:
            if not VAR_NAME.match(key):
                self.problems.append(
                    self._set_problem(
                        f"--set {key[:QUOTE_MAX]}=...: bad variable name {quoted(key)}"
                    )
                )
        self.values = {**{k: text for k, (text, _) in defaults.items()}, **self.overrides}
        self.declared = set(mapping or {})
        self.unset = []
        if self.each_run:
            for key in mapping or {}:
                if key not in self.values and key not in self.broken and VAR_NAME.match(key):
                    self.values[key] = "{{" + key + "}}"
                    self.unset.append(key)
        for key, (text, node) in defaults.items():
            if key not in self.overrides:
                self._default_names_a_variable(key, text, node)
                line = node.start_mark.line + 1
                self.env_in_defaults += [(line, f"vars.{key}", n) for n in references(text)]

    def _list(self, node: SequenceNode, where: str) -> list[str] | None:
        """A list variable's values (`TEMPS: [300, 310, 320]`): kept as one text, blank-
        separated, as `--set TEMPS="300 310"` gives them, so a value may hold no blank or
        comma (they would split it)."""
        items = self.texts(node, where)
        if items is None or len(items) != len(node.value):
            return None
        if not items:
            self.add(node, where, "the list is empty: give it at least one value")
            return None
        for text, item, path in items:
            if not text or list_words(text) != [text]:
                self.add(
                    item,
                    path,
                    f"{quoted(text)}: a value of a list variable cannot be empty or hold "
                    "blanks or commas (they separate its values, as in `--set NAME=a,b`)",
                )
                return None
        return [text for text, _, _ in items]

    def _default_names_a_variable(self, key: str, text: str, node: Node) -> None:
        """`TPR: "{{OUT}}/sim.tpr"` validated, and the steps got `{{OUT}}/sim.tpr` as
        written: a default is not a template (substitution is one pass). A placeholder
        naming none of the file's variables stays literal text, as it always did."""
        names = self.declared | set(self.overrides)
        for ph in scan(text)[0]:
            if ph.name in names:
                self.add(
                    node,
                    f"vars.{key}",
                    f"its default names {{{{{ph.name}}}}}, but a default is not a template: "
                    f"the steps would get {quoted(text)} as written; put it in the step's field "
                    "instead, or write the value out",
                )
                return

    def _unused_sets(self) -> None:
        """`--set STEP=5000` for a pipeline with `STEPS`: an error, not a value ignored."""
        undefined = self.used - set(self.values)  # those are reported at their use
        for key in sorted(set(self.overrides) - self.declared - self.used):
            if VAR_NAME.match(key) and not suggest(key, undefined):
                known = sorted(self.declared | self.used)
                hint = suggest(key, known) or (
                    f" (its variables: {listed(known, 10)})" if known else " (it has none)"
                )
                message = f"--set {key}=...: the pipeline has no variable {key!r}{hint}"
                self.problems.append(self._set_problem(message))
