"""From a YAML document to a Pipeline, collecting every problem on the way.

The checker reads the top level, then each step, then checks what spans steps (names,
dependencies, cycles, outputs). Each part goes on after a problem, so one run of
`m27 validate` lists everything to fix.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from yaml.nodes import MappingNode, Node, SequenceNode

from m27.paths import name_problem
from m27.spec._checkpoint import read_checkpoint
from m27.spec._command import Commands
from m27.spec._draft import Draft, build, cross_check
from m27.spec._environ import expanded
from m27.spec._limits import (
    GPUS_MAX,
    PRIORITY_LIMIT,
    RETRIES_MAX,
    SLURM_KEYS,
    fixed_prefix,
    outside,
    under,
    written_absolute,
)
from m27.spec._matrix import expand, matrix_names, matrix_node
from m27.spec._model import EXECUTORS, ON_CRASH, STEP_TYPES, Pipeline
from m27.spec._nodes import Template, describe, is_null, representable, suggest
from m27.spec._template import (
    VAR_NAME,
    substitute,
)
from m27.units import is_control, quoted

TOP_KEYS = (
    "name",
    "vars",
    "env",
    "priority",
    "workdir",
    "executor",
    "on_crash",
    "pipeline",
    "steps",
)
_STEP_KEYS_TEXT = (
    "name type command depends_on output checkpoint env retries retry_delay timeout priority gpus "
    "gpu_memory workdir shell executor slurm container binds allow_outside matrix"
)
STEP_KEYS = tuple(_STEP_KEYS_TEXT.split())
ENV_NAME = VAR_NAME


class Checker(Commands):
    def __init__(
        self,
        file: str,
        path: Path,
        overrides: Mapping[str, str],
        each_run: bool = False,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(file)
        self.environ = os.environ if environ is None else environ
        #: (line, field, name) of each `$NAME` the environment does not set (_environ)
        self.unset_env: list[tuple[int, str, str]] = []
        self.env_in_defaults = []
        self.each_run = each_run
        self.unset: list[str] = []
        self.path = path
        self.base = path.resolve().parent
        self.overrides = dict(overrides)
        self.env: dict[str, str] = {}
        self.priority = 0
        self.executor = "local"
        self.on_crash = "stop"
        self.workdir: str | None = None
        self.declared: set[str] = set()

    # -- top level -------------------------------------------------------------------

    def pipeline(self, root: Node | None) -> Pipeline | None:
        """The Pipeline, or None when any problem was found (they are in `.problems`)."""
        name = self.path.stem
        steps_node: Node | None = None
        list_key = "pipeline"
        top: dict[str, tuple[Node, Node]] = {}
        if root is None:
            self.problems.append(self._file_problem("the file is empty; expected `pipeline:`"))
        elif isinstance(root, SequenceNode):
            steps_node = root  # a bare list of steps
        elif isinstance(root, MappingNode):
            top = self.mapping(root, "", TOP_KEYS) or {}
            # an empty optional key (`env:` with nothing under it) means "not given"
            top = {k: v for k, v in top.items() if k in ("pipeline", "steps") or not is_null(v[1])}
        else:
            self.add(
                root,
                "",
                "the top level must be a mapping with `pipeline:` (a list of "
                f"steps), got {describe(root)}",
            )
        if top:
            name = self._pipeline_name(top) or name
        self._vars(top.get("vars"))
        if "priority" in top:
            self.priority = self._priority(top["priority"][1], "priority")
        if "executor" in top:
            self.executor = self._executor(top["executor"][1], "executor") or "local"
        if "on_crash" in top:
            self.on_crash = self._choice(top["on_crash"][1], "on_crash", ON_CRASH) or "stop"
        if "workdir" in top:
            self.workdir = self._path(top["workdir"][1], "workdir")
        if "env" in top:
            self.env = self._env(top["env"][1], "env")
        if isinstance(root, MappingNode):
            steps_node, list_key = self._steps_node(root, top)
        drafts = self._steps(steps_node, list_key)
        self._unused_sets()
        if self.problems:
            return None
        return Pipeline(
            name=name,
            path=self.path.resolve(),
            steps=tuple(
                build(d, self.env, self.priority, self.workdir, self.executor) for d in drafts
            ),
            # (a variable left to each run stands in for itself: not a value of the file's)
            vars=MappingProxyType({k: v for k, v in self.values.items() if k not in self.unset}),
            priority=self.priority,
            workdir=Path(self.workdir) if self.workdir else self.base,
            unset=tuple(k for k in self.unset if k in self.used),  # one no step uses: none
            unset_env=tuple(self.unset_env),
            env_in_defaults=tuple(self.env_in_defaults),
            lists=tuple(sorted(self.lists)),
            on_crash=self.on_crash,
        )

    def _pipeline_name(self, top: dict[str, tuple[Node, Node]]) -> str | None:
        if "name" not in top:
            return None
        value = self.plain(top["name"][1], "name")
        if value is not None and not (value.strip() and len(value) <= 200):
            self.add(top["name"][1], "name", "must be 1 to 200 characters, not only blanks")
            return None
        bad = value and next((c for c in value if is_control(c)), None)
        if bad:
            # The name is printed as it is by `m27 run`, `status` and Telegram: an escape
            # sequence in it would retitle the terminal or clear the screen of whoever looks.
            self.add(
                top["name"][1],
                "name",
                f"holds the control character U+{ord(bad):04X}; a pipeline's name is shown in "
                "terminals, logs and Prefect's UI, so it may hold only printable characters",
            )
            return None
        return value

    def _steps_node(self, root: Node, top: dict[str, tuple[Node, Node]]) -> tuple[Node | None, str]:
        if "pipeline" in top and "steps" in top:
            self.add(top["steps"][0], "steps", "use either `pipeline:` or `steps:`, not both")
        for key in ("pipeline", "steps"):
            if key in top:
                return top[key][1], key
        self.add(root, "", "missing `pipeline:` (the list of steps)")
        return None, "pipeline"

    def _steps(self, node: Node | None, key: str) -> list[Draft]:
        if node is None:
            return []
        if not isinstance(node, SequenceNode):
            hint = ""
            if isinstance(node, MappingNode):
                hint = "; write each step as a list item: `- name: <step>` and its keys under it"
            self.add(node, key, f"must be a list of steps, got {describe(node)}{hint}")
            return []
        if not node.value:
            self.add(node, key, "the pipeline has no steps")
        self.matrix_names = matrix_names(node.value)
        drafts: list[Draft] = []
        for i, item in enumerate(node.value):
            if (matrix := matrix_node(item)) is not None:
                drafts += expand(self, item, i, f"{key}[{i}]", matrix)
            elif (draft := self.step_draft(item, i, f"{key}[{i}]")) is not None:
                drafts.append(draft)
        cross_check(self, drafts, self.workdir or str(self.base))
        return drafts

    # -- one step --------------------------------------------------------------------

    def step_draft(self, node: Node, index: int, where: str) -> Draft | None:
        keys = self.mapping(node, where, STEP_KEYS)
        if keys is None:
            return None
        draft = Draft(index, node, where)
        draft.marks = {
            k: (n.start_mark.line + 1, n.start_mark.column + 1) for k, (_, n) in keys.items()
        }
        v = draft.values
        for required in ("name", "type", "command"):
            if required not in keys:
                self.add(node, f"{where}.{required}", f"missing required key {required!r}")
            elif is_null(keys[required][1]):
                self.add(keys[required][0], f"{where}.{required}", f"{required!r} has no value")

        def get(key: str) -> Node | None:
            entry = keys.get(key)
            return None if entry is None or is_null(entry[1]) else entry[1]

        if (n := get("name")) is not None and (name := self.text(n, f"{where}.name")) is not None:
            if (why := name_problem(name)) is None:
                draft.name, draft.name_node = name, n
            else:
                self.add(n, f"{where}.name", f"bad step name {quoted(name)}: {why}")
        if (n := get("type")) is not None and (kind := self.text(n, f"{where}.type")) is not None:
            if kind in STEP_TYPES:
                v["type"] = kind
            else:
                hint = suggest(kind, STEP_TYPES) or f" (use one of {', '.join(STEP_TYPES)})"
                self.add(n, f"{where}.type", f"unknown step type {quoted(kind)}{hint}")
        if (n := get("shell")) is not None:
            v["shell"] = self.boolean(n, f"{where}.shell") or False
        if (n := get("checkpoint")) is not None:
            v["checkpoint"] = read_checkpoint(self, n, f"{where}.checkpoint")
        if (n := get("timeout")) is not None:
            v["timeout"] = self.duration(n, f"{where}.timeout")
        if (n := get("retries")) is not None:
            v["retries"] = self.integer(n, f"{where}.retries", 0, RETRIES_MAX) or 0
        if (n := get("retry_delay")) is not None:
            v["retry_delay"] = self.duration(n, f"{where}.retry_delay")
            if not v.get("retries"):
                self.add(n, f"{where}.retry_delay", "waits between retries: set retries: N too")
        if (n := get("priority")) is not None:
            v["priority"] = self._priority(n, f"{where}.priority")
        if (n := get("executor")) is not None:
            v["executor"] = self._executor(n, f"{where}.executor")
        if (n := get("slurm")) is not None and self.mapping(n, f"{where}.slurm", SLURM_KEYS):
            v["slurm"] = MappingProxyType(self.raw(n, f"{where}.slurm") or {})
        if (n := get("container")) is not None:
            v["container"] = self._rendered(n, f"{where}.container")
        if (n := get("binds")) is not None:
            found = self.texts(n, f"{where}.binds") or []
            v["binds"] = tuple(b for _, i, p in found if (b := self._rendered(i, p)) is not None)
        if (n := get("allow_outside")) is not None:
            draft.allow_outside = bool(self.boolean(n, f"{where}.allow_outside"))
        if (n := get("workdir")) is not None:
            draft.workdir = self._path(n, f"{where}.workdir", draft.allow_outside)
        if (n := get("env")) is not None:
            v["env"] = self._env(n, f"{where}.env")
        if (n := get("depends_on")) is not None:
            draft.deps, draft.deps_node = self.texts(n, f"{where}.depends_on") or [], n
        if (n := get("output")) is not None:
            for text, item, path in self.texts(n, f"{where}.output") or []:
                tpl = expanded(self, self.template(item, path, text))
                rendered = self.render_plain(tpl)
                if rendered is not None and self._confined(
                    tpl, rendered, draft.workdir or self.workdir, draft.allow_outside
                ):
                    draft.outputs.append((self._literal_values(tpl) or rendered, item, path))
        self._gpus(get("gpus"), get("gpu_memory"), where, v)
        if (n := get("command")) is not None:
            self._command(n, f"{where}.command", v)
        return draft

    def _gpus(self, gpus: Node | None, memory: Node | None, where: str, v: dict[str, Any]) -> None:
        kind = v.get("type")
        count = 0 if kind == "cpu" else 1
        given = None if gpus is None else self.integer(gpus, f"{where}.gpus", 0, GPUS_MAX)
        if gpus is not None and given is not None:
            count = given
            if kind == "cpu" and given > 0:
                self.add(
                    gpus,
                    f"{where}.gpus",
                    f"a cpu step cannot use GPUs (gpus: {given}); use type: gpu or gpu_light",
                )
            elif kind in ("gpu", "gpu_light") and given == 0:
                self.add(
                    gpus,
                    f"{where}.gpus",
                    f"a {kind} step needs at least 1 GPU; use type: cpu for work without a GPU",
                )
        v["gpus"] = count
        if memory is not None:
            v["gpu_memory"] = self.size(memory, f"{where}.gpu_memory")
            if kind == "cpu":
                self.add(memory, f"{where}.gpu_memory", "a cpu step has no GPU memory to ask for")

    # -- shared field kinds ----------------------------------------------------------

    def _path(self, node: Node, where: str, allow_outside: bool = False) -> str | None:
        text = self.text(node, where)
        if text is None:
            return None
        tpl = expanded(self, self.template(node, where, text))
        rendered = self.render_plain(tpl)
        if rendered is None:
            return None
        if not rendered:
            unset = [f" (${n} is not set here)" for _, f, n in self.unset_env if f == where]
            self.add(node, where, "must not be empty" + "".join(unset[:1]))
            return None
        if not self._confined(tpl, rendered, None, allow_outside):
            return None
        return os.path.normpath(self.base / Path(rendered).expanduser())

    def _literal_values(self, tpl: Template) -> str | None:
        """An output with its values' `*`, `?` and `[` escaped (`run[1]` -> `run[[]1]`), or
        None when no value holds one: an output is a glob pattern only where the file says
        so, and `--set NAME=run[1]` made `{{NAME}}.pdb` match a stale `run1.pdb`."""
        values = {p.name: self.values[p.name] for p in tpl.placeholders}
        if not any(glob.has_magic(v) for v in values.values()):
            return None
        return substitute(
            tpl.text, tpl.placeholders, {k: glob.escape(v) for k, v in values.items()}
        )

    def _confined(self, tpl: Template, rendered: str, folder: str | None, allow: bool) -> bool:
        """True when the rendered path holds no NUL and stays under the pipeline's folder or
        `folder` (the step's workdir), or under the absolute folder written before any
        {{VAR}}; anywhere with allow_outside: true (docs/pipelines.md)."""
        if "\0" in rendered:
            self.add(
                tpl.node,
                tpl.field,
                "the path holds a NUL byte (written or from a variable)",
            )
            return False
        if not representable(rendered):
            self.add(tpl.node, tpl.field, "a variable's value is not valid text (lone surrogate)")
            return False
        path = os.path.normpath(os.path.join(folder or self.base, os.path.expanduser(rendered)))
        if allow:
            return True
        if written_absolute(tpl.text):
            first = tpl.placeholders[0].start if tpl.placeholders else None
            prefix = fixed_prefix(tpl.text, first)
            if under(path, [prefix]):
                return True
            why = f"a variable moves it out of {prefix!r}, the folder the file names"
        else:
            roots = [str(self.base), *([folder] if folder else [])]
            if under(path, roots):
                return True
            why = "outside the pipeline's folder" + (" and the step's workdir" if folder else "")
        names = list(dict.fromkeys(p.name for p in tpl.placeholders))
        given = [(n, self.values.get(n, "")) for n in names]
        self.add(tpl.node, tpl.field, outside(tpl.text, rendered, path, why, given))
        return False

    def _priority(self, node: Node, where: str) -> int:
        return self.integer(node, where, -PRIORITY_LIMIT, PRIORITY_LIMIT) or 0

    def _executor(self, node: Node, where: str) -> str | None:
        return self._choice(node, where, EXECUTORS, "executor")

    def _choice(
        self, node: Node, where: str, choices: tuple[str, ...], what: str = "value"
    ) -> str | None:
        value = self.text(node, where)
        if value is not None and value not in choices:
            hint = suggest(value, choices) or f" (use one of {', '.join(choices)})"
            self.add(node, where, f"unknown {what} {quoted(value)}{hint}")
            return None
        return value

    def _env(self, node: Node, where: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, (key_node, value) in (self.mapping(node, where) or {}).items():
            path = f"{where}.{key}"
            if not ENV_NAME.match(key):
                self.add(key_node, path, f"bad environment variable name {quoted(key)}")
                continue
            if (rendered := self._rendered(value, path)) is not None:
                out[key] = rendered
        return out

    def _rendered(self, node: Node, where: str) -> str | None:
        """A text with its `{{VAR}}`s and `$NAME`s put in, used as it is (an `env:` value,
        a container image, a bind); None when it has a problem (reported)."""
        text = self.text(node, where)
        if text is None:
            return None
        rendered = self.render_plain(expanded(self, self.template(node, where, text)))
        if rendered is not None and "\0" in rendered:
            self.add(node, where, "the value holds a NUL byte (written or from a variable)")
            return None
        return rendered
