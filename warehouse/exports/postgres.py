"""The warehouse published into PostgreSQL, where the BI tools already are (docs/postgres.md).

``MEMBERSYNC_PUBLISH_URL`` names the database (no password in it: libpq reads ``PGPASSWORD``,
``~/.pgpass`` or a service file). The marts, the reports and the identity tier land there in
schemas of the same names, by ``COPY`` from the identified catalog, with the warehouse's types:
DuckDB's DECIMAL as ``numeric`` (exact to the cent), dates as ``date``, store-local times as
``timestamp``, instants as ``timestamptz``, client numbers as ``text``.

What to publish is read from the database itself: ``membersync.published_nights`` holds each
night published and the run that committed it. The warehouse's nights whose run differs there
(new, replaced by a re-run, or left behind by a publication that failed) are published; the
nights it has that the warehouse no longer has (retention) are removed. So whatever command
comes next (a night, ``membersync reports``, ``membersync publish``) retries a failed one.

- **One transaction per night**: a night's rows of every table stored by night are replaced;
  the newest night's transaction also replaces the tables kept whole (current state, monthly
  roll-ups, views), merges the events' newest versions, and removes the nights retention
  removed. A reader sees the night before or the night after, never half; a reader in one
  REPEATABLE READ transaction sees one night throughout. A publisher killed half-way leaves
  nothing: PostgreSQL rolls the open transaction back.
- **Whole** (``membersync publish --full``, a new database, a table whose columns changed, a
  forget): the schemas are dropped and made again, loaded, granted and secured in **one
  transaction**. Dropping a table removes its files, so a forgotten person's rows are in no
  table file after it (PostgreSQL's write-ahead log recycles its segments on its own).
- Publishers of one database take turns (a transaction-scoped advisory lock).

Roles and row security: :mod:`membersync.warehouse.exports.pg_roles`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from membersync.extract.settings import Settings
from membersync.warehouse.build.catalog import LATEST, NIGHTLY
from membersync.warehouse.build.project import load_models
from membersync.warehouse.exports import pg_roles as R
from membersync.warehouse.exports.open_tables import NIGHT_COLUMNS
from membersync.warehouse.landing.crashpoints import crashpoint
from membersync.warehouse.landing.paths import DataDir

log = logging.getLogger(__name__)

PUBLISHED_LAYERS = ("marts", "reports", "identity")  # staging is not published
STATE_SCHEMA = "membersync"
STATE = f"{STATE_SCHEMA}.published_nights"
STREAM_ROWS = 100_000  # rows per CSV chunk sent to COPY
LOCK_KEY = 0x6D656D62  # "memb": publishers of one database take turns
NIGHT_TABLE = "marts.nights"  # the warehouse's nights and the runs that committed them
STORES_TABLE = "marts.current_stores"  # the stores the service lists

# DuckDB's type -> PostgreSQL's, as format_type() spells it (so a table's columns compare as text)
PG_TYPES = {
    "VARCHAR": "text",
    "DATE": "date",
    "TIMESTAMP": "timestamp without time zone",
    "TIMESTAMP WITH TIME ZONE": "timestamp with time zone",
    "BIGINT": "bigint",
    "INTEGER": "integer",
    "SMALLINT": "smallint",
    "TINYINT": "smallint",
    "UTINYINT": "smallint",
    "USMALLINT": "integer",
    "UINTEGER": "bigint",
    "UBIGINT": "numeric(20,0)",
    "HUGEINT": "numeric(38,0)",
    "BOOLEAN": "boolean",
    "DOUBLE": "double precision",
    "FLOAT": "real",
    "JSON": "jsonb",
    "TIME": "time without time zone",
    "INTERVAL": "interval",
    "UUID": "uuid",
}


class PublishError(RuntimeError):
    """The publication could not be made; the database still holds what it held before."""


@dataclass(frozen=True)
class PgTable:
    schema: str
    table: str
    kind: str  # "nightly" (a night's rows replaced), "latest" (merged by key), "whole"
    night_column: str | None
    key: tuple[str, ...]
    columns: tuple[tuple[str, str], ...]  # (name, PostgreSQL type)

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def qualified(self) -> str:
        return f"{R.ident(self.schema)}.{R.ident(self.table)}"

    @property
    def grantable(self) -> R.Grantable:
        return R.Grantable(self.schema, self.table, any(c == R.STORE_COLUMN for c, _ in self.columns))


@dataclass
class Publication:
    nights: list[dt.date] = field(default_factory=list)  # nights published
    removed: list[dt.date] = field(default_factory=list)  # nights removed (retention)
    whole: bool = False  # every table made again in one transaction
    rows: int = 0
    bytes: int = 0
    seconds: float = 0.0
    by_kind: dict[str, float] = field(default_factory=dict)  # seconds sending each kind of table

    @property
    def changed(self) -> bool:
        return bool(self.nights or self.removed or self.whole)


def configured() -> str | None:
    return Settings.load().publish_url


def publish_if_configured(data_dir: DataDir, *, full: bool = False) -> Publication | None:
    """After a build, a forget (``full``: no table file keeps a forgotten row) or retention: the
    database brought to the warehouse; nothing when ``MEMBERSYNC_PUBLISH_URL`` is unset."""
    url = configured()
    return publish_warehouse(data_dir, url=url, full=full) if url else None


def where(url: str) -> str:
    """The database for messages: host, port and name, never the user's options."""
    parts = urlsplit(url)
    return f"postgresql://{parts.hostname or 'localhost'}{f':{parts.port}' if parts.port else ''}{parts.path}"


def _nested(duck_type: str) -> bool:
    return duck_type.endswith("]") or duck_type.startswith(("STRUCT(", "MAP("))


# --- the tables -------------------------------------------------------------------------------------


def pg_type(duck_type: str) -> str:
    if _nested(duck_type):
        return "jsonb"  # a list or a struct: JSON, which every BI tool shows as text
    if duck_type.startswith("DECIMAL("):
        return "numeric" + duck_type.removeprefix("DECIMAL").replace(" ", "")
    try:
        return PG_TYPES[duck_type]
    except KeyError:
        raise PublishError(f"no PostgreSQL type for DuckDB's {duck_type}") from None


def published_tables(duck: Any) -> list[PgTable]:
    """Every published model with its columns as the warehouse holds them."""
    rows = duck.execute(
        "select table_schema, table_name, column_name, data_type from information_schema.columns "
        "order by table_schema, table_name, ordinal_position"
    ).fetchall()
    columns: dict[str, list[tuple[str, str]]] = {}
    for schema, table, column, kind in rows:
        columns.setdefault(f"{schema}.{table}", []).append((column, pg_type(kind)))
    out = []
    for model in load_models():
        if model.layer not in PUBLISHED_LAYERS:
            continue
        if model.name not in columns:
            raise PublishError(f"the warehouse has no {model.name}: run `membersync reports` first")
        night = next((c for c in NIGHT_COLUMNS if c in model.key), None)
        kind = (
            "nightly"
            if model.storage == NIGHTLY and night
            else "latest"
            if model.storage == LATEST
            else "whole"
        )
        schema, table = model.name.split(".")
        out.append(
            PgTable(
                schema,
                table,
                kind,
                night if kind == "nightly" else None,
                model.key,
                tuple(columns[model.name]),
            )
        )
    return out


def _create(cur: Any, table: PgTable) -> None:
    cols = ", ".join(f"{R.ident(c)} {t}" for c, t in table.columns)
    cur.execute(f"CREATE TABLE {table.qualified} ({cols})")
    if table.schema == R.IDENTITY_SCHEMA:  # ANALYZE keeps a column's common values in pg_statistic:
        for column, _ in table.columns:  # none of a person's, which a forget could not drop with the table
            cur.execute(f"ALTER TABLE {table.qualified} ALTER COLUMN {R.ident(column)} SET STATISTICS 0")
    indexed = (table.night_column,) if table.night_column else table.key if table.kind == "latest" else ()
    if indexed:
        index = R.ident(f"{table.table}_{'_'.join(indexed)}"[:63])
        cur.execute(f"CREATE INDEX {index} ON {table.qualified} ({', '.join(R.ident(c) for c in indexed)})")


def _pg_columns(cur: Any) -> dict[str, tuple[tuple[str, str], ...]]:
    cur.execute(
        "select n.nspname, c.relname, a.attname, format_type(a.atttypid, a.atttypmod) "
        "from pg_attribute a join pg_class c on c.oid = a.attrelid "
        "join pg_namespace n on n.oid = c.relnamespace "
        "where n.nspname = any(%s) and c.relkind = 'r' and a.attnum > 0 and not a.attisdropped "
        "order by n.nspname, c.relname, a.attnum",
        [list(PUBLISHED_LAYERS)],
    )
    out: dict[str, list[tuple[str, str]]] = {}
    for schema, table, column, kind in cur.fetchall():
        out.setdefault(f"{schema}.{table}", []).append((column, kind))
    return {k: tuple(v) for k, v in out.items()}


# --- copying ----------------------------------------------------------------------------------------


def _copy(
    cur: Any, duck: Any, table: PgTable, into: str, where: str = "", params: Sequence[Any] = ()
) -> tuple[int, int]:
    """COPY the warehouse's rows of ``table`` (``where``) into ``into``; (rows, bytes)."""
    import pyarrow.csv as pacsv

    names = ", ".join(R.ident(c) for c, _ in table.columns)
    values = ", ".join(
        f"to_json({R.ident(c)})::varchar" if t == "jsonb" else R.ident(c) for c, t in table.columns
    )
    sql = f"select {values} from {table.name}" + (f" where {where}" if where else "")
    reader = duck.sql(sql, params=list(params) or None).to_arrow_reader(STREAM_ROWS)
    rows = sent = 0
    options = pacsv.WriteOptions(include_header=False)
    with cur.copy(f"COPY {into} ({names}) FROM STDIN (FORMAT csv)") as copy:
        for batch in reader:
            buffer = io.BytesIO()  # strings quoted, null unquoted and empty: COPY's csv tells them apart
            pacsv.write_csv(batch, buffer, options)
            copy.write(buffer.getbuffer())
            rows, sent = rows + batch.num_rows, sent + buffer.tell()
    return rows, sent


def _replace_night(cur: Any, duck: Any, table: PgTable, night: dt.date) -> tuple[int, int]:
    column = R.ident(str(table.night_column))
    cur.execute(f"DELETE FROM {table.qualified} WHERE {column} = %s", [night])
    return _copy(cur, duck, table, table.qualified, f"{table.night_column} = ?", [night])


def _replace_whole(cur: Any, duck: Any, table: PgTable) -> tuple[int, int]:
    cur.execute(f"DELETE FROM {table.qualified}")  # not TRUNCATE: readers' snapshots keep the old rows
    return _copy(cur, duck, table, table.qualified)


def _merge_latest(cur: Any, duck: Any, table: PgTable, nights: Sequence[dt.date]) -> tuple[int, int]:
    """The versions the nights fetched replace each key's older one."""
    stage = R.ident(f"stage_{table.table}")
    cur.execute(f"CREATE TEMP TABLE {stage} (LIKE {table.qualified}) ON COMMIT DROP")
    marks = ", ".join("?" for _ in nights)
    copied = _copy(cur, duck, table, stage, f"snapshot_date in ({marks})", nights)
    on = " and ".join(f"t.{R.ident(k)} = s.{R.ident(k)}" for k in table.key)
    cur.execute(f"DELETE FROM {table.qualified} t USING {stage} s WHERE {on}")
    cur.execute(f"INSERT INTO {table.qualified} SELECT * FROM {stage}")
    return copied


# --- the publication --------------------------------------------------------------------------------


@contextlib.contextmanager
def _connect(url: str) -> Iterator[Any]:
    import psycopg

    try:
        # autocommit: every write is inside an explicit transaction() block, committed at its end
        con = psycopg.connect(url, connect_timeout=30, application_name="membersync publish", autocommit=True)
    except psycopg.Error as exc:
        raise PublishError(f"cannot connect to {where(url)}: {_first_line(exc)}") from None
    try:
        yield con
    except psycopg.Error as exc:
        raise PublishError(
            f"publishing to {where(url)} failed, nothing changed: {_first_line(exc)}"
        ) from None
    finally:
        con.close()


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]


@contextlib.contextmanager
def _warehouse(data_dir: DataDir) -> Iterator[Any]:
    import duckdb

    if not data_dir.identified_db.is_file():
        raise PublishError(f"no warehouse in {data_dir.root}: run `membersync reports` first")
    con = duckdb.connect(str(data_dir.identified_db), read_only=True)
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.execute("SET enable_progress_bar = false")
        yield con
    finally:
        con.close()


def publish_warehouse(data_dir: DataDir, *, url: str | None = None, full: bool = False) -> Publication:
    """Bring the database to the warehouse (see the module's docstring); raise :class:`PublishError`."""
    url = url or configured()
    if url is None:
        raise PublishError("no database to publish to: set MEMBERSYNC_PUBLISH_URL (docs/postgres.md)")
    started = time.perf_counter()
    with _warehouse(data_dir) as duck, _connect(url) as pg:
        tables = published_tables(duck)
        nights = dict(duck.execute(f"select snapshot_date, run_id from {NIGHT_TABLE} order by 1").fetchall())
        with pg.cursor() as cur:
            full = full or _needs_whole(cur, tables)
            done = (
                _publish_whole(pg, duck, tables, nights)
                if full
                else _publish_nights(pg, duck, tables, nights)
            )
    done.seconds = time.perf_counter() - started
    if done.changed:
        log.info(
            "postgres %s: %d night(s), %d removed%s, %d rows, %d bytes in %.2f s",
            where(url),
            len(done.nights),
            len(done.removed),
            " (whole)" if done.whole else "",
            done.rows,
            done.bytes,
            done.seconds,
        )
    return done


def _needs_whole(cur: Any, tables: Sequence[PgTable]) -> bool:
    """A new database, or a table whose columns are not the warehouse's (a new version)."""
    cur.execute("select to_regclass(%s) is not null", [STATE])
    if not cur.fetchone()[0]:
        return True
    have = _pg_columns(cur)
    return any(have.get(t.name) != t.columns for t in tables)


def _lock(cur: Any) -> None:
    cur.execute("select pg_advisory_xact_lock(%s)", [LOCK_KEY])


def _publish_whole(pg: Any, duck: Any, tables: Sequence[PgTable], nights: dict[dt.date, str]) -> Publication:
    done = Publication(nights=sorted(nights), whole=True)
    with pg.transaction(), pg.cursor() as cur:
        _lock(cur)
        schemas = sorted({t.schema for t in tables})
        cur.execute(f"DROP SCHEMA IF EXISTS {', '.join(R.ident(s) for s in schemas)} CASCADE")
        cur.execute(f"CREATE SCHEMA IF NOT EXISTS {R.ident(STATE_SCHEMA)}")
        cur.execute(f"DROP TABLE IF EXISTS {STATE}")
        cur.execute(
            f"CREATE TABLE {STATE} (snapshot_date date primary key, run_id text not null, "
            "published_at timestamptz not null default now())"
        )
        for schema in schemas:
            cur.execute(f"CREATE SCHEMA {R.ident(schema)}")
        for number, table in enumerate(tables):
            _create(cur, table)
            started = time.perf_counter()
            _count(done, table, started, _copy(cur, duck, table, table.qualified))
            if number == len(tables) // 2:
                crashpoint("publish_mid_night")
        cur.executemany(f"INSERT INTO {STATE} (snapshot_date, run_id) VALUES (%s, %s)", list(nights.items()))
        for statement in _grants(cur, tables):
            cur.execute(statement)
    return done


def _count(done: Publication, table: PgTable, started: float, copied: tuple[int, int]) -> None:
    done.rows += copied[0]
    done.bytes += copied[1]
    done.by_kind[table.kind] = done.by_kind.get(table.kind, 0.0) + time.perf_counter() - started


def _published(cur: Any) -> dict[dt.date, str]:
    cur.execute(f"select snapshot_date, run_id from {STATE}")
    return dict(cur.fetchall())


def _publish_nights(pg: Any, duck: Any, tables: Sequence[PgTable], nights: dict[dt.date, str]) -> Publication:
    with pg.cursor() as cur:
        published = _published(cur)
    pending = sorted(n for n, run in nights.items() if published.get(n) != run)
    removed = sorted(set(published) - set(nights))
    done = Publication(nights=pending, removed=removed)
    if not pending and not removed:
        return done
    steps: list[dt.date | None] = list(pending) or [None]
    for index, night in enumerate(steps):
        last = index == len(steps) - 1
        with pg.transaction(), pg.cursor() as cur:
            _lock(cur)
            _night_step(cur, duck, tables, night, nights, done)
            if last:
                _last_step(cur, duck, tables, pending, removed, done)
    if removed:  # the removed nights' rows, dead since the commit, leave the tables' files now
        for table in tables:
            if table.kind == "nightly":
                pg.execute(f"VACUUM {table.qualified}")
    return done


def _night_step(
    cur: Any,
    duck: Any,
    tables: Sequence[PgTable],
    night: dt.date | None,
    nights: dict[dt.date, str],
    done: Publication,
) -> None:
    if night is None:
        return
    daily = [t for t in tables if t.kind == "nightly"]
    for number, table in enumerate(daily):
        started = time.perf_counter()
        _count(done, table, started, _replace_night(cur, duck, table, night))
        if number == len(daily) // 2:
            crashpoint("publish_mid_night")
    cur.execute(
        f"INSERT INTO {STATE} (snapshot_date, run_id) VALUES (%s, %s) "
        "ON CONFLICT (snapshot_date) DO UPDATE SET run_id = excluded.run_id, published_at = now()",
        [night, nights[night]],
    )


def _last_step(
    cur: Any,
    duck: Any,
    tables: Sequence[PgTable],
    pending: Sequence[dt.date],
    removed: Sequence[dt.date],
    done: Publication,
) -> None:
    """With the newest night: what is kept whole, the events' new versions, retention's removals."""
    for table in tables:
        started = time.perf_counter()
        if table.kind == "nightly" and removed:
            cur.execute(
                f"DELETE FROM {table.qualified} WHERE {R.ident(str(table.night_column))} = any(%s)",
                [list(removed)],
            )
        elif table.kind == "latest" and pending and not removed:
            _count(done, table, started, _merge_latest(cur, duck, table, pending))
        elif table.kind != "nightly":  # whole, or events after retention carried some to kept nights
            _count(done, table, started, _replace_whole(cur, duck, table))
    if removed:
        cur.execute(f"DELETE FROM {STATE} WHERE snapshot_date = any(%s)", [list(removed)])


# --- roles --------------------------------------------------------------------------------------------


def _existing_roles(cur: Any) -> set[str]:
    cur.execute("select rolname from pg_roles")
    return {r for (r,) in cur.fetchall()}


def _grants(cur: Any, tables: Sequence[PgTable], made: Sequence[str] = ()) -> list[str]:
    """The statements that make the grants and policies what ``MEMBERSYNC_PUBLISH_ROLES`` says
    (``made``: roles the same transaction creates first)."""
    roles = Settings.load().publish_roles or {}
    cur.execute(
        "select schemaname, tablename, policyname from pg_policies where schemaname = any(%s)",
        [list(PUBLISHED_LAYERS)],
    )
    policies = cur.fetchall()
    grantable = [t.grantable for t in tables]
    cur.execute(
        "select distinct grantee from information_schema.role_table_grants where table_schema = any(%s)",
        [list(PUBLISHED_LAYERS)],
    )
    granted = {g for (g,) in cur.fetchall()} - {"PUBLIC"}
    owner = cur.execute("select current_user").fetchone()[0]
    out = R.drop_policy_statements(policies)
    out += R.revoke_statements(grantable, granted - {owner})
    have = _existing_roles(cur) | set(made)
    readers = [r for r in (R.ANALYST_ROLE, R.IDENTIFIED_ROLE, *sorted(roles)) if r in have]
    out += R.grant_statements(grantable, roles, have)
    for role in readers:  # which nights are published: every reader's "newest night"
        out += [f"GRANT USAGE ON SCHEMA {R.ident(STATE_SCHEMA)} TO {R.ident(role)}"]
        out += [f"GRANT SELECT ON {STATE} TO {R.ident(role)}"]
    return out


def roles_plan(data_dir: DataDir, url: str) -> list[str]:
    """What ``membersync publish --roles`` runs: the roles made, then the grants and policies."""
    with _warehouse(data_dir) as duck, _connect(url) as pg, pg.cursor() as cur:
        tables = published_tables(duck)
        roles = Settings.load().publish_roles or {}
        _check_stores(duck, roles)
        _check_not_privileged(cur, roles)
        have = _existing_roles(cur)
        made = R.role_statements(roles, have)
        return made + _grants(cur, tables, made=[R.ANALYST_ROLE, R.IDENTIFIED_ROLE, *roles])


def _check_stores(duck: Any, roles: dict[str, tuple[str, ...]]) -> None:
    """A storecode of the role map that is no store of the warehouse is refused (storecodes are
    byte-exact: ``'S01 '`` is not ``'S01'``), rather than a role silently seeing nothing."""
    known = {code for (code,) in duck.execute(f"select distinct storecode from {STORES_TABLE}").fetchall()}
    for role, codes in sorted(roles.items()):
        unknown = [code for code in codes if code not in known]
        if unknown:
            raise PublishError(
                f"MEMBERSYNC_PUBLISH_ROLES: role {role}: {', '.join(map(repr, unknown))} is no store the "
                f"service lists (stores: {', '.join(map(repr, sorted(known)))})"
            )


def _check_not_privileged(cur: Any, roles: dict[str, tuple[str, ...]]) -> None:
    """A store role that is the publisher or a superuser would read every row (row security does
    not bind them): refused, rather than a store manager's login seeing the whole chain."""
    cur.execute("select rolname from pg_roles where rolsuper or rolbypassrls or rolname = current_user")
    privileged = sorted({r for (r,) in cur.fetchall()} & set(roles))
    if privileged:
        raise PublishError(
            f"MEMBERSYNC_PUBLISH_ROLES: {', '.join(privileged)} bypasses row security (the publisher, "
            "a superuser or BYPASSRLS): name a store role of its own"
        )


def apply_roles(statements: Sequence[str], url: str) -> None:
    """Run ``statements`` in one transaction (the roles, their grants and policies, or none)."""
    with _connect(url) as pg, pg.transaction(), pg.cursor() as cur:
        _lock(cur)
        for statement in statements:
            cur.execute(statement)
