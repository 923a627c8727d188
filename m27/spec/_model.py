"""The validated pipeline: what the flow, the agent and the runner read.

Everything here is already checked and rendered; a `Pipeline` only exists if its file had
no problem at all, so consumers never re-validate.
"""

from __future__ import annotations

import functools
import heapq
import os
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from m27.paths import matches
from m27.units import closest, listed

STEP_TYPES = ("cpu", "gpu", "gpu_light")
EXECUTORS = ("local", "slurm")
#: what the node service does with a run of the pipeline that crashed (`on_crash:`)
ON_CRASH = ("stop", "resume")

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_NO_MARKS: Mapping[str, tuple[int, int]] = MappingProxyType({})


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a pipeline file, where it is, and how to fix it."""

    file: str
    line: int
    column: int
    field: str
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.line > 0:  # a step's own line has no column (checks after parsing)
            where += f":{self.line}:{self.column}" if self.column > 0 else f":{self.line}"
        prefix = f"{where}: {self.field}" if self.field else where
        return f"{prefix}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "field": self.field,
            "message": self.message,
        }


@dataclass(frozen=True)
class Step:
    """One step, rendered: `argv` is what to start, `command` what the user wrote."""

    name: str
    type: str
    command: str | tuple[str, ...]
    argv: tuple[str, ...]
    depends_on: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    checkpoint: float | None = None
    #: a self-checkpointing program's files (globs under the workdir), resume arguments
    #: and checkpoint signal, as `checkpoint:` gave them (recipes fill in the rest)
    checkpoint_files: tuple[str, ...] = ()
    checkpoint_resume: tuple[str, ...] | None = None
    checkpoint_signal: str | None = None
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    retries: int = 0
    #: seconds between a failed attempt and the next (its GPUs serve others meanwhile)
    retry_delay: float = 0.0
    timeout: float | None = None
    priority: int = 0
    gpus: int = 0
    gpu_memory: int | None = None
    workdir: str | None = None
    shell: bool = False
    executor: str = "local"
    slurm: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    container: str | None = None
    binds: tuple[str, ...] = ()
    line: int = 0
    #: the entry's field path (`pipeline[2]`), and each key it gives -> (line, column) of
    #: its value: checks made after parsing (the node's GPUs) point where the file says it
    where: str = ""
    marks: Mapping[str, tuple[int, int]] = field(default_factory=lambda: _NO_MARKS)
    #: the entry's own name, for a step a `matrix:` made (`md` for `md.1`)
    group: str | None = None

    @property
    def uses_gpu(self) -> bool:
        return self.type != "cpu"


@dataclass(frozen=True)
class Pipeline:
    """A valid pipeline: steps in file order, effective variables, where it lives."""

    name: str
    path: Path
    steps: tuple[Step, ...]
    vars: Mapping[str, str]
    priority: int = 0
    workdir: Path = Path(".")
    #: variables `vars:` declares without a value, left to each run: only a load with
    #: ``each_run=True`` (`m27 deploy`) has any, and their placeholders stay as written
    unset: tuple[str, ...] = ()
    #: (line, field, name) of each `$NAME` (m27.spec._environ) that the environment m27
    #: read the file in does not set (it became empty: a note)
    unset_env: tuple[tuple[int, str, str], ...] = ()
    #: (line, field, name) of each `$NAME` a `vars:` default holds: a value is data, so it
    #: is not read from the environment (a note)
    env_in_defaults: tuple[tuple[int, str, str], ...] = ()
    #: list variables (`TEMPS: [300, 310]`): their values are one text, blank- or
    #: comma-separated, in `vars` and in what a run is given
    lists: tuple[str, ...] = ()
    #: `on_crash:`: "resume" has the node service resume a run of it that crashed (its
    #: process died: a power cut, a reboot, the OOM killer), "stop" leaves that to a person
    on_crash: str = "stop"

    def step(self, name: str) -> Step:
        found = self._by_name.get(name)
        if found is None:
            raise KeyError(f"pipeline {self.name!r} has no step {name!r}")
        return found

    @functools.cached_property
    def _by_name(self) -> dict[str, Step]:
        """Steps by name, made once: a run looks each step up, and looking through them
        all made that quadratic in a pipeline's length."""
        return {s.name: s for s in self.steps}

    def workdir_of(self, step: Step) -> Path:
        """Where `step` runs: its own `workdir:`, else the pipeline's."""
        return Path(step.workdir) if step.workdir else self.workdir

    def output_paths(self) -> list[str]:
        """Every step's declared outputs as absolute paths: a step's are relative to its
        workdir, else to the pipeline's (where the runner looks for them)."""
        return [
            os.path.normpath(os.path.join(step.workdir or self.workdir, os.path.expanduser(out)))
            for step in self.steps
            for out in step.outputs
        ]

    def missing_outputs(self, name: str) -> list[str]:
        """`name`'s declared outputs that are not there now (a pattern: nothing matches)."""
        step = self.step(name)
        base = self.workdir_of(step)
        return [out for out in step.outputs if not matches(base / os.path.expanduser(out))]

    def rerun_for_outputs(self, done: Collection[str]) -> dict[str, list[str]]:
        """The steps of `done` (succeeded before: a resume skips them) that must run again,
        each with its outputs that are gone: those a step that runs depends on. Skipped,
        it would leave that step to fail on a missing input (`cat: a.txt: No such file`)
        or, worse, succeed on whatever else it finds. A done step whose output only done
        steps used stays done: running it again would only cost time."""
        again: dict[str, list[str]] = {}
        checked: set[str] = set()
        todo = [s.name for s in self.steps if s.name not in done]
        while todo:
            for dep in self.step(todo.pop()).depends_on:
                if dep not in done or dep in checked:
                    continue
                checked.add(dep)
                if gone := self.missing_outputs(dep):
                    again[dep] = gone
                    todo.append(dep)  # and what it needs in turn
        if not again:
            return again
        return {name: again[name] for name in self.topo_order() if name in again}

    def topo_order(self) -> list[str]:
        """Step names so that every step comes after its dependencies; ties in file order."""
        return topo_order((s.name, s.depends_on) for s in self.steps)

    def rerun_steps(self, names: Iterable[str]) -> list[str]:
        """`names` and every step that waits on one of them, in run order: what `m27 run
        --resume R --rerun NAME` runs again, from the start (a step after NAME reads what
        NAME writes anew). KeyError naming the pipeline's steps for a name it lacks."""
        chosen: set[str] = set()
        groups: dict[str, list[str]] = {}
        for s in self.steps:
            if s.group is not None:
                groups.setdefault(s.group, []).append(s.name)
        for name in names:
            if name in groups and name not in self._by_name:  # a matrix step: every instance
                for member in groups[name]:
                    chosen |= {member, *self.dependents(member)}
                continue
            if name not in self._by_name:
                hint = closest(name, self._by_name)
                maybe = f"did you mean {hint!r}? " if hint else ""
                shown = listed((s.name for s in self.steps), 20)
                raise KeyError(
                    f"pipeline {self.name!r} has no step {name!r} ({maybe}its steps: {shown})"
                )
            chosen |= {name, *self.dependents(name)}
        return [n for n in self.topo_order() if n in chosen]

    def dependents(self, name: str) -> set[str]:
        """Every step that waits, directly or not, on `name` (what a failure of it blocks)."""
        self.step(name)
        direct: dict[str, set[str]] = {s.name: set() for s in self.steps}
        for s in self.steps:
            for dep in s.depends_on:
                direct[dep].add(s.name)
        seen: set[str] = set()
        todo = [name]
        while todo:
            for child in direct[todo.pop()]:
                if child not in seen:
                    seen.add(child)
                    todo.append(child)
        return seen


def topo_order(graph: Iterable[tuple[str, tuple[str, ...]]]) -> list[str]:
    """Kahn's order, picking the earliest step in file order among the ready ones.

    A heap of file positions keeps it O(n log n): 100,000 steps order in well under a
    second, in any order they are listed.
    """
    nodes = list(graph)
    position = {name: i for i, (name, _) in enumerate(nodes)}
    waiting = {name: len(set(deps)) for name, deps in nodes}
    children: dict[str, list[str]] = {name: [] for name, _ in nodes}
    for name, deps in nodes:
        for dep in set(deps):
            children[dep].append(name)
    ready = [position[name] for name, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        name = nodes[heapq.heappop(ready)][0]
        order.append(name)
        for child in children[name]:
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, position[child])
    if len(order) < len(nodes):
        raise ValueError("dependency cycle")  # validation rejects cycles before this
    return order


def find_cycles(graph: Mapping[str, tuple[str, ...]]) -> list[list[str]]:
    """One cycle per strongly connected group of steps (self-loops excluded), as paths
    `[a, b, c, a]` that start at the group's first step in file order.

    Tarjan's algorithm with an explicit stack: a parameter sweep's 5000-step chain or
    cycle must not meet Python's recursion limit.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work: list[tuple[str, Iterator[str]]] = [(root, iter(graph[root]))]
        while work:
            node, deps = work[-1]
            for dep in deps:
                if dep not in graph or dep == node:
                    continue
                if dep not in index:
                    index[dep] = low[dep] = len(index)
                    stack.append(dep)
                    on_stack.add(dep)
                    work.append((dep, iter(graph[dep])))
                    break
                if dep in on_stack:
                    low[node] = min(low[node], index[dep])
            else:  # every dependency of `node` is done
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    group: set[str] = set()
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        group.add(top)
                        if top == node:
                            break
                    if len(group) > 1:
                        groups.append(group)
    position = {name: i for i, name in enumerate(graph)}
    cycles = []
    for group in sorted(groups, key=lambda g: min(position[n] for n in g)):
        start = min(group, key=position.__getitem__)
        cycles.append(_path_back(graph, group, start))
    return cycles


def _path_back(graph: Mapping[str, tuple[str, ...]], group: set[str], start: str) -> list[str]:
    """A shortest path start -> ... -> start inside one strongly connected group."""
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt: list[str] = []
        for node in frontier:
            for dep in graph[node]:
                if dep == start:
                    path = [start]
                    while node != start:
                        path.append(node)
                        node = parents[node]
                    return [start, *reversed(path[1:]), start]
                if dep in group and dep not in parents and dep != start:
                    parents[dep] = node
                    nxt.append(dep)
        frontier = nxt
    raise AssertionError("a strongly connected group always has a cycle")  # pragma: no cover
