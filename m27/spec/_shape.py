"""The shape of a composed YAML document: how deep it nests and how big its aliases make it.

YAML aliases (`*name`) reuse a node, so the composed tree is really a graph: nine aliases
of a node holding nine aliases of a node ... (the "billion laughs" file) is a few hundred
characters that read as 9^9 values, and `<<:` merges of such mappings copy every value
again. Anything that walks the tree (the depth check, the merge of `<<:` keys, the
checker) would then take minutes or all memory, and `&a [*a]` holds itself: a walk never
ends. So before anything else walks it, one walk with a budget of nodes settles a normal
file; only a file that exhausts the budget or nests too deep is then measured node by
node (each distinct node once, its height and expanded size from its children's) to say
where it nests too deep, expands too far or contains itself.
"""

from __future__ import annotations

from collections.abc import Sequence

from yaml.nodes import MappingNode, Node, SequenceNode

#: A document may expand (aliases read out) to this many nodes, or ten per character of
#: the file if that is more: a 100,000-step file with `<<: *defaults` in every step
#: expands about twice; a billion-laughs file, millions of times.
EXPANDED_MIN = 1_000_000
EXPANDED_PER_CHAR = 10


def _children(node: Node) -> Sequence[Node]:
    if isinstance(node, SequenceNode):
        return node.value  # type: ignore[no-any-return]
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return ()


def shape_problem(root: Node, text: str, max_depth: int) -> tuple[Node, str] | None:
    """The first node where `root` nests deeper than `max_depth`, contains itself, or
    expands past the limit, and why; None when the document is fine to walk.

    A plain walk of the tree, stopped once it has seen more nodes than the limit, settles
    nearly every file at the cost of one pass; only a file it stops on is measured node by
    node (a dict per node costs five times the walk) to say which of the three it is."""
    limit = max(EXPANDED_MIN, EXPANDED_PER_CHAR * len(text))
    todo: list[tuple[Node, int]] = [(root, 1)]
    seen = 0
    while todo:
        node, depth = todo.pop()
        seen += 1
        if depth > max_depth or seen > limit:
            break
        todo.extend((child, depth + 1) for child in reversed(_children(node)))
    else:
        return None
    measured = _measure(root)
    if isinstance(measured, Node):
        return measured, "contains an alias of itself (a YAML structure that never ends)"
    height, size = measured
    node, depth, via = root, 1, None
    while depth <= max_depth:  # follow the way down that nests too deep, if there is one
        if depth + height.get(id(node), 1) - 1 <= max_depth:
            break
        child = next(c for c in _children(node) if depth + height.get(id(c), 1) > max_depth)
        if via is None and not _written_inside(child, node):
            via = node  # the first node on the way that holds an alias: where to look
        node, depth = child, depth + 1
    else:
        message = f"nesting {depth} levels deep; at most {max_depth} are allowed"
        if via is not None:
            return via, f"{message} (counting what its aliases hold)"
        return node, message
    node = root  # down to the smallest node that is too big by itself: the anchor to blame
    while (
        big := next((c for c in _children(node) if size.get(id(c), 1) > limit), None)
    ) is not None:
        node = big
    return node, (
        f"aliases expand this to {size.get(id(node), 1):,} values, more than the {limit:,} a "
        "file of this size may hold; write the values out or use fewer aliases"
    )


def _written_inside(child: Node, parent: Node) -> bool:
    """False for a child that is an alias: the node it names is written elsewhere."""
    return bool(parent.start_mark.index <= child.start_mark.index < parent.end_mark.index)


def _measure(root: Node) -> tuple[dict[int, int], dict[int, int]] | Node:
    """Each distinct collection's height and expanded size (by id; a scalar is 1 and 1),
    each visited once; or the collection that contains itself."""
    height: dict[int, int] = {}
    size: dict[int, int] = {}
    open_: set[int] = set()
    todo: list[tuple[Node, bool]] = [(root, False)]
    while todo:
        node, closing = todo.pop()
        key = id(node)
        if closing:
            open_.discard(key)
            kids = _children(node)
            height[key] = 1 + max((height.get(id(c), 1) for c in kids), default=0)
            size[key] = 1 + sum(size.get(id(c), 1) for c in kids)
        elif key in open_:  # only an ancestor is open when its descendant is reached
            return node
        elif key not in height:
            open_.add(key)
            todo.append((node, True))
            todo.extend((c, False) for c in reversed(_children(node)) if _children(c))
    return height, size
