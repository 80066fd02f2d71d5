"""The module-level import graph of membersync has no cycle (issue 11); see tests/import_graph.py."""

from __future__ import annotations

from import_graph import cycles, graph


def test_no_import_cycle() -> None:
    edges = graph()
    assert len(edges) > 40  # the graph really covers the package
    assert cycles(edges) == []
