"""The analyst tier as Delta Lake tables in the data location: the history for every engine.

After each build, every mart and report of the analyst tier (no identity; the identified tier is
never published here) is written as a Delta Lake table (``deltalake``, delta-rs) under
``delta/<schema>.<table>/`` of the data location: ``DATA_DIR/delta/`` or ``s3://bucket/prefix/delta/``.
Spark, Databricks, Snowflake (Delta Direct), Trino, BigQuery, DuckDB's ``delta_scan``, Polars and
pandas read it with no membersync code (docs/open-tables.md). Commits are delta-rs's own (on S3,
a conditional put of the next ``_delta_log`` entry); a table's reader resolves a snapshot.

How each model is written, by what a build of nights changes in it:

- a model stored by night (``nightly``: the daily history and the nightly reports, a night's rows
  never rewritten) is partitioned by its night column (``snapshot_date`` or ``as_of_date``) and gets
  **one commit per night built** (replace where night = D), so a night's rows are a version of
  their own;
- ``latest`` events (a key's newest version) are merged by key with the versions the built nights
  fetched (one commit);
- everything else (current state, monthly roll-ups, small whole tables) is overwritten whole.

A full refresh, or a table not published yet, is overwritten whole (one commit). Retention
(:func:`remove_nights`) deletes the removed nights' rows, overwrites the other tables with what
the warehouse holds after it (an event first fetched on a removed night is carried, not dropped), then
vacuums with a retention of zero and drops the log before it: no version left reads a removed night.
On ``s3://`` every table's commit first checks the lease is still this writer's (one read of it:
a writer whose lease was taken over publishes nothing more); tables are published eight at a time.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from membersync.extract.settings import Settings
from membersync.warehouse.build.builder import BuildResult
from membersync.warehouse.build.catalog import LATEST, NIGHTLY
from membersync.warehouse.build.memory import bound_connection
from membersync.warehouse.build.project import Model, load_models
from membersync.warehouse.landing.paths import DIR_MODE, FILE_MODE, DataDir
from membersync.warehouse.landing.storage import store_for

log = logging.getLogger(__name__)

DELTA = "delta"  # the folder of the data location holding the tables
NIGHT_COLUMNS = ("snapshot_date", "as_of_date")  # a model's night, the first of these in its key
PUBLISHED_LAYERS = ("marts", "reports")  # the analyst tier's models; staging and identity are not
TABLES_AT_ONCE = 8  # tables published at once (threads: delta-rs and DuckDB release the GIL)
STREAM_ROWS = 100_000  # a whole table goes to delta-rs as a stream of batches this long
_DROP_HISTORY = {"delta.logRetentionDuration": "interval 0 seconds"}
_KEEP_HISTORY = {"delta.logRetentionDuration": "interval 30 days"}  # Delta's default


class OpenTableError(RuntimeError):
    """A Delta table could not be written; the message names it."""


@dataclass(frozen=True)
class OpenTable:
    model: Model
    night_column: str | None

    @property
    def name(self) -> str:
        return self.model.name


@dataclass(frozen=True)
class Where:
    """A table's URI and delta-rs's storage options for it."""

    uri: str
    options: dict[str, str] | None


@dataclass(frozen=True)
class Published:
    tables: int
    commits: int


def open_tables() -> list[OpenTable]:
    """The models published, each with its night column (None: not stored by night)."""
    out = []
    for model in load_models():
        if model.layer in PUBLISHED_LAYERS:
            # a view is computed again at every read (an old night's row may change): written whole
            night = (
                next((c for c in NIGHT_COLUMNS if c in model.key), None) if model.storage == NIGHTLY else None
            )
            out.append(OpenTable(model, night))
    return out


def table_uri(data_dir: DataDir, name: str) -> str:
    if data_dir.remote is not None:
        return f"{data_dir.remote}/{DELTA}/{name}"
    return str(data_dir.root / DELTA / name)


def storage_options(data_dir: DataDir) -> dict[str, str] | None:
    """delta-rs's S3 settings from the standard AWS variables (it reads the credentials itself)."""
    if data_dir.remote is None:
        return None
    options: dict[str, str] = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        options["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION")
    if region:
        options["AWS_REGION"] = region
    return options


# --- publishing ------------------------------------------------------------------------------------


def enabled() -> bool:
    return Settings.load().open_tables


def publish_build(data_dir: DataDir, result: BuildResult) -> Published:
    """Publish what a build changed (nothing when it built no night, or ``MEMBERSYNC_OPEN_TABLES=off``)."""
    if not enabled() or not result.built_nights:
        return Published(0, 0)
    started = time.perf_counter()
    published = publish_nights(data_dir, result.built_nights, whole=result.full_refresh)
    owner_only(data_dir)
    log.info(
        "open tables: %d table(s), %d commit(s) in %.2f s",
        published.tables,
        published.commits,
        time.perf_counter() - started,
    )
    return published


def publish_nights(data_dir: DataDir, nights: Sequence[dt.date], *, whole: bool = False) -> Published:
    """Publish what a build of ``nights`` changed (``whole``: every table whole)."""
    from deltalake import DeltaTable

    def write(cursor: Any, table: OpenTable, where: Where) -> int:
        exists = DeltaTable.is_deltatable(where.uri, storage_options=where.options)
        return _publish_table(cursor, table, where, nights, whole or not exists)

    tables = open_tables()
    with _warehouse(data_dir) as con:
        commits = _each_table(data_dir, con, tables, "publishing", write)
    return Published(len(tables), sum(commits))


Write = Callable[[Any, OpenTable, Where], int]  # (a DuckDB cursor, a table, where) -> its commits


def _each_table(data_dir: DataDir, con: Any, tables: list[OpenTable], verb: str, write: Write) -> list[int]:
    """``write(cursor, table, where)`` for every table, :data:`TABLES_AT_ONCE` at a time (a commit
    is a few round trips, mostly waiting on the store); each first checks the lease is still held."""

    def one(table: OpenTable) -> int:
        where = Where(table_uri(data_dir, table.name), storage_options(data_dir))
        _fence(data_dir, f"{verb} the open table {table.name}")
        cursor = con.cursor()  # a DuckDB connection serves one thread; a cursor is its own
        try:
            return write(cursor, table, where)
        except Exception as exc:  # delta-rs raises its own errors and OSError alike
            raise OpenTableError(f"cannot publish {where.uri}: {exc.__class__.__name__}: {exc}") from None
        finally:
            cursor.close()

    with ThreadPoolExecutor(TABLES_AT_ONCE, thread_name_prefix="open-tables") as pool:
        futures = [pool.submit(one, table) for table in tables]
        try:
            return [future.result() for future in futures]
        except BaseException:
            for future in futures:
                future.cancel()  # the first failure ends the publication; what started finishes
            raise


def _publish_table(con: Any, table: OpenTable, where: Where, nights: Sequence[dt.date], whole: bool) -> int:
    """Write one table; returns its commits."""
    if whole or (table.night_column is None and table.model.storage != LATEST):
        return _overwrite(con, table, where)
    if table.night_column is not None:
        return _replace_nights(con, table, where, nights)
    return _merge_latest(con, table, where, nights)


def _overwrite(con: Any, table: OpenTable, where: Where) -> int:
    from deltalake import write_deltalake

    partition = [table.night_column] if table.night_column else None
    rows = con.sql(f"select * from {table.name}").to_arrow_reader(STREAM_ROWS)  # bounded memory
    write_deltalake(
        where.uri,
        rows,
        mode="overwrite",
        schema_mode="overwrite",
        partition_by=partition,
        storage_options=where.options,
    )
    return 1


def _replace_nights(con: Any, table: OpenTable, where: Where, nights: Sequence[dt.date]) -> int:
    """One commit per night: its rows replace the night's partition."""
    from deltalake import write_deltalake

    for night in nights:
        rows = _rows(con, table.name, f"{table.night_column} = ?", [night])
        predicate = f"{table.night_column} = '{night.isoformat()}'"
        write_deltalake(where.uri, rows, mode="overwrite", predicate=predicate, storage_options=where.options)
    return len(nights)


def _merge_latest(con: Any, table: OpenTable, where: Where, nights: Sequence[dt.date]) -> int:
    """The versions the nights fetched replace each key's older one (one commit)."""
    from deltalake import DeltaTable

    marks = ", ".join("?" for _ in nights)
    changed = _rows(con, table.name, f"snapshot_date in ({marks})", list(nights))
    if not changed.num_rows:
        return 0
    on = " and ".join(f"t.{k} = s.{k}" for k in table.model.key)
    target = DeltaTable(where.uri, storage_options=where.options)
    merge = target.merge(changed, on, source_alias="s", target_alias="t")
    merge.when_matched_update_all().when_not_matched_insert_all().execute()
    return 1


def remove_nights(data_dir: DataDir, removed: Sequence[dt.date]) -> Published:
    """Retention removed ``removed``: delete their rows everywhere, republish the whole tables,
    then vacuum (retention zero) and drop the log before, so that no version reads them."""
    from deltalake import DeltaTable

    listed = ", ".join(f"'{d.isoformat()}'" for d in sorted(removed))

    def write(cursor: Any, table: OpenTable, where: Where) -> int:
        if not DeltaTable.is_deltatable(where.uri, storage_options=where.options):
            return 0
        if table.night_column is None:  # events, current state: as the warehouse holds them now
            commits = _overwrite(cursor, table, where)
        else:
            DeltaTable(where.uri, storage_options=where.options).delete(f"{table.night_column} in ({listed})")
            commits = 1
        _forget_history(DeltaTable(where.uri, storage_options=where.options))
        return commits

    if not removed or not enabled():
        return Published(0, 0)
    tables = open_tables()
    with _warehouse(data_dir) as con:
        commits = _each_table(data_dir, con, tables, "removing nights from", write)
    owner_only(data_dir)
    return Published(len(tables), sum(commits))


def _forget_history(table: Any) -> None:
    """Vacuum every file the newest version does not name, and the log before it."""
    table.alter.set_table_properties(_DROP_HISTORY)
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    table.create_checkpoint()
    table.cleanup_metadata()
    table.alter.set_table_properties(_KEEP_HISTORY)


# --- helpers -----------------------------------------------------------------------------------------


@contextlib.contextmanager
def _warehouse(data_dir: DataDir) -> Iterator[Any]:
    con = bound_connection(data_dir, str(data_dir.warehouse_db), read_only=True)
    try:
        yield con
    finally:
        con.close()


def _rows(con: Any, name: str, where: str | None = None, params: list[Any] | None = None) -> pa.Table:
    sql = f"select * from {name}" + (f" where {where}" if where else "")
    return con.execute(sql, params or []).to_arrow_table()  # one copy, as Arrow


def owner_only(data_dir: DataDir) -> None:
    """delta-rs writes with the umask: a local data dir's tables are made owner-only, as
    everything under the data dir is (folders 0700, files 0600)."""
    root = data_dir.root / DELTA
    if data_dir.remote is not None or not root.is_dir():
        return
    os.chmod(root, DIR_MODE)
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            os.chmod(os.path.join(folder, name), DIR_MODE)
        for name in files:
            os.chmod(os.path.join(folder, name), FILE_MODE)


def _fence(data_dir: DataDir, what: str) -> None:
    """On ``s3://``: this process still holds the lease (a conditional put of it)."""
    if data_dir.remote is not None:
        store_for(data_dir).hold(what)
