"""Print the import graph of the project's packages, from the source (``ast``; nothing is imported or run).

    .venv/bin/python benchmarks/import_graph.py                  # arrows between the top-level packages
    .venv/bin/python benchmarks/import_graph.py --depth 2        # ... between serving.server.http, serving.engine.translator, ...
    .venv/bin/python benchmarks/import_graph.py --depth 2 --within serving   # only arrows inside serving/

One line per arrow, ``a -> b  (n names: m imported at module level, k inside functions)``, sorted; then every cycle (a
strongly connected group of more than one node), or ``no cycles``. An import inside a function (a lazy import) is
an arrow too: it runs when the function does. ``from __future__``, imports under ``if TYPE_CHECKING:`` (they never
run) and imports of anything outside the roots are left out.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("serving", "converters", "batch", "loadtest")


def modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of ``packages`` under ``root``."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(name: str, path: Path) -> Iterator[tuple[str, bool]]:
    """``(imported module, lazy)`` for each import of a module that runs (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top_level = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom) or _under_type_checking(tree, node):
            continue
        lazy = id(node) not in top_level
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, lazy
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:  # `from pkg import module` imports the module
                yield f"{base}.{alias.name}", lazy


def _under_type_checking(tree: ast.Module, target: ast.AST) -> bool:
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            if any(child is target for child in ast.walk(node)):
                return True
    return False


def resolve(imported: str, known: dict[str, Path]) -> str | None:
    """The longest known module ``imported`` names (``a.b.C`` -> ``a.b``), or None."""
    parts = imported.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def graph(root: Path, packages: tuple[str, ...], depth: int) -> dict[tuple[str, str], list[bool]]:
    """``(source, target) -> [lazy, ...]`` (one entry per import) between module names cut to ``depth`` parts."""
    known = modules(root, packages)
    edges: dict[tuple[str, str], list[bool]] = defaultdict(list)
    for name, path in known.items():
        for imported, lazy in imports(name, path):
            target = resolve(imported, known)
            if target is None:
                continue
            a, b = ".".join(name.split(".")[:depth]), ".".join(target.split(".")[:depth])
            if a != b:
                edges[(a, b)].append(lazy)
    return edges


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one node (Tarjan), each sorted; ``graph``: node -> the nodes it has
    arrows to (tests/test_import_contract.py checks with it that there are none)."""
    successors = {node: sorted(targets) for node, targets in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in successors.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted({*successors, *(n for targets in successors.values() for n in targets)}):
        if node not in index:
            visit(node)
    return sorted(groups)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, default=1, help="name parts a node keeps (1: packages; default 1)")
    parser.add_argument("--within", help="only arrows whose both ends are inside this package (e.g. serving)")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout (default: this one)")
    args = parser.parse_args(argv)
    if args.depth < 1:
        parser.error("--depth must be at least 1")
    edges = graph(args.root, PACKAGES, args.depth)
    if args.within:
        inside = (args.within, args.within + ".")
        edges = {(a, b): v for (a, b), v in edges.items()
                 if (a == inside[0] or a.startswith(inside[1])) and (b == inside[0] or b.startswith(inside[1]))}
    for (a, b), kinds in sorted(edges.items()):
        lazy = sum(kinds)
        sys.stdout.write(f"{a} -> {b}  ({len(kinds)} names: {len(kinds) - lazy} imported at module level, "
                         f"{lazy} inside functions)\n")
    successors: dict[str, list[str]] = defaultdict(list)
    for a, b in edges:
        successors[a].append(b)
    found = cycles(successors)
    for group in found:
        sys.stdout.write("cycle: " + " <-> ".join(group) + "\n")
    if not found:
        sys.stdout.write("no cycles\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
