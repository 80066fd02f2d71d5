"""Write a synthetic committed night into a data dir (for tests and demos of the warehouse).

The files follow the landing zone's contract exactly: one Parquet file (or several) per table
under ``landing/<table>/snapshot_date=D/``, typed by the table's Arrow schema from
``membersync.models.tables``, and the night's manifest written last (temporary name, then
rename), so a build sees the night only once it is complete.

    write_night(data_dir, date(2026, 1, 1), {
        "stores": [{"storecode": "DOWNTOWN  ", "name": "Downtown"}],
        "synced_clients": [{"client_number": "000417"}],
        "ledger_balances": [{"client_number": "000417", "storecode": "DOWNTOWN  ",
                             "balance": Decimal("12.50")}],
    })

Rows are dicts of Python values (``Decimal`` for money, ``date``/``datetime`` for dates); a
column a row does not give is null.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from membersync.models.tables import TABLES, table
from membersync.warehouse.manifest import Manifest, TableFiles, manifest_path
from membersync.warehouse.paths import DIR_MODE, FILE_MODE, DataDir


def arrow_rows(table_name: str, rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Rows as an Arrow table of the landed table's schema (unknown keys are an error)."""
    schema = table(table_name).schema
    for row in rows:
        unknown = set(row) - set(schema.names)
        if unknown:
            raise KeyError(f"{table_name}: unknown column(s) {sorted(unknown)}")
    return pa.Table.from_pylist([dict(row) for row in rows], schema=schema)


def write_night(
    data_dir: DataDir,
    night: dt.date,
    rows: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    mode: str = "full",
    parts: int = 1,
    watermark: str | None = None,
    run_id: str | None = None,
) -> Manifest:
    """Land ``rows`` (table name -> rows) as the committed night ``night``; return its manifest.

    Every declared table gets an entry (empty tables: no file, 0 rows). ``parts`` splits each
    table's rows over that many files, in order, as the landing zone's batches do.
    """
    data_dir.ensure()
    night_text = night.isoformat()
    tables: dict[str, TableFiles] = {}
    for declared in TABLES:
        table_rows = list(rows.get(declared.name, ()))
        if not table_rows:
            tables[declared.name] = TableFiles((), 0)
            continue
        folder = data_dir.landing / declared.name / f"snapshot_date={night_text}"
        folder.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        chunks = _split(table_rows, max(1, parts))
        files = []
        for index, chunk in enumerate(chunks):
            relative = f"{declared.name}/snapshot_date={night_text}/part-{index:05d}.parquet"
            _write_parquet(data_dir.landing / relative, arrow_rows(declared.name, chunk))
            files.append(relative)
        tables[declared.name] = TableFiles(tuple(files), len(table_rows))
    unknown = set(rows) - {t.name for t in TABLES}
    if unknown:
        raise KeyError(f"unknown landed table(s) {sorted(unknown)}")
    manifest = Manifest(
        snapshot_date=night,
        run_id=run_id or f"{night.strftime('%Y%m%d')}T020000Z-test",
        mode=mode,
        committed_at=f"{night_text}T02:00:00Z",
        watermark=watermark,
        clients_synced=len(rows.get("synced_clients", ())),
        tables=tables,
    )
    target = manifest_path(data_dir.manifests, night)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(manifest.to_json(), encoding="utf-8")
    os.chmod(tmp, FILE_MODE)
    os.replace(tmp, target)
    return manifest


def _split(rows: list[Mapping[str, Any]], parts: int) -> list[list[Mapping[str, Any]]]:
    size = -(-len(rows) // parts)
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def _write_parquet(path: os.PathLike[str] | str, data: pa.Table) -> None:
    tmp = f"{os.fspath(path)}.tmp"
    pq.write_table(data, tmp)
    os.chmod(tmp, FILE_MODE)
    os.replace(tmp, path)
