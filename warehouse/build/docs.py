"""``membersync docs``: dbt's documentation site of the warehouse, as static files in the data dir.

The site shows every model with its description, grain, key and columns (their types read from
the published warehouse), its tests and the lineage graph from the landing sources to the
reports. ``DATA_DIR/docs/static_index.html`` is one self-contained page (open it from disk);
``index.html`` with ``manifest.json`` and ``catalog.json`` is the same site for a web server.

dbt reads the column types from a **copy** of the published catalog (it is small: views and
meta tables; the data stays in the Parquet parts the views name), so readers and the next build
are never disturbed, and dbt's own files stay out of the repository.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from pathlib import Path

from membersync.warehouse.build import catalog as cat
from membersync.warehouse.build import dbt_run
from membersync.warehouse.landing.paths import DIR_MODE, FILE_MODE, DataDir

SITE_FILES = ("static_index.html", "index.html", "manifest.json", "catalog.json")


class DocsError(RuntimeError):
    """The docs could not be generated (no warehouse yet, or dbt failed): one line."""


def docs_dir(data_dir: DataDir) -> Path:
    return data_dir.root / "docs"


def generate_docs(data_dir: DataDir, sql_dir: Path | None = None) -> Path:
    """Write the docs site under ``DATA_DIR/docs/``; return the self-contained page's path."""
    if not data_dir.warehouse_db.is_file():
        raise DocsError(f"no warehouse at {data_dir.warehouse_db}: run `membersync reports` first")
    project = (sql_dir or dbt_run.SQL_DIR).resolve()
    scratch = cat.warehouse_dir(data_dir) / f"docs-{os.getpid()}-{secrets.token_hex(3)}"
    scratch.mkdir(parents=True, mode=DIR_MODE)
    try:
        copy = scratch / "warehouse.duckdb"  # the same database name as the published catalog
        shutil.copyfile(data_dir.warehouse_db, copy)
        dbt_run.write_profile(scratch, copy)
        outcome = dbt_run.run(
            ["docs", "generate", "--static"],
            project,
            scratch,
            scratch,
            {"incremental": True},
            reuse_parse=False,  # another database name than the builds', and dbt writes its manifest
        )
        if not outcome.success:
            raise DocsError(f"dbt docs generate failed: {outcome.error or 'see ' + str(outcome.log_file)}")
        target = docs_dir(data_dir)
        target.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        for name in SITE_FILES:
            _install(scratch / "target" / name, target / name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target / "static_index.html"


def _install(source: Path, destination: Path) -> None:
    """Move a generated file into place atomically, owner-only."""
    if not source.is_file():
        raise DocsError(f"dbt did not write {source.name}")
    os.chmod(source, FILE_MODE)
    os.replace(source, destination)


def model_count(data_dir: DataDir) -> int:
    """Models the generated site documents (from its manifest)."""
    with contextlib.suppress(OSError, ValueError):
        manifest = json.loads((docs_dir(data_dir) / "manifest.json").read_text(encoding="utf-8"))
        return sum(1 for n in manifest.get("nodes", {}).values() if n.get("resource_type") == "model")
    return 0
