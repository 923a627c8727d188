"""What one step's entry said (`Draft`), and the checks that need every step at once."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from yaml.nodes import Node

from m27.spec._model import find_cycles
from m27.spec._nodes import Reader, suggest
from m27.units import quoted


@dataclass
class Draft:
    """What one step's entry said, as far as it could be read."""

    index: int
    node: Node
    where: str
    name: str | None = None
    name_node: Node | None = None
    deps: list[tuple[str, Node, str]] = field(default_factory=list)
    deps_node: Node | None = None
    outputs: list[tuple[str, Node, str]] = field(default_factory=list)
    workdir: str | None = None
    allow_outside: bool = False
    values: dict[str, Any] = field(default_factory=dict)


def cross_check(reader: Reader, drafts: list[Draft], base: str) -> None:
    """Checks across steps: unique names, known dependencies without cycles, no two steps
    writing one output (relative outputs are under a step's workdir, else `base`)."""
    first: dict[str, Draft] = {}
    for d in drafts:
        if d.name is None or d.name_node is None:
            continue
        if d.name in first:
            line = first[d.name].node.start_mark.line + 1
            message = f"duplicate step name {quoted(d.name)} (first defined on line {line})"
            reader.add(d.name_node, f"{d.where}.name", message)
        else:
            first[d.name] = d
    graph: dict[str, tuple[str, ...]] = {}
    for d in drafts:
        deps: dict[str, None] = {}  # ordered, and a repeat found in O(1): a step of 2,000
        for dep, node, path in d.deps:  # dependencies made a list's `in` cost seconds
            if dep == d.name:
                reader.add(node, path, f"step {quoted(dep)} cannot depend on itself")
            elif dep not in first:
                hint = suggest(dep, first) or (f" (steps: {', '.join(first)})" if first else "")
                reader.add(node, path, f"unknown dependency {quoted(dep)}{hint}")
            else:
                deps[dep] = None
        d.values["depends_on"] = tuple(deps)
        if d.name is not None and first.get(d.name) is d:
            graph[d.name] = tuple(deps)
    for cycle in find_cycles(graph):
        d = first[cycle[0]]
        reader.add(
            d.deps_node or d.node,
            f"{d.where}.depends_on",
            "dependency cycle: " + " -> ".join(cycle),
        )
    _output_clashes(reader, drafts, base)


def _output_clashes(reader: Reader, drafts: list[Draft], base: str) -> None:
    writers: dict[str, tuple[Draft, Node]] = {}
    for d in drafts:
        step_base = d.workdir or base
        for out, node, path in d.outputs:
            key = os.path.normpath(os.path.join(step_base, os.path.expanduser(out)))
            if key in writers and writers[key][0] is not d:
                other, other_node = writers[key]
                reader.add(
                    node,
                    path,
                    f"output {quoted(out)} is also written by step "
                    f"{other.name!r} (line {other_node.start_mark.line + 1}); "
                    "two steps cannot write the same output",
                )
            writers.setdefault(key, (d, node))
