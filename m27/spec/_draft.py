"""What one step's entry said (`Draft`), and the checks that need every step at once."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from yaml.nodes import Node

from m27.spec._checkpoint import CheckpointField
from m27.spec._model import Step, find_cycles
from m27.spec._nodes import Reader, suggest
from m27.units import quoted

#: Most dependencies `depends_on` of matrix steps may make in one file: 1,000 steps that
#: each wait on all of 1,000 others, far beyond a real pipeline, validate in seconds.
_PAIRED_MAX = 1_000_000


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
    #: an instance of a `matrix:` entry: the entry's name, and its values of the keys
    group: str | None = None
    cell: dict[str, str] = field(default_factory=dict)
    #: each key the entry gives -> (line, column) of its value, for checks after parsing
    marks: dict[str, tuple[int, int]] = field(default_factory=dict)


def cross_check(reader: Reader, drafts: list[Draft], base: str) -> None:
    """Checks across steps: unique names, known dependencies without cycles, no two steps
    writing one output (relative outputs are under a step's workdir, else `base`)."""
    first: dict[str, Draft] = {}
    groups: dict[str, list[Draft]] = {}
    for d in drafts:
        if d.group is not None:
            groups.setdefault(d.group, []).append(d)
    for d in drafts:
        if d.name is None or d.name_node is None:
            continue
        if d.name in first:
            line = first[d.name].node.start_mark.line + 1
            message = f"duplicate step name {quoted(d.name)} (first defined on line {line})"
            reader.add(d.name_node, f"{d.where}.name", message)
        elif d.name in groups:
            line = groups[d.name][0].node.start_mark.line + 1
            message = (
                f"duplicate step name {quoted(d.name)}: the matrix step on line {line} is "
                "called so (a step that depends on it waits on its instances)"
            )
            reader.add(d.name_node, f"{d.where}.name", message)
        else:
            first[d.name] = d
    graph: dict[str, tuple[str, ...]] = {}
    pairs = _Pairs(groups)
    edges, said = 0, False  # dependencies `depends_on: <matrix step>` made, all together
    for d in drafts:
        deps: dict[str, None] = {}  # ordered, and a repeat found in O(1): a step of 2,000
        for dep, node, path in d.deps:  # dependencies made a list's `in` cost seconds
            if dep in (d.name, d.group):
                reader.add(node, path, f"step {quoted(dep)} cannot depend on itself")
            elif dep in groups and dep not in first:
                if not (members := pairs.members(dep, d.cell)):
                    shared = {k: v for k, v in d.cell.items() if k in groups[dep][0].cell}
                    which = ", ".join(f"{k}={v}" for k, v in shared.items())
                    reader.add(node, path, f"no instance of matrix step {quoted(dep)} has {which}")
                edges += len(members)
                if edges > _PAIRED_MAX:
                    if not said:
                        message = (
                            f"its dependencies on matrix steps come to more than "
                            f"{_PAIRED_MAX:,}: give the steps a matrix name in common, so "
                            "that each waits on its own, or a step between them"
                        )
                        reader.add(node, path, message)
                    said = True
                    continue
                deps.update(dict.fromkeys(m.name for m in members if m.name is not None))
            elif dep not in first:
                known = {**first, **groups}
                hint = suggest(dep, known) or (f" (steps: {', '.join(known)})" if known else "")
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


class _Pairs:
    """The instances of a matrix step that a step with values `cell` waits on: those that
    agree with it on every name both have (all of them when they share none), found in a
    table by those values: comparing each of 5,000 steps with each of 10,000 took a
    minute."""

    def __init__(self, groups: dict[str, list[Draft]]) -> None:
        self.groups = groups
        self.tables: dict[tuple[str, tuple[str, ...]], dict[tuple[str | None, ...], list[Draft]]]
        self.tables = {}

    def members(self, group: str, cell: dict[str, str]) -> list[Draft]:
        members = self.groups[group]
        keys = tuple(k for k in members[0].cell if k in cell)
        if not keys:
            return members
        table = self.tables.get((group, keys))
        if table is None:
            table = {}
            for m in members:
                table.setdefault(tuple(m.cell.get(k) for k in keys), []).append(m)
            self.tables[(group, keys)] = table
        return table.get(tuple(cell[k] for k in keys), [])


def _output_clashes(reader: Reader, drafts: list[Draft], base: str) -> None:
    writers: dict[str, tuple[Draft, Node]] = {}
    told: set[tuple[str, str]] = set()  # (matrix step, output): said once, not per instance
    for d in drafts:
        step_base = d.workdir or base
        for out, node, path in d.outputs:
            key = os.path.normpath(os.path.join(step_base, os.path.expanduser(out)))
            if key in writers and writers[key][0] is not d:
                other, other_node = writers[key]
                if d.group is not None and other.group == d.group:
                    if (d.group, out) in told:
                        continue
                    told.add((d.group, out))
                    keys = " ".join("{{" + k + "}}" for k in d.cell)
                    message = (
                        f"every instance of matrix step {d.group!r} writes {quoted(out)}; put "
                        f"its matrix value in the path ({keys}) or in its workdir"
                    )
                    reader.add(node, path, message)
                    continue
                reader.add(
                    node,
                    path,
                    f"output {quoted(out)} is also written by step "
                    f"{other.name!r} (line {other_node.start_mark.line + 1}); "
                    "two steps cannot write the same output",
                )
            writers.setdefault(key, (d, node))


def build(d: Draft, env: dict[str, str], priority: int, workdir: str | None, executor: str) -> Step:
    """The Step a draft without problems describes, with the pipeline's defaults (its
    `env:`, `priority:`, `workdir:` and `executor:`) under the step's own."""
    v = d.values
    ckpt: CheckpointField | None = v.get("checkpoint")
    return Step(
        name=d.name or "",
        type=v["type"],
        command=v["command"],
        argv=v["argv"],
        depends_on=v.get("depends_on", ()),
        outputs=tuple(out for out, _, _ in d.outputs),
        checkpoint=ckpt.every if ckpt else None,
        checkpoint_files=ckpt.files if ckpt else (),
        checkpoint_resume=ckpt.resume if ckpt else None,
        checkpoint_signal=ckpt.signal if ckpt else None,
        env=MappingProxyType({**env, **v.get("env", {})}),
        retries=v.get("retries", 0),
        retry_delay=v.get("retry_delay") or 0.0,
        timeout=v.get("timeout"),
        priority=priority + v.get("priority", 0),
        gpus=v["gpus"],
        gpu_memory=v.get("gpu_memory"),
        workdir=d.workdir or workdir,
        shell=v.get("shell", False),
        executor=v.get("executor") or executor,
        slurm=v.get("slurm", MappingProxyType({})),
        container=v.get("container"),
        binds=v.get("binds", ()),
        line=d.node.start_mark.line + 1,
        where=d.where,
        marks=MappingProxyType(d.marks),
        group=d.group,
    )
