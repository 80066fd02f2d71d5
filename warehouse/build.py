"""Build ``DATA_DIR/warehouse.duckdb`` from the committed nights of the landing zone.

The build is a pure function of the landing zone: it reads **only** the Parquet files that the
manifests in ``landing/_manifests/`` name (a night being written, or an orphan left by a crash,
is never seen), copies them into the schema ``landing`` (``snapshot_date`` from the manifest,
not from the path), then runs the SQL models of ``sql/`` layer by layer:

``staging``  typed, normalised, deduplicated by key: one row per key and night;
``marts``    current state per client as of each night, events in their newest version;
``reports``  the management reports that are exported as CSV.

Each model file starts with a header comment that states its grain and key (and optionally
enumerations, references and its landing source); the build **checks** every declared key is
not null and unique, every enumeration value is known or ``other`` (others are counted), every
reference resolves, and landing row counts reconcile with the manifests and with staging. A
failed check raises :class:`BuildCheckError` naming the model and the check, and the previous
warehouse stays in place.

Readers are never blocked: the new warehouse is written to a temporary file beside the old one
and swapped in with ``os.replace``. DuckDB allows one writer per file, but the build never
opens ``warehouse.duckdb`` itself, and a reader holding the old file keeps reading it (the old
inode lives on until it closes) and sees the new night when it reopens.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import re
import secrets
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa
from membersync.models.tables import QUARANTINE_SCHEMA, TABLES
from membersync.warehouse.crashpoints import crashpoint
from membersync.warehouse.manifest import Manifest, read_manifests
from membersync.warehouse.paths import FILE_MODE, DataDir

log = logging.getLogger(__name__)

SQL_DIR = Path(__file__).resolve().parent.parent / "sql"
LAYERS = ("staging", "marts", "reports")
SCHEMAS = ("meta", "landing", *LAYERS)
TMP_PREFIX = "warehouse.duckdb.building-"
QUARANTINE = "quarantine"  # landing.quarantine: rows the landing zone could not type, per night

# Columns the build adds to every landing table (lineage, and the order of rows within a night).
LINEAGE_COLUMNS = {
    "snapshot_date": pa.date32(),
    "_file_index": pa.int32(),  # position of the file in the night's manifest list
    "_row": pa.int64(),  # row number inside the file
    "_source_file": pa.string(),  # path relative to DATA_DIR/landing
}


class BuildError(RuntimeError):
    """The build failed; the previous warehouse is untouched."""


class BuildInputError(BuildError, ValueError):
    """The landing zone cannot be built from (no committed night, a manifest names a missing file)."""


class BuildStaleError(BuildError):
    """A newer warehouse was published while this build ran; the newer one is kept."""


class BuildCheckError(BuildError):
    """A model failed a check; the message names the model and the check."""

    def __init__(self, model: str, check: str, detail: str) -> None:
        self.model = model
        self.check = check
        self.detail = detail
        super().__init__(f"build check failed: {model}: {check}: {detail}")


# --------------------------------------------------------------------------------------------
# Models: SQL files with a header comment
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EnumCheck:
    column: str
    allowed: tuple[str, ...]


@dataclass(frozen=True)
class Reference:
    target: str
    columns: tuple[str, ...]


@dataclass(frozen=True)
class Model:
    """One SQL file: ``sql/<layer>/<name>.sql`` builds the table (or view) ``<layer>.<name>``."""

    name: str
    layer: str
    path: Path
    sql: str
    grain: str
    key: tuple[str, ...]
    materialized: str = "table"
    enums: tuple[EnumCheck, ...] = ()
    references: tuple[Reference, ...] = ()
    source: str | None = None
    depends: frozenset[str] = frozenset()


_HEADER = re.compile(r"^--\s*(model|grain|key|materialized|enum|references|source):\s*(.*)$")
_CONTINUATION = re.compile(r"^--\s{2,}(\S.*)$")
_ENUM = re.compile(r"^(\w+)\s+in\s+\((.*)\)$")
_REFERENCE = re.compile(r"^([\w.]+)\s*\((.*)\)$")
_MODEL_REF = re.compile(r"\b((?:staging|marts|reports)\.\w+)\b")


class ModelError(BuildError):
    """A model file's header is malformed; the message names the file."""


def parse_model(path: Path, layer: str) -> Model:
    text = path.read_text(encoding="utf-8")
    name = f"{layer}.{path.stem}"
    fields: dict[str, list[str]] = {}
    last: str | None = None
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        match = _HEADER.match(line)
        if match:
            last = match.group(1)
            fields.setdefault(last, []).append(match.group(2).strip())
        elif last == "grain" and (cont := _CONTINUATION.match(line)):
            fields["grain"][-1] += " " + cont.group(1).strip()
        else:
            last = None

    def one(label: str, default: str | None = None) -> str:
        values = fields.get(label)
        if not values:
            if default is not None:
                return default
            raise ModelError(f"{path}: header has no '-- {label}:' line")
        return values[0]

    declared = one("model", name)
    if declared != name:
        raise ModelError(f"{path}: header says model {declared!r}, file is {name!r}")
    key = tuple(k.strip() for k in one("key").split(",") if k.strip())
    if not key:
        raise ModelError(f"{path}: empty key")
    materialized = one("materialized", "table")
    if materialized not in ("table", "view"):
        raise ModelError(f"{path}: materialized must be table or view, not {materialized!r}")
    enums = []
    for raw in fields.get("enum", []):
        m = _ENUM.match(raw)
        if not m:
            raise ModelError(f"{path}: bad enum line {raw!r} (expected 'column in (a, b)')")
        enums.append(EnumCheck(m.group(1), tuple(v.strip() for v in m.group(2).split(","))))
    references = []
    for raw in fields.get("references", []):
        m = _REFERENCE.match(raw)
        if not m:
            raise ModelError(f"{path}: bad references line {raw!r} (expected 'schema.table (a, b)')")
        references.append(Reference(m.group(1), tuple(c.strip() for c in m.group(2).split(","))))
    sql = text.strip().rstrip(";")
    # A model builds after the models its SQL names and the models its checks refer to.
    referenced = {r.target for r in references if r.target.split(".")[0] in LAYERS}
    depends = (frozenset(_MODEL_REF.findall(_strip_comments(sql))) | referenced) - {name}
    return Model(
        name=name,
        layer=layer,
        path=path,
        sql=sql,
        grain=one("grain"),
        key=key,
        materialized=materialized,
        enums=tuple(enums),
        references=tuple(references),
        source=fields.get("source", [None])[0],
        depends=depends,
    )


def _strip_comments(sql: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in sql.splitlines())


def load_models(sql_dir: Path | None = None) -> list[Model]:
    """Every model of ``sql_dir`` (default: the package's ``sql/``), in an order that builds.

    Layers build in order (staging, marts, reports); inside a layer a model builds after the
    models it names (``marts.x`` in its SQL), then by name, so the order is stable.
    """
    root = sql_dir or SQL_DIR
    ordered: list[Model] = []
    built: set[str] = set()
    for layer in LAYERS:
        pending = {m.name: m for m in (parse_model(p, layer) for p in sorted((root / layer).glob("*.sql")))}
        known = built | set(pending)
        for model in pending.values():
            unknown = {d for d in model.depends if d not in known}
            if unknown:
                raise ModelError(f"{model.path}: uses unknown model(s) {', '.join(sorted(unknown))}")
        while pending:
            ready = sorted(n for n, m in pending.items() if m.depends <= built)
            if not ready:
                raise ModelError(f"models depend on each other in a cycle: {', '.join(sorted(pending))}")
            for name in ready:
                ordered.append(pending.pop(name))
                built.add(name)
    return ordered


# --------------------------------------------------------------------------------------------
# The build
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildResult:
    path: Path
    nights: tuple[dt.date, ...]
    models: tuple[str, ...]
    rows: dict[str, int]  # model or landing table -> row count
    checks: int  # checks run (all passed)
    duplicates_dropped: dict[str, int] = field(default_factory=dict)  # staging model -> rows
    others: dict[str, dict[str, int]] = field(default_factory=dict)  # "model.column" -> raw -> rows
    seconds: float = 0.0


def build_warehouse(data_dir: DataDir, *, sql_dir: Path | None = None) -> BuildResult:
    """Build the warehouse from the committed nights; swap it in only if every check passed."""
    started = time.monotonic()
    manifests = read_manifests(data_dir.manifests)
    if not manifests:
        raise BuildInputError(f"no committed night in {data_dir.manifests}: run `membersync sync` first")
    models = load_models(sql_dir)
    data_dir.root.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(data_dir.root)
    tmp = data_dir.root / f"{TMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with contextlib.closing(duckdb.connect(str(tmp))) as con:
            con.execute("SET TimeZone = 'UTC'")
            for schema in SCHEMAS:
                con.execute(f"CREATE SCHEMA {schema}")
            checker = _Checker(con)
            _write_meta(con, manifests)
            _load_landing(con, data_dir, manifests, checker)
            for model in models:
                _build_model(con, model)
                checker.check_model(model)
                crashpoint("during_warehouse_build")
            _write_model_catalogue(con, models)
            checker.write_log()
            rows = checker.rows
            con.execute("CHECKPOINT")
        _publish(tmp, data_dir.warehouse_db, {m.snapshot_date: m.committed_at for m in manifests})
    finally:
        for leftover in (tmp, Path(f"{tmp}.wal")):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
    result = BuildResult(
        path=data_dir.warehouse_db,
        nights=tuple(m.snapshot_date for m in manifests),
        models=tuple(m.name for m in models),
        rows=rows,
        checks=checker.count,
        duplicates_dropped=checker.duplicates,
        others=checker.others,
        seconds=round(time.monotonic() - started, 3),
    )
    log.info(
        "warehouse built: %d night(s) up to %s, %d models, %d checks passed, %.1fs",
        len(result.nights),
        result.nights[-1].isoformat(),
        len(result.models),
        result.checks,
        result.seconds,
    )
    for where, values in result.others.items():
        log.warning("%s: %d row(s) counted as other: %s", where, sum(values.values()), dict(values))
    return result


def _publish(tmp: Path, target: Path, nights: Mapping[dt.date, str]) -> None:
    """Swap the new file in atomically; readers holding the old one keep it.

    Never backwards: a build that read the manifests before a newer night was committed (and
    built by someone else) must not replace that newer warehouse with its older one. Writers
    hold the data dir's lock, so this is the last line of defence for a caller who does not.
    """
    newer = _newer_nights(_published_nights(target), nights)
    if newer:
        raise BuildStaleError(
            f"a newer warehouse was published while this build ran (it holds night(s) "
            f"{', '.join(d.isoformat() for d in newer)} newer than this build's); keeping the newer one"
        )
    os.chmod(tmp, FILE_MODE)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    # A write-ahead log left beside the old file (someone opened it read-write and crashed)
    # would be replayed into the new file on its next open: it belongs to the old file, drop it.
    stale_wal = Path(f"{target}.wal")
    if stale_wal.exists():
        log.warning("removing a stale write-ahead log %s (it belongs to the replaced warehouse)", stale_wal)
        stale_wal.unlink()
    os.replace(tmp, target)
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _published_nights(path: Path) -> dict[dt.date, str]:
    """Night -> ``committed_at`` of the warehouse published at ``path`` (empty: none readable)."""
    if not path.is_file():
        return {}
    try:
        with contextlib.closing(duckdb.connect(str(path), read_only=True)) as con:
            rows = con.execute("SELECT snapshot_date, committed_at FROM meta.nights").fetchall()
    except duckdb.Error:
        return {}  # unreadable, or from an older layout: replacing it is right
    return dict(rows)


def _newer_nights(published: Mapping[dt.date, str], ours: Mapping[dt.date, str]) -> list[dt.date]:
    """Nights the published warehouse holds that this build lacks, or holds in a later commit."""
    return sorted(d for d, at in published.items() if d not in ours or at > ours[d])


def _remove_stale_temporaries(root: Path) -> None:
    """Remove temporary files of builds whose process is gone (a crash mid-build)."""
    for path in root.glob(f"{TMP_PREFIX}*"):
        pid_text = path.name.removeprefix(TMP_PREFIX).split("-", 1)[0]
        if pid_text.isdigit() and _alive(int(pid_text)):
            continue
        log.info("removing %s, left by an interrupted build", path)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_meta(con: duckdb.DuckDBPyConnection, manifests: Sequence[Manifest]) -> None:
    nights = pa.table(
        {
            "snapshot_date": pa.array([m.snapshot_date for m in manifests], pa.date32()),
            "run_id": [m.run_id for m in manifests],
            "mode": [m.mode for m in manifests],
            "committed_at": [m.committed_at for m in manifests],
            "watermark": pa.array([m.watermark for m in manifests], pa.string()),
            "clients_synced": pa.array([m.clients_synced for m in manifests], pa.int64()),
        }
    )
    con.register("nights_arrow", nights)
    con.execute("CREATE TABLE meta.nights AS SELECT * FROM nights_arrow")
    con.unregister("nights_arrow")


# --------------------------------------------------------------------------------------------
# Landing: copy the manifests' files into the schema ``landing``
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _LandedFile:
    table: str
    snapshot_date: dt.date
    file_index: int
    relative: str
    absolute: str
    rows: int  # the night's manifest row count for the table (all files)


def _manifest_files(data_dir: DataDir, manifests: Sequence[Manifest]) -> list[_LandedFile]:
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
                    raise BuildInputError(f"{where}: file {relative!r} is outside {landing}")
                if not path.is_file():
                    raise BuildInputError(f"{where}: names a missing file {path}")
                if str(path) in seen:
                    raise BuildInputError(
                        f"{where}: file {relative!r} is already named by night {seen[str(path)].isoformat()}"
                    )
                seen[str(path)] = manifest.snapshot_date
                out.append(
                    _LandedFile(table_name, manifest.snapshot_date, index, relative, str(path), files.rows)
                )
    return out


def _load_landing(
    con: duckdb.DuckDBPyConnection, data_dir: DataDir, manifests: Sequence[Manifest], checker: _Checker
) -> None:
    files = _manifest_files(data_dir, manifests)
    unknown = sorted({f.table for f in files} - {t.name for t in TABLES} - {QUARANTINE})
    if unknown:
        log.warning("manifests name tables this build does not know (ignored): %s", ", ".join(unknown))
    listing = pa.table(
        {
            "table_name": [f.table for f in files],
            "snapshot_date": pa.array([f.snapshot_date for f in files], pa.date32()),
            "file_index": pa.array([f.file_index for f in files], pa.int32()),
            "file": [f.relative for f in files],
            "absolute_path": [f.absolute for f in files],
        },
        schema=pa.schema(
            [
                ("table_name", pa.string()),
                ("snapshot_date", pa.date32()),
                ("file_index", pa.int32()),
                ("file", pa.string()),
                ("absolute_path", pa.string()),
            ]
        ),
    )
    con.register("listing_arrow", listing)
    con.execute("CREATE TEMP TABLE landed_files AS SELECT * FROM listing_arrow")
    con.execute("CREATE TABLE meta.landed_files AS SELECT * EXCLUDE (absolute_path) FROM listing_arrow")
    con.unregister("listing_arrow")
    for table in TABLES:
        _load_table(con, table.name, table.schema, [f for f in files if f.table == table.name])
        expected = {
            m.snapshot_date: (m.tables[table.name].rows if table.name in m.tables else 0) for m in manifests
        }
        checker.check_manifest_rows(f"landing.{table.name}", expected)
    _load_table(con, QUARANTINE, QUARANTINE_SCHEMA, [f for f in files if f.table == QUARANTINE])
    checker.check_manifest_rows(
        f"landing.{QUARANTINE}", {m.snapshot_date: m.quarantine.rows for m in manifests}
    )


def _load_table(
    con: duckdb.DuckDBPyConnection, name: str, declared: pa.Schema, files: Sequence[_LandedFile]
) -> None:
    schema = declared
    for column, arrow_type in LINEAGE_COLUMNS.items():
        schema = schema.append(pa.field(column, arrow_type))
    con.register("empty_arrow", schema.empty_table())
    con.execute(f"CREATE TABLE landing.{name} AS SELECT * FROM empty_arrow")
    con.unregister("empty_arrow")
    if not files:
        return
    paths = [f.absolute for f in files]
    # hive_partitioning off: the night comes from the manifest, never from the path.
    scan = (
        "read_parquet(?, filename = true, file_row_number = true, union_by_name = true,"
        " hive_partitioning = false)"
    )
    description = con.execute(f"SELECT * FROM {scan} LIMIT 0", [paths]).description or []
    in_files = {d[0] for d in description}
    wanted = [c for c in declared.names if c in in_files]
    missing = [c for c in declared.names if c not in in_files]
    if missing:
        log.warning("landing.%s: column(s) absent from the files, loaded as null: %s", name, missing)
    columns = ", ".join(f'p."{c}"' for c in wanted)
    con.execute(
        f"""
        INSERT INTO landing.{name} BY NAME
        SELECT {columns}, f.snapshot_date, f.file_index AS _file_index,
               p.file_row_number AS _row, f.file AS _source_file
        FROM {scan} AS p
        JOIN landed_files AS f ON f.absolute_path = p.filename AND f.table_name = ?
        """,
        [paths, name],
    )


# --------------------------------------------------------------------------------------------
# Models and checks
# --------------------------------------------------------------------------------------------


def _build_model(con: duckdb.DuckDBPyConnection, model: Model) -> None:
    kind = "VIEW" if model.materialized == "view" else "TABLE"
    try:
        con.execute(f"CREATE {kind} {model.name} AS\n{model.sql}")
    except duckdb.Error as exc:
        raise BuildCheckError(model.name, "builds", f"{exc.__class__.__name__}: {exc}") from None


def _quote_list(values: Iterable[str]) -> str:
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


class _Checker:
    """Runs the checks, fails loudly on the first that does not pass, keeps a log of all."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        self.count = 0
        self.rows: dict[str, int] = {}
        self.duplicates: dict[str, int] = {}
        self.others: dict[str, dict[str, int]] = {}
        self.log: list[tuple[str, str, str]] = []

    def _scalar(self, sql: str, params: Sequence[object] = ()) -> int:
        row = self.con.execute(sql, list(params)).fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def _passed(self, model: str, check: str, detail: str = "") -> None:
        self.count += 1
        self.log.append((model, check, detail))

    def check_manifest_rows(self, name: str, expected: dict[dt.date, int]) -> None:
        """landing.<table>: the rows per night equal the manifest's count."""
        found = dict(self.con.execute(f"SELECT snapshot_date, count(*) FROM {name} GROUP BY 1").fetchall())
        for night, rows in sorted(expected.items()):
            got = int(found.get(night, 0))
            if got != rows:
                raise BuildCheckError(
                    name,
                    "manifest_rows",
                    f"night {night.isoformat()}: {got} row(s) in the files, the manifest says {rows}",
                )
        self.rows[name] = sum(int(v) for v in found.values())
        self._passed(name, "manifest_rows")

    def check_model(self, model: Model) -> None:
        self.rows[model.name] = self._scalar(f"SELECT count(*) FROM {model.name}")
        self._not_null(model)
        self._unique(model)
        for enum in model.enums:
            self._enum(model, enum)
        for reference in model.references:
            self._reference(model, reference)
        if model.source:
            self._reconcile(model, model.source)

    def _not_null(self, model: Model) -> None:
        condition = " OR ".join(f"{k} IS NULL" for k in model.key)
        nulls = self._scalar(f"SELECT count(*) FROM {model.name} WHERE {condition}")
        if nulls:
            raise BuildCheckError(
                model.name, f"not_null({', '.join(model.key)})", f"{nulls} row(s) with a null key"
            )
        self._passed(model.name, f"not_null({', '.join(model.key)})")

    def _unique(self, model: Model) -> None:
        key = ", ".join(model.key)
        check = f"unique({key})"
        dupes = self.con.execute(
            f"SELECT {key}, count(*) AS n FROM {model.name} GROUP BY {key} HAVING count(*) > 1 "
            f"ORDER BY n DESC, {key} LIMIT 3"
        ).fetchall()
        if dupes:
            total = self._scalar(
                f"SELECT count(*) FROM (SELECT {key} FROM {model.name} GROUP BY {key} HAVING count(*) > 1)"
            )
            examples = "; ".join(f"{tuple(str(v) for v in row[:-1])} x{row[-1]}" for row in dupes)
            raise BuildCheckError(model.name, check, f"{total} duplicated key(s), e.g. {examples}")
        self._passed(model.name, check)

    def _enum(self, model: Model, enum: EnumCheck) -> None:
        check = f"accepted_values({enum.column})"
        bad = self.con.execute(
            f"SELECT {enum.column}, count(*) FROM {model.name} "
            f"WHERE {enum.column} IS NULL OR {enum.column} NOT IN ({_quote_list(enum.allowed)}) "
            f"GROUP BY 1 ORDER BY 2 DESC LIMIT 5"
        ).fetchall()
        if bad:
            raise BuildCheckError(model.name, check, f"values outside {list(enum.allowed)}: {dict(bad)}")
        self._passed(model.name, check)
        # Count the rows mapped to 'other' once, where the vendor's value is kept (staging's
        # <column>_raw), so an unknown status is visible in the build's result and log.
        if "other" not in enum.allowed or model.layer != "staging":
            return
        raw = f"{enum.column}_raw"
        columns = {d[0] for d in self.con.execute(f"SELECT * FROM {model.name} LIMIT 0").description or []}
        if raw not in columns:
            return
        counted = self.con.execute(
            f"SELECT coalesce(CAST({raw} AS VARCHAR), '<null>'), count(*) FROM {model.name} "
            f"WHERE {enum.column} = 'other' GROUP BY 1 ORDER BY 1"
        ).fetchall()
        if counted:
            self.others[f"{model.name}.{enum.column}"] = Counter({str(k): int(n) for k, n in counted})

    def _reference(self, model: Model, reference: Reference) -> None:
        cols = ", ".join(reference.columns)
        check = f"references({reference.target} ({cols}))"
        missing = self._scalar(
            f"SELECT count(*) FROM (SELECT {cols} FROM {model.name} "
            f"EXCEPT SELECT {cols} FROM {reference.target})"
        )
        if missing:
            raise BuildCheckError(model.name, check, f"{missing} ({cols}) value(s) not in {reference.target}")
        self._passed(model.name, check)

    def _reconcile(self, model: Model, source: str) -> None:
        """Staging keeps one row per distinct key of its landing table: nothing lost, nothing made up."""
        key = ", ".join(model.key)
        check = f"reconciles_with({source})"
        landed = self._scalar(f"SELECT count(*) FROM {source}")
        distinct = self._scalar(f"SELECT count(*) FROM (SELECT DISTINCT {key} FROM {source})")
        staged = self.rows[model.name]
        if staged != distinct:
            raise BuildCheckError(
                model.name,
                check,
                f"{staged} row(s) in staging, {distinct} distinct key(s) among {landed} landed row(s)",
            )
        if landed != staged:
            self.duplicates[model.name] = landed - staged
            log.warning(
                "%s: %d duplicate landed row(s) dropped (same key, same night)", model.name, landed - staged
            )
        self._passed(model.name, check, f"{landed} landed, {staged} staged")

    def write_log(self) -> None:
        table = pa.table(
            {
                "model": [m for m, _, _ in self.log],
                "check_name": [c for _, c, _ in self.log],
                "detail": [d for _, _, d in self.log],
            }
        )
        self.con.register("checks_arrow", table)
        self.con.execute("CREATE TABLE meta.checks AS SELECT * FROM checks_arrow")
        self.con.unregister("checks_arrow")


def _write_model_catalogue(con: duckdb.DuckDBPyConnection, models: Sequence[Model]) -> None:
    """meta.models: what each table or view is, for analysts (``SELECT * FROM meta.models``)."""
    table = pa.table(
        {
            "name": [m.name for m in models],
            "layer": [m.layer for m in models],
            "materialized": [m.materialized for m in models],
            "grain": [m.grain for m in models],
            "key": [", ".join(m.key) for m in models],
            "file": [f"sql/{m.layer}/{m.path.name}" for m in models],
        }
    )
    con.register("models_arrow", table)
    con.execute("CREATE TABLE meta.models AS SELECT * FROM models_arrow")
    con.unregister("models_arrow")


def committed_nights(data_dir: DataDir) -> list[dt.date]:
    """The committed nights of the landing zone, oldest first."""
    return [m.snapshot_date for m in read_manifests(data_dir.manifests)]
