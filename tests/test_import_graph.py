"""The import graph of membersync (issue 11): no module-level cycle (see tests/import_graph.py), and
the benchmarks are not product code."""

from __future__ import annotations

import ast
from pathlib import Path

from import_graph import FOLDERS, ROOT, cycles, graph, module_name

BENCHMARKS = "membersync.flows.benchmarks"


def test_no_import_cycle() -> None:
    edges = graph()
    assert len(edges) > 40  # the graph really covers the package
    assert cycles(edges) == []


def _imports_anywhere(path: Path) -> set[str]:
    """Every ``membersync...`` module a file imports, at module level or inside a function."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {name for name in found if name.startswith("membersync.")}


def test_benchmarks_are_not_product_code() -> None:
    """Benchmarks may import any layer; only the ``bench`` command imports them, inside itself."""
    importers: dict[str, set[str]] = {}
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            name = module_name(path)
            if name == BENCHMARKS or name.startswith(BENCHMARKS + "."):
                continue
            hits = {t for t in _imports_anywhere(path) if t == BENCHMARKS or t.startswith(BENCHMARKS + ".")}
            if hits:
                importers[name] = hits
    assert set(importers) == {"membersync.flows.cli"}, importers
    assert not any(t.startswith(BENCHMARKS) for t in graph()["membersync.flows.cli"])  # not at import
