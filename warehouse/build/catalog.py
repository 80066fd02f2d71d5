"""The warehouse's storage: immutable Parquet parts, and the small catalog of views over them.

``DATA_DIR/warehouse.duckdb`` holds no bulk data: every model is a view over Parquet files under
``DATA_DIR/warehouse/parts/<schema>.<table>/<build id>.parquet`` (plus small ``meta`` tables and
the ``landing`` views over the landing zone's committed files). A build writes new parts (never
rewrites one) and a new catalog beside the old one, then swaps the catalog in with
``os.replace``: a reader that holds the old catalog keeps reading the old parts, which stay on
disk until the build after next (see :func:`collect_garbage`).

How a model's rows are stored (its ``meta.storage`` in the dbt YAML):

``nightly``  one part per build holding the nights it built; a view lists every part. History is
             never rewritten: a night's build writes O(that night).
``merged``   one part holding the whole table, written by every build (small whole-history
             tables: nights, current preferences, revenue by day); the view names only the newest
             part.
``latest``   one part per build holding the versions that changed in the nights it built (events:
             a new sale, a late void); the view keeps each key's newest version over every part
             (``snapshot_date``: the night that version was first fetched). A night's build
             writes O(what changed) and holds only the keys it fetched: it finds their current
             versions with a semi join over the parts (``prior.<table>`` is every stored version)
             and orders only those. A build of several nights stores each key's newest version
             of those nights (the views agree with a full refresh; the parts hold fewer versions).
``view``     no part: the catalog holds the model's compiled SQL as a view.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
from membersync.models.tables import LANDED, QUARANTINE_SCHEMA, LandedTable
from membersync.warehouse.landing.atomic import alive
from membersync.warehouse.landing.manifest import Manifest
from membersync.warehouse.landing.paths import QUARANTINE_DIR, DataDir

log = logging.getLogger(__name__)

QUARANTINE = "quarantine"  # landing.quarantine: rows the landing zone could not type, per night
NIGHTLY, MERGED, LATEST, VIEW = "nightly", "merged", "latest", "view"
STORAGES = (NIGHTLY, MERGED, LATEST, VIEW)
LINEAGE = ("snapshot_date", "_file_index", "_row", "_source_file")


def warehouse_dir(data_dir: DataDir) -> Path:
    """Everything the build keeps beside the catalog: parts, dbt's target, scratch databases."""
    return data_dir.root / "warehouse"


def parts_dir(data_dir: DataDir) -> Path:
    return warehouse_dir(data_dir) / "parts"


@dataclass(frozen=True)
class Part:
    """One Parquet file of a model: the nights it holds (nightly) or the whole table (merged)."""

    model: str  # schema.table
    storage: str
    path: str  # absolute
    first_night: dt.date
    last_night: dt.date


# --------------------------------------------------------------------------------------------
# Landing: views over the files the manifests name
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LandedFile:
    table: str
    snapshot_date: dt.date
    file_index: int  # position of the file in the night's manifest list (the order rows were written)
    relative: str  # path relative to DATA_DIR/landing
    absolute: str


class LandingInputError(ValueError):
    """A manifest names a file outside the landing zone, a missing file, or one another night names."""


def landed_files(data_dir: DataDir, manifests: Sequence[Manifest]) -> list[LandedFile]:
    landing = data_dir.landing.resolve()
    seen: dict[str, dt.date] = {}
    out = []
    for manifest in manifests:
        named = [*sorted(manifest.tables.items()), (QUARANTINE, manifest.quarantine)]
        for table_name, files in named:
            for index, relative in enumerate(files.files):
                path = (landing / relative).resolve()
                where = f"manifest {manifest.snapshot_date.isoformat()}, table {table_name}"
                if not path.is_relative_to(landing):
                    raise LandingInputError(f"{where}: file {relative!r} is outside {landing}")
                if not path.is_file():
                    raise LandingInputError(f"{where}: names a missing file {path}")
                if str(path) in seen:
                    raise LandingInputError(
                        f"{where}: file {relative!r} is already named by night {seen[str(path)].isoformat()}"
                    )
                seen[str(path)] = manifest.snapshot_date
                out.append(LandedFile(table_name, manifest.snapshot_date, index, relative, str(path)))
    return out


def landed_files_table(files: Sequence[LandedFile]) -> pa.Table:
    return pa.table(
        {
            "table_name": pa.array([f.table for f in files], pa.string()),
            "snapshot_date": pa.array([f.snapshot_date for f in files], pa.date32()),
            "file_index": pa.array([f.file_index for f in files], pa.int32()),
            "file": pa.array([f.relative for f in files], pa.string()),
            "absolute_path": pa.array([f.absolute for f in files], pa.string()),
        }
    )


def _duckdb_types(con: duckdb.DuckDBPyConnection, schema: pa.Schema) -> dict[str, str]:
    """Column -> DuckDB type name of an Arrow schema (for typed nulls and empty views)."""
    con.register("schema_probe", schema.empty_table())
    try:
        return {row[0]: row[1] for row in con.execute("DESCRIBE schema_probe").fetchall()}
    finally:
        con.unregister("schema_probe")


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _path_list(paths: Iterable[str]) -> str:
    return "[" + ", ".join(_quote(p) for p in paths) + "]"


def tier_tables(tier: str) -> list[LandedTable]:
    """The landed tables a catalog of ``tier`` may read: the analyst tier never reads the
    identified tier's files (``client_identity``)."""
    return [t for t in LANDED if tier == "identified" or t.tier == "analyst"]


def create_landing_views(
    con: duckdb.DuckDBPyConnection, files: Sequence[LandedFile], tables: Sequence[LandedTable] = LANDED
) -> None:
    """``landing.<table>`` for each of ``tables`` and the quarantine: the rows of ``files`` as
    landed, with the night from the manifest (never from the path) and their lineage.

    ``meta.landed_files`` must hold ``files`` (the views join it for each file's night).
    """
    declared = {t.name: t.schema for t in tables} | {QUARANTINE: QUARANTINE_SCHEMA}
    for name, schema in declared.items():
        mine = [f for f in files if f.table == name]
        types = _duckdb_types(con, schema)
        lineage = (
            "cast(null as date) as snapshot_date, cast(null as integer) as _file_index, "
            "cast(null as bigint) as _row, cast(null as varchar) as _source_file"
        )
        if not mine:
            columns = ", ".join(f'cast(null as {t}) as "{c}"' for c, t in types.items())
            con.execute(f"CREATE VIEW landing.{name} AS SELECT {columns}, {lineage} WHERE false")
            continue
        # hive_partitioning off: the night comes from the manifest, never from the path.
        scan = (
            f"read_parquet({_path_list(f.absolute for f in mine)}, filename = true, "
            "file_row_number = true, union_by_name = true, hive_partitioning = false)"
        )
        present = {d[0] for d in con.execute(f"SELECT * FROM {scan} LIMIT 0").description or []}
        missing = [c for c in types if c not in present]
        if missing:
            log.warning("landing.%s: column(s) absent from the files, read as null: %s", name, missing)
        columns = ", ".join(
            f'p."{c}"' if c in present else f'cast(null as {t}) as "{c}"' for c, t in types.items()
        )
        con.execute(
            f"""
            CREATE VIEW landing.{name} AS
            SELECT {columns}, f.snapshot_date, f.file_index AS _file_index,
                   p.file_row_number AS _row, f.file AS _source_file
            FROM {scan} AS p
            JOIN meta.landed_files AS f
                ON f.absolute_path = p.filename AND f.table_name = {_quote(name)}
            """
        )


# --------------------------------------------------------------------------------------------
# Parts
# --------------------------------------------------------------------------------------------


def landed_tables() -> list[str]:
    """``landing.<table>`` of every declared landed table and the quarantine."""
    return [*(f"landing.{t.name}" for t in LANDED), f"landing.{QUARANTINE}"]


def write_part(
    con: duckdb.DuckDBPyConnection,
    data_dir: DataDir,
    model: str,
    storage: str,
    build_id: str,
    nights: tuple[dt.date, dt.date],
    where: str = "true",
) -> Part:
    """Write the rows of the scratch table ``model`` that ``where`` keeps as a new Parquet part
    (never over an existing file)."""
    folder = parts_dir(data_dir) / model
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / f"{build_id}.parquet"
    query = f"SELECT * FROM {model} WHERE {where}"
    con.execute(f"COPY ({query}) TO {_quote(str(path))} (FORMAT parquet, COMPRESSION zstd)")
    os.chmod(path, 0o600)
    return Part(model, storage, str(path), nights[0], nights[1])


def parts_table(parts: Sequence[Part]) -> pa.Table:
    return pa.table(
        {
            "model": pa.array([p.model for p in parts], pa.string()),
            "storage": pa.array([p.storage for p in parts], pa.string()),
            "path": pa.array([p.path for p in parts], pa.string()),
            "first_night": pa.array([p.first_night for p in parts], pa.date32()),
            "last_night": pa.array([p.last_night for p in parts], pa.date32()),
        }
    )


def read_parts(con: duckdb.DuckDBPyConnection) -> list[Part]:
    rows = con.execute(
        "SELECT model, storage, path, first_night, last_night FROM meta.parts "
        "ORDER BY model, first_night, path"
    ).fetchall()
    return [Part(*row) for row in rows]


def create_part_view(
    con: duckdb.DuckDBPyConnection, model: str, parts: Sequence[Part], key: Sequence[str] = ()
) -> None:
    """``model`` as a view over ``parts`` (a ``latest`` model's: each ``key``'s newest version)."""
    scan = f"SELECT * FROM read_parquet({_path_list(p.path for p in parts)})"
    if parts and parts[0].storage == LATEST:
        if not key:
            raise ValueError(f"{model}: a latest model needs its key (meta.key in its YAML)")
        newest = f"PARTITION BY {', '.join(key)} ORDER BY snapshot_date DESC"
        scan += f" QUALIFY row_number() OVER ({newest}) = 1"
    con.execute(f"CREATE VIEW {model} AS {scan}")


def create_prior_views(
    con: duckdb.DuckDBPyConnection, parts: Sequence[Part], models: Mapping[str, str], newest_night: dt.date
) -> None:
    """``prior.<table>`` for each table -> model of ``models``: the published state an incremental
    build continues from.

    A nightly model's prior is its newest night only (the part that holds it); a merged table's
    is its one part; a latest table's, **every stored version** over its parts (no window: a
    model picks the newest version of the few keys it needs, macro ``current_versions``, instead
    of ordering the whole history every night).
    """
    for table, model in models.items():
        mine = [p for p in parts if p.model == model]
        if not mine:
            raise KeyError(f"the published warehouse has no part of {model!r} (source prior.{table})")
        if mine[0].storage == NIGHTLY:
            holding = [p for p in mine if p.first_night <= newest_night <= p.last_night]
            scan = f"read_parquet({_path_list(p.path for p in holding)})"
            night = f"DATE '{newest_night.isoformat()}'"
            con.execute(f"CREATE VIEW prior.{table} AS SELECT * FROM {scan} WHERE as_of_date = {night}")
        elif mine[0].storage == LATEST:
            con.execute(
                f"CREATE VIEW prior.{table} AS SELECT * FROM read_parquet({_path_list(p.path for p in mine)})"
            )
        else:
            create_part_view(con, f"prior.{table}", mine)


def create_history_views(
    con: duckdb.DuckDBPyConnection, parts: Sequence[Part], models: Mapping[str, str]
) -> None:
    """``history.<table>`` for each table -> model of ``models``: every row the published parts
    of a nightly model hold (a model comparing a night with older nights reads them)."""
    for table, model in models.items():
        mine = [p for p in parts if p.model == model]
        if not mine:
            raise KeyError(f"the published warehouse has no part of {model!r} (source history.{table})")
        con.execute(
            f"CREATE VIEW history.{table} AS SELECT * FROM read_parquet({_path_list(p.path for p in mine)})"
        )


# --------------------------------------------------------------------------------------------
# Garbage
# --------------------------------------------------------------------------------------------


def new_build_id() -> str:
    """``<utc time>-<pid>-<random>``: names a build's parts and catalogs (the pid: whose they are)."""
    return f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}-{os.getpid()}-{secrets.token_hex(3)}"


def build_id_pid(name: str) -> int | None:
    """The process id a build id names (``<utc time>-<pid>-<random>``)."""
    fields = name.split("-")
    return int(fields[1]) if len(fields) >= 3 and fields[1].isdigit() else None


def collect_garbage(data_dir: DataDir, keep: Iterable[str]) -> int:
    """Remove parts no catalog in ``keep``'s list names (the new catalog's and the one it replaced,
    which a reader may still hold), except the files of another build still running."""
    kept = set(keep)
    removed = 0
    for path in parts_dir(data_dir).glob("*/*.parquet"):
        if str(path) in kept:
            continue
        pid = build_id_pid(path.stem)
        if pid is not None and pid != os.getpid() and alive(pid):
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed += 1
    return removed


def published_state(path: Path) -> tuple[dict[dt.date, str], dict[str, str], list[Part]]:
    """Night -> committed_at, build facts (key -> value) and parts of the catalog at ``path``
    (all empty when there is none, or it cannot be read, or it is of an older layout)."""
    if not path.is_file():
        return {}, {}, []
    try:
        with contextlib.closing(duckdb.connect(str(path), read_only=True)) as con:
            nights = dict(con.execute("SELECT snapshot_date, committed_at FROM meta.nights").fetchall())
            try:
                facts = dict(con.execute("SELECT key, value FROM meta.build").fetchall())
                parts = read_parts(con)
            except duckdb.Error:
                facts, parts = {}, []  # a warehouse of the previous layout: rebuilt whole
    except duckdb.Error:
        return {}, {}, []
    return nights, facts, parts


def published_landed_files(path: Path) -> list[str]:
    """The landed files (absolute paths) a published catalog's views read ([] when there is none)."""
    if not path.is_file():
        return []
    try:
        with contextlib.closing(duckdb.connect(str(path), read_only=True)) as con:
            return [str(p) for (p,) in con.execute("SELECT absolute_path FROM meta.landed_files").fetchall()]
    except duckdb.Error:
        return []


def register_table(con: duckdb.DuckDBPyConnection, name: str, table: pa.Table) -> None:
    """``CREATE TABLE name`` from an Arrow table."""
    con.register("arrow_input", table)
    try:
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM arrow_input")
    finally:
        con.unregister("arrow_input")


def facts_table(facts: Mapping[str, str]) -> pa.Table:
    return pa.table({"key": pa.array(list(facts), pa.string()), "value": pa.array(list(facts.values()))})


# --------------------------------------------------------------------------------------------
# Readers: a catalog opened as a person reads it
# --------------------------------------------------------------------------------------------

# The statements a reader may run: reads. Anything else (COPY, ATTACH, EXPORT, INSTALL, LOAD,
# SET, PRAGMA, CALL, CREATE ...) is refused before it runs, even where the files allow it.
READ_STATEMENTS = ("SELECT", "EXPLAIN")


class ReaderRefused(ValueError):
    """A reader's statement is not a read (the message names its kind)."""


def reader_directories(data_dir: DataDir, tier: str) -> list[str]:
    """The folders a reader of ``tier``'s catalog may read, and nothing else: the parts (no
    part holds identity: the build's rules) and the landed tables of that tier with the
    quarantine. Folders, not files, so a BI tool's start-up SQL stays right after every build."""
    landing = data_dir.landing.resolve()
    folders = [parts_dir(data_dir).resolve(), *(landing / t.name for t in tier_tables(tier))]
    folders.append(landing / QUARANTINE_DIR)
    return [f"{folder}/" for folder in folders]


def reader_settings(data_dir: DataDir, tier: str) -> list[str]:
    """The statements that make a DuckDB connection a reader of ``tier``: file access limited to
    :func:`reader_directories`, no extension loaded, the configuration locked (what
    ``membersync sql`` runs, and what a BI tool's connection runs first)."""
    folders = ", ".join(_quote(f) for f in reader_directories(data_dir, tier))
    return [
        f"SET allowed_directories = [{folders}]",
        "SET enable_external_access = false",
        "SET autoload_known_extensions = false",
        "SET autoinstall_known_extensions = false",
        "SET lock_configuration = true",
    ]


def open_reader(data_dir: DataDir, tier: str) -> duckdb.DuckDBPyConnection:
    """The ``tier``'s catalog opened read-only as a reader (see :func:`reader_settings`)."""
    con = duckdb.connect(str(data_dir.catalog(tier)), read_only=True)
    try:
        for statement in ["SET TimeZone = 'UTC'", *reader_settings(data_dir, tier)]:
            con.execute(statement)
    except BaseException:
        con.close()
        raise
    return con


def check_reads_only(con: duckdb.DuckDBPyConnection, query: str) -> None:
    """Raise :class:`ReaderRefused` unless every statement of ``query`` is a read."""
    for statement in con.extract_statements(query):
        kind = statement.type.name
        if kind not in READ_STATEMENTS:
            raise ReaderRefused(
                f"{kind} refused: the warehouse is read-only here (read queries only: "
                f"{', '.join(READ_STATEMENTS)})"
            )
