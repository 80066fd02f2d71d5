"""Write a synthetic committed night into a data dir (for tests and demos of the warehouse).

The night is written by the landing zone itself (staged batches, then the commit that publishes
the files under ``landing/<table>/snapshot_date=D/`` and writes the manifest last), typed by the
tables' Arrow schemas from ``membersync.models.tables``, so the warehouse's tests read exactly
what a real sync lands.

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
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from membersync.models.tables import QUARANTINE_SCHEMA, TABLES, table
from membersync.warehouse.manifest import Manifest
from membersync.warehouse.paths import DataDir


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
    quarantine: Sequence[Mapping[str, Any]] = (),
) -> Manifest:
    """Land ``rows`` (table name -> rows) as the committed night ``night``; return its manifest.

    Written by the real landing zone (:class:`~membersync.warehouse.landing.LandingZone`):
    ``parts`` batches, each table's rows split over them in order, then the commit. Every
    declared table is in the manifest (empty ones with no file and 0 rows). ``quarantine`` rows
    follow ``QUARANTINE_SCHEMA`` (table_name, client_number, reason, raw).
    """
    from membersync.warehouse.landing import LandingZone

    unknown = set(rows) - {t.name for t in TABLES}
    if unknown:
        raise KeyError(f"unknown landed table(s) {sorted(unknown)}")
    parts = max(1, parts)
    chunks = {t.name: _split(list(rows.get(t.name, ())), parts) for t in TABLES}
    zone = LandingZone(data_dir)
    with zone.lock():
        open_night = zone.open_night(night, mode)
        for index in range(parts):
            tables = {name: arrow_rows(name, chunk[index]) for name, chunk in chunks.items()}
            bad = (
                pa.Table.from_pylist([dict(r) for r in quarantine], schema=QUARANTINE_SCHEMA)
                if index == 0
                else None
            )
            open_night.write_batch(f"b{index:05d}", tables, bad)
        return open_night.commit(watermark, len(rows.get("synced_clients", ())), {"synthetic": True})


def _split(rows: list[Mapping[str, Any]], parts: int) -> list[list[Mapping[str, Any]]]:
    """``parts`` consecutive chunks (some maybe empty), in order."""
    size = -(-len(rows) // parts) if rows else 0
    return [rows[i * size : (i + 1) * size] for i in range(parts)]
