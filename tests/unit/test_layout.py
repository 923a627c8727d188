"""The house rules of the source tree, read from the import statements (AST, nothing imported).

Every ``import`` and ``from ... import`` in ``m27/`` and ``flows/`` counts, at any depth:
module level, inside functions (a lazy import is still a dependency), and under
``if TYPE_CHECKING:``. The rules, each named in a failure as ``file:line: [rule] ...``:

- ``cycle``: no import cycle between m27 modules. Importing ``a.b.c`` also runs the
  ``__init__`` of ``a`` and ``a.b`` unless the importer already lives inside them (its own
  ancestors are initialised before it), so those edges count. Imports under
  ``TYPE_CHECKING`` do not count here: they never run, so they cannot form a runtime cycle
  (they still count for privacy and layers, which are about what a module knows).
- ``private-module``: a private module ``pkg/_x.py`` is imported only from ``pkg`` and
  its subpackages.
- ``private-name``: a private name ``_x`` of module ``M`` is used (imported, or read as
  ``M._x``) only by modules of ``M``'s own package; a subpackage needs a public name.
- ``third-party-private``: another project's private module or name (Prefect's runner
  internals) is used only in :data:`THIRD_PARTY_GATE` (``m27/lab/_prefect.py``), where a
  source-hash test watches it.
- ``flows-public``: ``flows/`` imports only public m27 names (no ``_`` part anywhere).
- ``top-level``: ``m27/`` holds at most :data:`MAX_TOP_LEVEL` modules besides its
  subpackages and ``__init__``.
- ``layer``: dependencies point one way, down :data:`LAYERS`; inside one layer, subpackages
  do not import each other unless :data:`SIDEWAYS` says why.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("m27", "flows")
MAX_TOP_LEVEL = 12
THIRD_PARTY_GATE = "m27.lab._prefect"

#: Top to bottom; a module may import its own unit and units of lower layers. A unit is a
#: subpackage (``m27.node``) or a top-level module (``m27.clock``); ``m27`` is the package's
#: public face (its ``__init__``), which only the consumers above it import. The order is
#: DESIGN.md's (cli -> lab, node, monitoring, notify -> executors, checkpoint, gpu, spec,
#: sim -> policy, events, store -> leaves), with what the code showed it to be:
LAYERS: tuple[tuple[str, ...], ...] = (
    ("m27.cli",),
    # lab deploys flows/ and its worker closes the node's crashed runs (m27.node.crash)
    ("m27.lab",),
    # the flow runs a pipeline on a node: node's lease client, executors, public m27 names
    ("flows",),
    ("m27",),
    ("m27.node", "m27.monitoring", "m27.notify"),
    ("m27.executors", "m27.checkpoint", "m27.gpu", "m27.spec", "m27.sim"),
    # step: the step-side API (Channel) that the node and the simulated GPU read
    ("m27.policy", "m27.events", "m27.store", "m27.step"),
    # leaves; paths, liveness, locks, tables, signals serve several layers (each module says
    # which);
    # _lazy is the first-use import of the packages m27 and m27.notify; _gc pauses the
    # cyclic collector for a store's big reads and the projection's big folds
    (
        "m27._lazy",
        "m27._gc",
        "m27.clock",
        "m27.units",
        "m27.config",
        "m27.runids",
        "m27.paths",
        "m27.liveness",
        "m27.locks",
        "m27.tables",
        "m27.signals",
    ),
    # the one exception root: anything may raise an M27Error
    ("m27._exceptions",),
)

#: Imports allowed between units of one layer, each with its reason: (importer, imported).
SIDEWAYS: dict[tuple[str, str], str] = {
    ("m27.store", "m27.events"): "a store encodes and decodes the events it keeps",
    ("m27.executors", "m27.checkpoint"): "a requeued Slurm step resumes from its checkpoint",
    ("m27.executors", "m27.spec"): "the Slurm script reads the slurm: keys the spec validates",
    ("m27.config", "m27.units"): "settings are sizes and durations, parsed by m27.units",
    ("m27.config", "m27.paths"): "where the home and settings file are: m27.paths, which the "
    "warm runner's client imports without the settings parser",
    ("m27.runids", "m27.units"): "a run id that matches nothing is quoted as m27.units quotes",
    ("m27.tables", "m27.units"): "a cell shows a control character as m27.units.printable does",
}


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool

    @property
    def package(self) -> str:
        """The package whose namespace this module lives in (itself for an ``__init__``)."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


@dataclass(frozen=True)
class Use:
    """One imported module, or one name read from a module, at one place in the source."""

    src: Module
    line: int
    module: str  # fully qualified module the import resolves to
    name: str | None  # a name taken from `module` (None: the module itself)
    type_only: bool

    def where(self) -> str:
        return f"{self.src.path.relative_to(ROOT)}:{self.line}"


def _module_name(path: Path) -> Module:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return Module(".".join(parts), path, is_package)


@cache
def modules() -> dict[str, Module]:
    found = [_module_name(p) for src in SOURCES for p in sorted((ROOT / src).rglob("*.py"))]
    return {m.name: m for m in found}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, type_only: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    """Every node with whether it sits under ``if TYPE_CHECKING:`` (its body, not else)."""
    for child in ast.iter_child_nodes(node):
        yield child, type_only
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.body:
                yield stmt, True
                yield from _walk(stmt, True)
            for stmt in child.orelse:
                yield stmt, type_only
                yield from _walk(stmt, type_only)
        else:
            yield from _walk(child, type_only)


def _resolve(mod: Module, level: int, module: str | None) -> str:
    if level == 0:
        return module or ""
    base = mod.package.split(".")
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


@cache
def uses(name: str) -> tuple[Use, ...]:
    """What module `name` imports, and which private attributes it reads from modules."""
    mod = modules()[name]
    tree = ast.parse(mod.path.read_text(), filename=str(mod.path))
    known = modules()
    out: list[Use] = []
    aliases: dict[str, str] = {}  # local name -> module it is bound to
    for node, type_only in _walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out.append(Use(mod, node.lineno, alias.name, None, type_only))
                if alias.asname:
                    aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(mod, node.level, node.module)
            if base == "__future__":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:
                    out.append(Use(mod, node.lineno, sub, None, type_only))
                    aliases[alias.asname or alias.name] = sub
                else:
                    out.append(Use(mod, node.lineno, base, alias.name, type_only))
    for node, type_only in _walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and _private(node.attr)
        ):
            out.append(Use(mod, node.lineno, aliases[node.value.id], node.attr, type_only))
    return tuple(out)


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _runs(use: Use) -> list[str]:
    """The m27 modules whose code runs for `use`: the target and the packages it enters."""
    known = modules()
    targets = [use.module, *_ancestors(use.module)]
    return [
        t for t in targets if t in known and t != use.src.name and not _inside(use.src.package, t)
    ]


def _is_ours(name: str) -> bool:
    return name.partition(".")[0] in SOURCES


# --- the rules ------------------------------------------------------------------------


def privacy_violations() -> list[str]:
    found: list[str] = []
    for mod in modules().values():
        for use in uses(mod.name):
            found.extend(_privacy(mod, use))
    return list(dict.fromkeys(found))


def _privacy(mod: Module, use: Use) -> Iterator[str]:
    parts = use.module.split(".")
    ours = _is_ours(use.module)
    for i, part in enumerate(parts):
        owner = ".".join(parts[:i])
        if _private(part) and not (ours and _inside(mod.package, owner)):
            if ours:
                yield (
                    f"{use.where()}: [private-module] {mod.name} imports {use.module}, "
                    f"private to {owner}; import a public name of {owner} instead"
                )
            elif mod.name != THIRD_PARTY_GATE:
                yield (
                    f"{use.where()}: [third-party-private] {mod.name} uses {use.module}; "
                    f"wrap it in {THIRD_PARTY_GATE}"
                )
            break
    if use.name is not None and _private(use.name):
        target = modules().get(use.module)
        owner = target.package if target is not None else use.module.rpartition(".")[0]
        if ours and mod.package != owner:
            yield (
                f"{use.where()}: [private-name] {mod.name} uses {use.module}.{use.name}, "
                f"private to package {owner}; make it public"
            )
        elif not ours and mod.name != THIRD_PARTY_GATE:
            yield (
                f"{use.where()}: [third-party-private] {mod.name} uses {use.module}.{use.name}; "
                f"wrap it in {THIRD_PARTY_GATE}"
            )
    if mod.name.startswith("flows") and use.module.partition(".")[0] == "m27":
        dotted = use.module + (f".{use.name}" if use.name else "")
        if any(p.startswith("_") for p in dotted.split(".")):
            yield f"{use.where()}: [flows-public] flows import only public m27 names: {dotted}"


def _unit(name: str) -> str:
    """The layer unit a module belongs to: its subpackage under m27, or itself."""
    parts = name.split(".")
    if parts[0] == "flows":
        return "flows"
    return ".".join(parts[:2])


@cache
def _layer_of() -> dict[str, int]:
    return {unit: i for i, units in enumerate(LAYERS) for unit in units}


def layer_violations() -> list[str]:
    layer_of = _layer_of()
    found: list[str] = []
    for mod in modules().values():
        src = _unit(mod.name)
        if src not in layer_of:
            found.append(f"{mod.path.relative_to(ROOT)}:1: [layer] {src} is in no layer of LAYERS")
            continue
        for use in uses(mod.name):
            if not _is_ours(use.module):
                continue
            dst = _unit(use.module)
            if dst == src or dst not in layer_of:
                continue
            if layer_of[dst] < layer_of[src] or (
                layer_of[dst] == layer_of[src] and (src, dst) not in SIDEWAYS
            ):
                found.append(
                    f"{use.where()}: [layer] {mod.name} (layer {layer_of[src]}, {src}) imports "
                    f"{use.module} (layer {layer_of[dst]}, {dst}); dependencies point down LAYERS"
                )
    return list(dict.fromkeys(found))


def import_graph() -> dict[str, dict[str, Use]]:
    """Module -> the m27 modules it makes run (one `Use` kept per edge, for the message)."""
    graph: dict[str, dict[str, Use]] = {name: {} for name in modules()}
    for name in modules():
        for use in uses(name):
            if use.type_only:
                continue
            for target in _runs(use):
                graph[name].setdefault(target, use)
    return graph


def cycles(graph: dict[str, dict[str, Use]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def cycle_violations() -> list[str]:
    graph = import_graph()
    found: list[str] = []
    for component in cycles(graph):
        members = set(component)
        edges = [
            f"    {use.where()}: {src} -> {dst}"
            for src in component
            for dst, use in sorted(graph[src].items())
            if dst in members
        ]
        found.append("[cycle] " + " <-> ".join(component) + "\n" + "\n".join(edges))
    return found


# --- the tests ------------------------------------------------------------------------


def _report(found: list[str]) -> str:
    return f"{len(found)} violation(s):\n" + "\n".join(found)


def test_no_import_cycles_between_m27_modules() -> None:
    found = cycle_violations()
    assert not found, _report(found)


def test_private_modules_and_names_stay_inside_their_package() -> None:
    found = privacy_violations()
    assert not found, _report(found)


def test_dependencies_point_down_the_layers() -> None:
    found = layer_violations()
    assert not found, _report(found)


def test_m27_top_level_holds_at_most_twelve_modules() -> None:
    top = sorted(p.name for p in (ROOT / "m27").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL, (
        f"m27/:1: [top-level] {len(top)} modules at m27/ top level (at most {MAX_TOP_LEVEL}): "
        f"{top}; put the new one in the subpackage of its concept"
    )


def test_the_checker_sees_function_level_type_only_and_implied_package_imports() -> None:
    """The rules are only as good as the graph: check it on known facts of this tree."""
    lab = uses("m27.lab.worker")
    assert any(u.type_only for u in lab), "TYPE_CHECKING imports of m27.lab.worker"
    assert any(u.module == "m27.gpu" and not u.type_only for u in lab), "lazy import in gpu_count"
    graph = import_graph()
    # `from m27.events.state import fold` runs m27.events' __init__ too ...
    assert {"m27.events", "m27.events.state"} <= set(graph["m27.lab.worker"])
    # ... but a module never "imports" the packages it lives in.
    assert "m27.lab" not in graph["m27.lab.worker"] and "m27" not in graph["m27.lab.worker"]
    assert cycles({"a": {"b": lab[0]}, "b": {"a": lab[0]}, "c": {}}) == [["a", "b"]]
