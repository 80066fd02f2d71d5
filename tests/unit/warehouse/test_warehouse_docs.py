"""`membersync docs` (issue 10): dbt's documentation site of the warehouse, under the data dir.

The site is generated right after a build in the same process (which caches its parsed project):
the catalog it documents must still be the published warehouse's (the docs parse on their own,
for their own database name).
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from membersync.flows.benchmarks.synthetic import FIRST_NIGHT, History, land_night
from membersync.warehouse.build.builder import build_warehouse
from membersync.warehouse.build.docs import DocsError, docs_dir, generate_docs, model_count
from membersync.warehouse.build.project import load_models
from membersync.warehouse.landing.paths import DataDir


def test_docs_site_documents_every_model_with_its_columns_and_tests(tmp_path: Path) -> None:
    data_dir = DataDir(tmp_path / "data")
    with pytest.raises(DocsError, match="run `membersync reports` first"):
        generate_docs(data_dir)
    history = History(20, seed=5)
    land_night(data_dir, history, FIRST_NIGHT, history.clients, full=True)
    build_warehouse(data_dir)

    page = generate_docs(data_dir)

    assert page == docs_dir(data_dir) / "static_index.html" and page.is_file()
    assert stat.S_IMODE(page.stat().st_mode) == 0o600
    models = {m.name for m in load_models()}
    assert model_count(data_dir) == len(models) > 0
    manifest = json.loads((docs_dir(data_dir) / "manifest.json").read_text())
    documented = {
        f"{n['schema']}.{n['alias']}": n for n in manifest["nodes"].values() if n["resource_type"] == "model"
    }
    assert set(documented) == models
    # the columns of a report and its tests are in the site, from the YAML
    report = documented["reports.revenue_by_store_day"]
    assert report["description"] and report["columns"]
    tests = [n for n in manifest["nodes"].values() if n["resource_type"] == "test"]
    assert any("revenue_by_store_day" in n["unique_id"] for n in tests)
    # the catalog (types of what was built) comes from the published warehouse
    catalog = json.loads((docs_dir(data_dir) / "catalog.json").read_text())
    assert any(key.endswith(".revenue_by_store_day") for key in catalog["nodes"])
    assert "revenue_by_store_day" in page.read_text(encoding="utf-8")
