"""The import graph of membersync, from the source (``ast``), and its cycles.

    .venv/bin/python tests/support/import_graph.py            # folder-level edges, then any module cycle
    .venv/bin/python tests/support/import_graph.py --rooms    # edges between rooms (sub-packages)
    .venv/bin/python tests/support/import_graph.py --modules  # every edge

Every import counts, inside a function too: a lazy import is deliberate (Prefect, dbt and DuckDB
take seconds to import; the CLI pays for them only when a command needs them) and cannot fail at
import time, but it still ties the two modules together, so a lazy cycle is a cycle.
``tests/house/test_import_graph.py`` fails on any cycle.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("extract", "models", "flows", "sql", "warehouse")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(["membersync", *parts])


def module_level_imports(path: Path, *, anywhere: bool = True) -> set[str]:
    """The ``membersync...`` modules a file imports anywhere (with ``anywhere=False``: at
    module level only)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    # anywhere: inside functions and `if TYPE_CHECKING:` too; else module level only
    for node in ast.walk(tree) if anywhere else tree.body:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {name for name in found if name.startswith("membersync.")}


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")}
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        edges[name] = {target for target in module_level_imports(path) if target in modules} - {name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def folder_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for source, targets in edges.items():
        for target in targets:
            a, b = source.split(".")[1], target.split(".")[1]
            if a != b:
                out[a].add(b)
    return out


def room_of(module: str) -> str:
    """``membersync.warehouse.landing.zone`` (or the package ``membersync.warehouse.landing``) ->
    ``warehouse.landing``; a module at the top of a folder -> the folder."""
    parts = module.split(".")[1:]
    if len(parts) >= 2 and (ROOT / parts[0] / parts[1] / "__init__.py").exists():
        return ".".join(parts[:2])
    return parts[0]


def room_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for source, targets in edges.items():
        for target in targets:
            a, b = room_of(source), room_of(target)
            if a != b:
                out[a].add(b)
    return out


def main(argv: list[str]) -> int:
    edges = graph()
    if "--modules" in argv:
        for source in sorted(edges):
            for target in sorted(edges[source]):
                print(f"{source} -> {target}")
    else:
        by = room_edges if "--rooms" in argv else folder_edges
        for source, targets in sorted(by(edges).items()):
            print(f"{source} -> {', '.join(sorted(targets))}")
    found = cycles(edges)
    print(f"{len(edges)} modules, {sum(len(t) for t in edges.values())} imports, {len(found)} cycle(s)")
    for component in found:
        print("cycle: " + " <-> ".join(component))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
