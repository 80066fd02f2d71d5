"""Issue 62: the analyst tier published as Delta Lake tables, read with no membersync code.

The nights come from the synthetic history (real landing code, no HTTP), built night by night as
a nightly sync builds them; every Delta table is read by ``deltalake``, by Polars and by DuckDB
(over Arrow: the ``delta`` extension cannot be installed here) and compared, row for row, with the
warehouse's own model of the same name. Retention then removes nights: no version of any table's
log reads one of them, and no file of the table holds one.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from membersync.extract.settings import parse_retention
from membersync.flows.benchmarks.synthetic import FIRST_NIGHT, History, land_night
from membersync.models.tables import LANDED
from membersync.warehouse.build.builder import build_warehouse
from membersync.warehouse.exports import open_tables
from membersync.warehouse.landing.paths import DataDir
from membersync.warehouse.landing.zone import LandingZone
from membersync.warehouse.lifecycle.retention import apply_retention

CLIENTS = 30
NIGHTS = 5
# What names a person in the landed identity (city, state, gender: shared with stores and bands)
PERSONAL = {"client_number", "first_name", "last_name", "email", "phone", "address1"}
assert {c.name for t in LANDED if t.name == "client_identity" for c in t.columns} > PERSONAL


def _night(index: int) -> dt.date:
    return FIRST_NIGHT + dt.timedelta(days=index)


def _land_and_build(data_dir: DataDir, history: History, index: int) -> None:
    night = _night(index)
    synced = history.clients if index == 0 else history.rng.sample(history.clients, 6)
    for client in synced if index else ():
        history.change(client, night)
    land_night(data_dir, history, night, synced, full=index == 0)
    with LandingZone(data_dir).lock():
        open_tables.publish_build(data_dir, build_warehouse(data_dir))


@pytest.fixture(scope="module")
def nightly(tmp_path_factory: pytest.TempPathFactory) -> DataDir:
    """Five nights, each landed, built and published on its own (as five nightly syncs)."""
    data_dir = DataDir(tmp_path_factory.mktemp("open-tables") / "data")
    history = History(CLIENTS, seed=11)
    for index in range(NIGHTS):
        _land_and_build(data_dir, history, index)
    return data_dir


def _sorted(table: pa.Table, key: tuple[str, ...]) -> list[dict[str, Any]]:
    return table.sort_by([(k, "ascending") for k in key]).to_pylist()


def _warehouse(data_dir: DataDir, name: str) -> pa.Table:
    with duckdb.connect(str(data_dir.warehouse_db), read_only=True) as con:
        return con.execute(f"select * from {name}").to_arrow_table()


def test_every_delta_table_read_by_three_engines_equals_the_warehouse(nightly: DataDir) -> None:
    """Case: after five nightly builds, each mart and report as Delta equals the warehouse's model,
    read by deltalake, Polars and DuckDB alike; no identity column is published."""
    tables = open_tables.open_tables()
    assert {t.name.split(".")[0] for t in tables} == {"marts", "reports"}
    identities = _identities(nightly)
    assert len(identities) > CLIENTS  # names, emails, phones of every client
    for table in tables:
        uri = open_tables.table_uri(nightly, table.name)
        key = table.model.key
        truth = _sorted(_warehouse(nightly, table.name), key)
        read = DeltaTable(uri).to_pyarrow_table()
        assert _sorted(read, key) == truth, table.name
        texts = [c for c in read.column_names if pa.types.is_string(read.schema.field(c).type)]
        assert not PERSONAL & set(texts), table.name
        assert not {v for c in texts for v in read.column(c).to_pylist()} & identities, table.name
        assert _sorted(pl.read_delta(uri).to_arrow(), key) == _sorted(read, key), f"polars: {table.name}"
        dataset = DeltaTable(uri).to_pyarrow_dataset()  # noqa: F841  (DuckDB reads it by name)
        by_duckdb = duckdb.sql("select * from dataset").to_arrow_table()
        assert _sorted(by_duckdb, key) == truth, f"duckdb: {table.name}"
    assert not (Path(nightly.root) / open_tables.DELTA / "identity.clients").exists()


def _identities(data_dir: DataDir) -> set[str]:
    """Every name, email, phone and address the landing zone holds (the identified tier)."""
    zone = LandingZone(data_dir)
    found: set[str] = set()
    for manifest in zone.manifests():
        rows = zone.read("client_identity", manifest.snapshot_date)
        for column in PERSONAL & set(rows.column_names):
            if pa.types.is_string(rows.schema.field(column).type):
                found.update(v for v in rows.column(column).to_pylist() if v and len(v) > 3)
    return found


def test_a_night_is_a_commit_of_its_own_in_each_daily_table(nightly: DataDir) -> None:
    """Case: a daily table's versions are one per night (the first whole, then one per night), and
    the version after night N reads exactly nights 0..N."""
    table = next(t for t in open_tables.open_tables() if t.name == "reports.membership_status_daily")
    uri = open_tables.table_uri(nightly, table.name)
    delta = DeltaTable(uri)
    assert delta.version() == NIGHTS - 1
    for version in range(NIGHTS):
        nights = set(DeltaTable(uri, version=version).to_pyarrow_table().column("snapshot_date").to_pylist())
        assert nights == {_night(i) for i in range(version + 1)}, version


def test_retention_leaves_no_version_that_reads_a_removed_night(
    nightly: DataDir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Case: retention keeps the nights of the last two days: every Delta table drops the older ones; no
    version left in any table's log reads one, and no data file of a table holds one."""
    import shutil

    data_dir = DataDir(tmp_path / "data")
    shutil.copytree(nightly.root, data_dir.root)
    newest = _night(NIGHTS - 1)
    with LandingZone(data_dir).lock() as zone:
        outcome = apply_retention(zone, parse_retention("daily=2d"), today=newest)
    removed = {dt.date.fromisoformat(n) for n in outcome.removed}
    assert removed == {_night(i) for i in range(NIGHTS) if _night(i) < newest - dt.timedelta(days=2)}
    assert removed  # two of the five nights
    for table in open_tables.open_tables():
        uri = open_tables.table_uri(data_dir, table.name)
        column = table.night_column
        assert _sorted(DeltaTable(uri).to_pyarrow_table(), table.model.key) == _sorted(
            _warehouse(data_dir, table.name), table.model.key
        ), table.name
        readable = _readable_versions(uri)
        assert readable and len(readable) <= 3, (table.name, readable)  # the versions since the vacuum
        for version in readable if column is not None else ():
            rows = DeltaTable(uri, version=version).to_pyarrow_table()
            assert not set(rows.column(column).to_pylist()) & removed, (table.name, version)
        if column is not None:
            assert not _nights_in_files(Path(uri), column) & removed, table.name


def _nights_in_files(folder: Path, column: str) -> set[dt.date]:
    """Every night any data file of a table holds (a partition's name, or its column)."""
    found: set[dt.date] = set()
    for path in folder.rglob("*.parquet"):
        if "_delta_log" in path.parts:
            continue
        for part in path.parent.relative_to(folder).parts:
            if part.startswith(f"{column}="):
                found.add(dt.date.fromisoformat(part.split("=", 1)[1]))
        if column in pq.read_schema(path).names:
            found.update(pq.read_table(path, columns=[column]).column(column).to_pylist())
    return found


def _readable_versions(uri: str) -> list[int]:
    """The versions of a table any reader can still load (the others' logs are gone)."""
    out = []
    for version in range(DeltaTable(uri).version() + 1):
        try:
            DeltaTable(uri, version=version).to_pyarrow_table()
        except Exception:
            continue
        out.append(version)
    return out


def test_the_open_tables_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``MEMBERSYNC_OPEN_TABLES=off``: a build publishes no Delta table."""
    monkeypatch.setenv("MEMBERSYNC_OPEN_TABLES", "off")
    data_dir = DataDir(tmp_path / "data")
    _land_and_build(data_dir, History(10, seed=3), 0)
    assert not (data_dir.root / open_tables.DELTA).exists()
