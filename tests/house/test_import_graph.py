"""The import graph of membersync (issue 11): no module-level cycle (see tests/support/import_graph.py), and
the benchmarks are not product code."""

from __future__ import annotations

from import_graph import FOLDERS, ROOT, cycles, graph, module_level_imports, module_name, room_edges

BENCHMARKS = "membersync.flows.benchmarks"


def test_no_import_cycle() -> None:
    edges = graph()
    assert len(edges) > 40  # the graph really covers the package
    assert cycles(edges) == []


def test_benchmarks_are_not_product_code() -> None:
    """Benchmarks may import any layer; only the ``bench`` command imports them, inside itself."""
    importers: dict[str, set[str]] = {}
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            name = module_name(path)
            if name == BENCHMARKS or name.startswith(BENCHMARKS + "."):
                continue
            hits = {
                t
                for t in module_level_imports(path, anywhere=True)
                if t == BENCHMARKS or t.startswith(BENCHMARKS + ".")
            }
            if hits:
                importers[name] = hits
    assert set(importers) == {"membersync.flows.cli.commands"}, importers
    at_import = module_level_imports(ROOT / "flows" / "cli" / "commands.py", anywhere=False)
    assert not any(t.startswith(BENCHMARKS) for t in at_import)  # imported inside `bench` only


def test_rooms_import_downward_only() -> None:
    """Between rooms (``warehouse/landing``, ``build``, ``exports``, ``lifecycle``, ``flows``, ...)
    no cycle either: the one upward arrow is the ``bench`` command into the lab, inside itself."""
    rooms = room_edges(graph())
    assert {"warehouse.landing", "warehouse.build", "warehouse.exports", "warehouse.lifecycle"} <= set(rooms)
    rooms["flows.cli"].discard("flows.benchmarks")  # see test_benchmarks_are_not_product_code
    assert cycles(rooms) == []
    assert rooms["warehouse.landing"] <= {"extract", "models"}  # the floor of the data dir
