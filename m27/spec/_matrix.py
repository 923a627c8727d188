"""`matrix:`: one step entry, one step per combination of values (replicas, sweeps).

Ten replicas of an MD run were ten copies of one entry, or ten `m27 run -d --set SEED=N`
and a script around them. A step with ``matrix: {SEED: [1, 2, 3]}`` is checked and
rendered once per value, with `{{SEED}}` bound to it, as steps ``md.1``, ``md.2`` and
``md.3``; several keys give their product (the first key varies slowest, as in nested
loops). A step that depends on the entry's name waits on its instances: all of them, or,
when the waiting step has a matrix too, those whose shared keys have its own values
(``analyse.2`` waits on ``md.2`` alone), as Snakemake's wildcards pair files.
"""

from __future__ import annotations

import itertools
import re
from typing import TYPE_CHECKING

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from m27.paths import name_problem
from m27.spec._draft import Draft
from m27.spec._nodes import describe
from m27.spec._template import VAR_NAME, list_words, scan
from m27.units import QUOTE_MAX, listed, quoted

if TYPE_CHECKING:
    from m27.spec._check import Checker

#: Most steps one matrix may make: far above a lab's sweep, low enough that a typo
#: (`[1..1000]` in three keys) is an error and not a billion steps.
MATRIX_STEPS_MAX = 10_000
#: ... and all of a file's matrices together: a few lines of aliases (one list of 10,000
#: values, named by a thousand steps) made ten million steps.
MATRIX_TOTAL_MAX = 100_000
#: What a value may hold: it becomes part of a step name (`md.300K`).
_VALUE = re.compile(r"[A-Za-z0-9_.\-]+\Z")
_MERGE = "tag:yaml.org,2002:merge"
#: The matrix's key that lists combinations to leave out, as GitHub Actions' matrix does.
EXCLUDE = "exclude"
#: A value each run gives (`m27 deploy` of `vars: {SEEDS:}`): its steps are made then.
_LATER_TEXT = "{{each run}}"
_LATER = [_LATER_TEXT]
_EACH_RUN: list[dict[str, str]] = []


def matrix_node(node: Node) -> Node | None:
    """The value of `node`'s `matrix:` key, its own or merged (`<<: *defaults`), if it has
    one. The node is only read: the step checker flattens merges and reports problems."""
    if not isinstance(node, MappingNode):
        return None
    merged: list[Node] = []
    for key, value in node.value:
        if not isinstance(key, ScalarNode):
            continue
        if key.value == "matrix" and key.tag != _MERGE:
            own: Node = value
            return own
        if key.tag == _MERGE:
            merged += value.value if isinstance(value, SequenceNode) else [value]
    for source in merged:  # depth is bounded: the file's nesting limit holds for aliases
        if (found := matrix_node(source)) is not None:
            return found
    return None


def matrix_names(items: list[Node]) -> dict[str, str]:
    """Each name a step's matrix gives values to, with that step's name: `{{SEED}}` in
    another step is undefined, and the problem says whose it is."""
    names: dict[str, str] = {}
    for item in items:
        matrix = matrix_node(item)
        if not isinstance(matrix, MappingNode) or not isinstance(item, MappingNode):
            continue
        step = next(
            (v.value for k, v in item.value if isinstance(k, ScalarNode) and k.value == "name"),
            None,
        )
        for key, _ in matrix.value:
            if isinstance(key, ScalarNode) and isinstance(step, str) and key.value != EXCLUDE:
                names.setdefault(key.value, step)
    return names


def expand(checker: Checker, item: Node, index: int, where: str, node: Node) -> list[Draft]:
    """The drafts of a step entry with a matrix: one per combination, named
    ``NAME.VALUE[.VALUE...]``. A problem the entry has whatever the values is reported
    once, not once per instance. A matrix that cannot be read gives one draft under the
    entry's own name with its keys left out, so that the steps after it are still checked
    and no `{{KEY}}` is reported undefined. So does one whose values each run gives (`m27
    deploy`: its runs read the file with them), with `{{KEY}}` standing for itself."""
    path = f"{where}.matrix"
    cells = _cells(checker, node, path)
    if cells is _EACH_RUN:
        keys = [k.value for k, _ in node.value if k.value != EXCLUDE]  # _cells read it
        cells = [{k: "{{" + k + "}}" for k in keys}]
        for_each_run = True
    else:
        for_each_run = False
    if cells is None:
        if isinstance(node, MappingNode):  # its names stand for nothing now: not undefined
            checker.broken.update(k.value for k, _ in node.value if isinstance(k, ScalarNode))
        draft = checker.step_draft(item, index, where)
        return [] if draft is None else [draft]
    base = checker.values
    seen = set(checker.problems)
    drafts: list[Draft] = []
    named = True
    try:
        for cell in cells:
            checker.values = {**base, **cell}
            before = len(checker.problems)
            draft = checker.step_draft(item, index, where)
            fresh = [p for p in checker.problems[before:] if p not in seen]
            checker.problems[before:] = fresh
            seen.update(fresh)
            if draft is None:
                return drafts
            if draft.name is not None and not for_each_run:
                name = ".".join((draft.name, *cell.values()))
                if (why := name_problem(name)) is not None:
                    if named:  # once: each instance would say the same
                        checker.add(node, path, f"makes the step name {quoted(name)}, which {why}")
                    named = False
                draft.group, draft.name = draft.name, name
            draft.cell = cell
            drafts.append(draft)
    finally:
        checker.values = base
    return drafts


def _cells(checker: Checker, node: Node, where: str) -> list[dict[str, str]] | None:
    """Every combination of the matrix's values, in order; None after a problem, and
    `_EACH_RUN` for values a variable left to each run gives."""
    mapping = checker.mapping(node, where)
    if mapping is None:
        return None
    exclude = mapping.pop(EXCLUDE, None)
    if not mapping:
        checker.add(node, where, "the matrix is empty; give a name and its values, SEED: [1, 2]")
        return None
    axes: list[tuple[str, list[str]]] = []
    ok = True
    for key, (key_node, value) in mapping.items():
        path = f"{where}.{key[:QUOTE_MAX]}"
        values = _values(checker, key, key_node, value, path)
        if values is None:
            ok = False
        else:
            axes.append((key, values))
    if not ok:
        return None
    if any(values is _LATER for _, values in axes):
        return _EACH_RUN
    rules = [] if exclude is None else _exclusions(checker, exclude[1], axes, f"{where}.{EXCLUDE}")
    if rules is None:
        return None
    total = 1
    for _, values in axes:
        total *= len(values)
    if total > MATRIX_STEPS_MAX:
        sizes = " x ".join(str(len(v)) for _, v in axes)
        limit = f"one matrix may make {MATRIX_STEPS_MAX:,}"
        checker.add(node, where, f"makes {sizes} = {total:,} steps; {limit}")
        return None
    if checker.matrix_made > MATRIX_TOTAL_MAX:  # said at the matrix that passed it
        return None
    if checker.matrix_made + total > MATRIX_TOTAL_MAX:
        checker.add(
            node,
            where,
            f"makes {total:,} steps, and the matrices before it {checker.matrix_made:,}: "
            f"all of a file's matrices together may make {MATRIX_TOTAL_MAX:,}",
        )
        checker.matrix_made = MATRIX_TOTAL_MAX + 1  # said once: the next ones are left out
        return None
    keys = [k for k, _ in axes]
    combos = (dict(zip(keys, c, strict=True)) for c in itertools.product(*(v for _, v in axes)))
    cells = [c for c in combos if not any(r.items() <= c.items() for r in rules)]
    if not cells:
        if exclude is not None:
            checker.add(exclude[1], f"{where}.{EXCLUDE}", "it leaves out every combination")
        return None
    checker.matrix_made += len(cells)
    return cells


def _exclusions(
    checker: Checker, node: Node, axes: list[tuple[str, list[str]]], where: str
) -> list[dict[str, str]] | None:
    """`exclude:`, a list of mappings of matrix names to values: a combination that has
    all the values of one of them makes no step. None after a problem."""
    if not isinstance(node, SequenceNode):
        checker.add(
            node, where, f"must be a list of {{NAME: value}} mappings, got {describe(node)}"
        )
        return None
    names = [k for k, _ in axes]
    rules: list[dict[str, str]] = []
    for i, item in enumerate(node.value):
        path = f"{where}[{i}]"
        before = len(checker.problems) + checker.dropped
        mapping = checker.mapping(item, path, names)
        if mapping is None or len(checker.problems) + checker.dropped > before:  # a name typo
            return None
        rule = {}
        for key, (_, value) in mapping.items():
            text = checker.text(value, f"{path}.{key}")
            if text is None or (rendered := _rendered(checker, text, value, path)) is None:
                return None
            rule[key] = rendered
        if _LATER_TEXT not in rule.values():  # `m27 deploy`: each run's own values decide
            rules.append(rule)
    return rules


def _values(checker: Checker, key: str, key_node: Node, node: Node, where: str) -> list[str] | None:
    """One key's values: a list, or one string of them separated by blanks or commas
    (`"{{SEEDS}}"`, with `--set SEEDS="1 2 3"`); placeholders are put in either way."""
    if not VAR_NAME.match(key):
        checker.add(key_node, where, f"bad matrix name {quoted(key)} (use A-Z, 0-9, _)")
        return None
    if key in checker.declared:
        checker.add(key_node, where, f"{key} is also a variable under vars:; rename one of them")
        return None
    if key in checker.overrides:
        given = [ph.name for ph in scan(node.value)[0]] if isinstance(node, ScalarNode) else []
        how = (
            f'--set {given[0]}="..." gives its values'
            if given
            else f'to choose its values at the command line, write {key}: "{{{{{key}S}}}}" '
            f'and --set {key}S="1 2 3"'
        )
        checker.add(key_node, where, f"--set {key}=... gives a matrix name a value; {how}")
        return None
    if isinstance(node, SequenceNode):
        items = checker.texts(node, where)
        if items is None or len(items) != len(node.value):
            return None
        rendered = [_rendered(checker, text, item, path) for text, item, path in items]
        if any(r is None for r in rendered):
            return None
        if _LATER_TEXT in rendered:
            return _LATER
        values = [r for r in rendered if r is not None]
    elif isinstance(node, ScalarNode):
        text = checker.text(node, where)
        if text is None or (whole := _rendered(checker, text, node, where, lists=True)) is None:
            return None
        if whole == _LATER_TEXT:
            return _LATER
        values = list_words(whole)
    else:
        checker.add(node, where, f"must be a list of values, got {describe(node)}")
        return None
    if not values:
        checker.add(node, where, f"{key} has no values")
        return None
    for value in values:
        if not _VALUE.match(value):
            checker.add(
                node,
                where,
                f"value {quoted(value)} cannot be part of a step name: a matrix value "
                "may hold only letters, digits, '_', '.' and '-' (build paths from it in "
                "the step)",
            )
            return None
    if len(set(values)) < len(values):
        twice = sorted({v for v in values if values.count(v) > 1})
        checker.add(node, where, f"{key} has the same value twice: {listed(twice, 5)}")
        return None
    return values


def _rendered(
    checker: Checker, text: str, node: Node, where: str, lists: bool = False
) -> str | None:
    tpl = checker.template(node, where, text, lists)
    if any(ph.name in checker.unset for ph in tpl.placeholders):
        return _LATER_TEXT
    return checker.render_plain(tpl)
