"""Issue 63: the warehouse published into a real PostgreSQL server, read as BI tools read it.

One sandbox (60 clients, 3 stores, three canary clients), one PostgreSQL server (Debian's, started
here, every statement it runs logged), one data dir with ``MEMBERSYNC_PUBLISH_URL`` and two store
roles. The module's fixture runs, as a user would (``membersync`` child processes):

1. night 1, full: a new database, published whole; then ``membersync publish --roles``;
2. night 2 after a late correction (a void made at the till of a sale older than any window);
3. night 3, while a reader holds a REPEATABLE READ transaction open and another polls;
4. ``membersync forget`` of canary alpha.

After each step every published report equals the independent truth (``tests/support/truth.py``,
from the sandbox's own state), read back over PostgreSQL. Then the roles are tried with ``psql``,
``psycopg`` and SQLAlchemy's inspector, and a publish is SIGKILLed half-way.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import truth
from canaries import add_canaries
from membersync.extract.sandbox.running import RunningSandbox, start_in_thread
from membersync.extract.sandbox.server import SandboxConfig
from membersync.warehouse.exports.export import REPORTS
from membersync.warehouse.exports.pg_roles import ANALYST_ROLE, IDENTIFIED_ROLE
from nights import TONIGHT
from postgres import Instance, postgres_instance
from privacy_scan import Canary
from reliability import Workspace, assert_ok
from system import system_executable

NIGHTS = (TONIGHT - dt.timedelta(days=2), TONIGHT - dt.timedelta(days=1), TONIGHT)
NORTH, SOUTH = "north_managers", "south_managers"
PER_NIGHT = [n for n, spec in truth.SPECS.items() if spec.per_night]


@dataclasses.dataclass
class Published:
    instance: Instance
    ws: Workspace
    sandbox: RunningSandbox
    canaries: dict[str, Canary]
    stores: dict[str, tuple[str, ...]]  # store role -> its stores
    problems: dict[str, list[str]]  # step -> report differences from the truth
    truths: dict[dt.date, truth.Reports]  # the truth of each night, taken when it was synced
    forgotten: dict[str, str]
    held: dict[str, Any]  # what the reader in one transaction saw, before and after night 3
    polled: list[tuple[dt.date, dict[str, int]]]  # (newest night, rows of each report) per poll
    dry_run: str

    def url(self, user: str = "prefect") -> str:
        return self.instance.url(user)


def pg_reports(url: str, night: dt.date, names: list[str] | None = None) -> truth.Reports:
    """The report rows of ``night`` as PostgreSQL holds them (the truth's own names and types)."""
    out: truth.Reports = {}
    with psycopg.connect(url) as con:
        for name in names or list(truth.REPORT_NAMES):
            where = "snapshot_date = %s" if truth.SPECS[name].per_night else "business_date <= %s"
            cursor = con.execute(f"SELECT * FROM {REPORTS[name].source} WHERE {where}", [night])
            header = [d.name for d in cursor.description or []]
            out[name] = [dict(zip(header, r, strict=True)) for r in cursor.fetchall()]
    return out


def _late_void(sandbox: RunningSandbox) -> str:
    """A void at the till of the oldest saved sale (no endpoint does that): status and lastModified."""

    def void(service: Any) -> str:
        txn = min(
            (t for t in service.transactions.values() if t.status == "Saved"), key=lambda t: t.local_datetime
        )
        txn.status = "Voided"
        service.touch(service.clients[txn.client_number])
        return str(txn.receipt_number)

    return sandbox.call(void)


def _forgotten_key(ws: Workspace, number: str) -> dict[str, str]:
    import json

    from membersync.warehouse.landing.identity import client_hmac

    key = bytes.fromhex(Path(ws.env()["MEMBERSYNC_ERASURE_KEY_FILE"]).read_text().strip())
    register = json.loads((ws.data_dir.root / "privacy" / "erasures.json").read_text())
    by_hmac = {c["hmac"]: c["key"] for e in register["erasures"] for c in e["clients"]}
    return {number: by_hmac[client_hmac(key, number)]}


def _check(p: Published, step: str, night: dt.date) -> None:
    expected = truth.truth_of(p.sandbox, night, p.forgotten)
    p.truths[night] = expected
    p.problems[step] = truth.report_differences(pg_reports(p.url(), night), expected)


def _newest(con: Any) -> dt.date:
    return con.execute("select max(snapshot_date) from membersync.published_nights").fetchone()[0]


def _counts(con: Any, night: dt.date) -> dict[str, int]:
    return {
        name: con.execute(
            f"select count(*) from {REPORTS[name].source} where snapshot_date = %s", [night]
        ).fetchone()[0]
        for name in PER_NIGHT
    }


def _night_3_under_readers(p: Published) -> None:
    """Night 3 synced while one reader holds a REPEATABLE READ transaction and another polls."""
    held = psycopg.connect(p.url())
    held.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    before = _newest(held)
    p.held["before"] = (before, _counts(held, before))
    stop = threading.Event()

    def poll() -> None:
        with psycopg.connect(p.url()) as con:
            con.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            while not stop.is_set():
                with con.transaction():
                    newest = _newest(con)
                    p.polled.append((newest, _counts(con, newest)))

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        assert_ok(p.ws.sync(p.ws.argv(NIGHTS[2])))
    finally:
        stop.set()
        poller.join(60)
    p.held["after"] = (_newest(held), _counts(held, before))
    held.rollback()
    p.held["new"] = _newest(held)
    held.close()


@pytest.fixture(scope="module")
def published() -> Iterator[Published]:
    import tempfile

    with (
        postgres_instance(settings=("log_statement=all", "log_min_error_statement=debug5")) as instance,
        tempfile.TemporaryDirectory(prefix="membersync-pg-") as tmp,
        start_in_thread(SandboxConfig.checked(clients=60, stores=3, seed=63, anchor_date=TONIGHT)) as sandbox,
    ):
        canaries = add_canaries(sandbox)
        codes = sorted(sandbox.service.stores)
        stores = {NORTH: (codes[0],), SOUTH: (codes[1], codes[2])}
        ws = Workspace(Path(tmp), sandbox.url, NIGHTS[0])
        ws.extra_env["MEMBERSYNC_PUBLISH_URL"] = instance.url()
        ws.extra_env["MEMBERSYNC_ERASURE_KEY_FILE"] = str(Path(tmp) / "erasure.key")
        ws.extra_env["MEMBERSYNC_PUBLISH_ROLES"] = "; ".join(f"{r}={','.join(s)}" for r, s in stores.items())
        p = Published(instance, ws, sandbox, canaries, stores, {}, {}, {}, {}, [], "")
        assert_ok(ws.sync(ws.argv(NIGHTS[0])))
        _check(p, "night 1", NIGHTS[0])
        dry = ws.sync(["publish", "--roles", "--dry-run"])
        assert_ok(dry)
        p.dry_run = dry.stdout
        assert_ok(ws.sync(["publish", "--roles"]))
        _logins(instance)
        _late_void(sandbox)
        assert_ok(ws.sync(ws.argv(NIGHTS[1])))
        _check(p, "night 2 (a late void)", NIGHTS[1])
        _night_3_under_readers(p)
        _check(p, "night 3", NIGHTS[2])
        assert_ok(ws.sync(["forget", canaries["alpha"].number, "--reason", "issue 63"]))
        p.forgotten = _forgotten_key(ws, canaries["alpha"].number)
        _check(p, "after the forget", NIGHTS[2])
        yield p


def _logins(instance: Instance) -> None:
    """Logins as an administrator makes them: one per reader, each a member of its group role."""
    with psycopg.connect(instance.url(), autocommit=True) as con:
        for login, role in (("ana", ANALYST_ROLE), ("ida", IDENTIFIED_ROLE), ("nora", NORTH), ("sam", SOUTH)):
            con.execute(f'CREATE ROLE {login} LOGIN IN ROLE "{role}"')


LOGINS = {"ana": ANALYST_ROLE, "ida": IDENTIFIED_ROLE, "nora": NORTH, "sam": SOUTH}


# --- exact ----------------------------------------------------------------------------------------------


def test_every_published_report_equals_the_truth_after_each_night_a_late_void_and_a_forget(
    published: Published,
) -> None:
    assert list(published.problems) == ["night 1", "night 2 (a late void)", "night 3", "after the forget"]
    assert all(rows for rows in pg_reports(published.url(), NIGHTS[2]).values())  # every report has rows
    assert published.problems == {step: [] for step in published.problems}


def test_money_is_numeric_dates_are_dates_and_client_numbers_text(published: Published) -> None:
    from sqlalchemy import create_engine, inspect

    engine = create_engine(published.url().replace("postgresql://", "postgresql+psycopg://"))
    try:
        columns = {
            c["name"]: str(c["type"]) for c in inspect(engine).get_columns("top_debtors", schema="identity")
        }
    finally:
        engine.dispose()
    assert columns["balance"].startswith("NUMERIC("), columns
    assert columns["snapshot_date"] == "DATE" and columns["client_number"] == "TEXT", columns


# --- forgotten ------------------------------------------------------------------------------------------


def _texts(url: str) -> dict[str, str]:
    """Every row of every published table as text, table by table."""
    out = {}
    with psycopg.connect(url) as con:
        tables = con.execute(
            "select schemaname, tablename from pg_tables "
            "where schemaname in ('marts', 'reports', 'identity', 'membersync')"
        ).fetchall()
        for schema, table in tables:
            rows = con.execute(f'select t::text from "{schema}"."{table}" t').fetchall()
            out[f"{schema}.{table}"] = "\n".join(r for (r,) in rows)
    return out


def _hits(text: str, canary: Canary) -> list[str]:
    return [p.pattern for p in canary.patterns()[:-1] if p.search(text)]  # the values, not the number


def test_no_row_file_or_log_line_of_the_forgotten_client_remains(published: Published) -> None:
    alpha, control = published.canaries["alpha"], published.canaries["control"]
    texts = _texts(published.url())
    assert {t: _hits(x, alpha) for t, x in texts.items() if _hits(x, alpha)} == {}
    assert _hits(texts["identity.clients"], control)  # the scan's positive control
    assert _psql(published.url(), "CHECKPOINT").returncode == 0
    files = [f for f in (published.instance.data / "base").rglob("*") if f.is_file()]
    raw = b"".join(f.read_bytes() for f in files).decode("latin-1")
    holders = [str(f) for f in files if _hits(f.read_bytes().decode("latin-1"), alpha)]
    assert _hits(raw, alpha) == [], holders
    assert _hits(raw, control)
    log = published.instance.log.read_text(errors="replace")
    assert "COPY" in log and _hits(log, alpha) == []  # every statement was logged, none named them


# --- roles ---------------------------------------------------------------------------------------------


def _psql(url: str, sql: str) -> subprocess.CompletedProcess[str]:
    psql = system_executable("psql")
    assert psql, "no psql here (Debian: apt-get install postgresql-client)"
    return subprocess.run(
        [psql, url, "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_dry_run_prints_the_roles_grants_and_policies_it_would_make(published: Published) -> None:
    assert 'CREATE ROLE "north_managers" NOLOGIN;' in published.dry_run
    assert "CREATE POLICY" in published.dry_run and "ENABLE ROW LEVEL SECURITY" in published.dry_run
    with psycopg.connect(published.url()) as con:
        assert con.execute("select count(*) from pg_roles where rolname = %s", [NORTH]).fetchone()[0] == 1


def test_the_analyst_role_reads_the_reports_and_not_identity(published: Published) -> None:
    url = published.url("ana")
    assert _psql(url, "select count(*) from reports.store_scorecard").stdout.strip() != "0"
    refused = _psql(url, "select * from identity.clients")
    assert refused.returncode != 0 and "permission denied for schema identity" in refused.stderr
    with psycopg.connect(url) as con, pytest.raises(psycopg.errors.InsufficientPrivilege):
        con.execute("select client_number from identity.top_debtors")
    assert (
        truth.report_differences(pg_reports(published.url("ida"), NIGHTS[2]), published.truths[NIGHTS[2]])
        == []
    )  # the identified role reads the named top debtors


def _store_tables(url: str) -> list[str]:
    with psycopg.connect(url) as con:
        rows = con.execute(
            "select table_schema || '.' || table_name from information_schema.columns "
            "where column_name = 'storecode' and table_schema in ('marts', 'reports') order by 1"
        ).fetchall()
    return [r for (r,) in rows]


@pytest.mark.parametrize("login", ["nora", "sam"])
def test_a_store_role_sees_only_its_stores_rows_in_every_table(published: Published, login: str) -> None:
    stores = published.stores[LOGINS[login]]
    tables = _store_tables(published.url())
    assert "reports.top_debtors" in tables and "reports.store_scorecard" in tables
    with psycopg.connect(published.url()) as admin, psycopg.connect(published.url(login)) as store:
        for table in tables:
            mine = admin.execute(
                f"select count(*) from {table} where storecode = any(%s)", [list(stores)]
            ).fetchone()
            pol = admin.execute(
                "select policyname, roles, qual from pg_policies where schemaname||'.'||tablename = %s",
                [table],
            ).fetchall()
            codes_all = admin.execute(f"select storecode, count(*) from {table} group by 1").fetchall()
            assert store.execute(f"select count(*) from {table}").fetchone() == mine, (
                table,
                pol,
                codes_all,
                stores,
            )
            codes = {c for (c,) in store.execute(f"select distinct storecode from {table}").fetchall()}
            assert codes <= set(stores), (table, codes)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            store.execute("select * from marts.nights")  # no store column: not granted
    names = [n for n in truth.REPORT_NAMES if REPORTS[n].source.startswith("reports.")]
    expected = {
        n: [r for r in rows if r["storecode"] in stores]
        for n, rows in published.truths[NIGHTS[2]].items()
        if n in names
    }
    assert truth.report_differences(pg_reports(published.url(login), NIGHTS[2], names), expected) == []
    assert _psql(published.url(login), "select count(*) from identity.clients").returncode != 0


def test_sqlalchemy_inspector_lists_schemas_tables_and_columns_as_superset_does(published: Published) -> None:
    from sqlalchemy import create_engine, inspect, text

    engine = create_engine(published.url("nora").replace("postgresql://", "postgresql+psycopg://"))
    try:
        inspector = inspect(engine)
        assert {"marts", "reports", "identity"} <= set(inspector.get_schema_names())
        assert "store_scorecard" in inspector.get_table_names(schema="reports")
        assert [c["name"] for c in inspector.get_columns("store_scorecard", schema="reports")][:2]
        with engine.connect() as con:
            codes = {
                r[0] for r in con.execute(text("select distinct storecode from reports.store_scorecard"))
            }
    finally:
        engine.dispose()
    assert codes == set(published.stores[NORTH])


# --- one night at a time ----------------------------------------------------------------------------------


def test_a_reader_in_one_transaction_sees_one_night_throughout_a_publish(published: Published) -> None:
    before, counts = published.held["before"]
    assert before == NIGHTS[1]
    assert published.held["after"] == (NIGHTS[1], counts)  # the same night, the same rows, throughout
    assert published.held["new"] == NIGHTS[2]  # its next transaction sees the next night
    expected = {
        night: {n: len(published.truths[night][n]) for n in PER_NIGHT if n in published.truths[night]}
        for night in NIGHTS[1:]
    }
    seen = {night for night, _ in published.polled}
    assert seen == {NIGHTS[1], NIGHTS[2]}, seen  # the poller saw both sides of the publish ...
    for night, counted in published.polled:  # ... and each time one whole night
        assert {n: counted[n] for n in expected[night]} == expected[night], night


def test_a_publish_killed_half_way_leaves_the_previous_night_whole_and_the_next_command_retries(
    published: Published,
) -> None:
    ws, url = published.ws, published.url()
    with psycopg.connect(url, autocommit=True) as con:  # as if night 3's publication had failed
        con.execute(
            "update membersync.published_nights set run_id = 'failed' where snapshot_date = %s", [NIGHTS[2]]
        )
    killed = ws.sync(["publish"], env=ws.env(MEMBERSYNC_CRASH_AT="publish_mid_night"))
    assert killed.status == -9, killed.describe()
    expected = truth.truth_of(published.sandbox, NIGHTS[2], published.forgotten)
    assert truth.report_differences(pg_reports(url, NIGHTS[2]), expected) == []
    with psycopg.connect(url) as con:
        assert con.execute(
            "select run_id from membersync.published_nights where snapshot_date = %s", [NIGHTS[2]]
        ).fetchone() == ("failed",)
    retried = ws.sync(["publish"])
    assert_ok(retried)
    assert re.search(r": 1 night\(s\), [0-9,]+ rows", retried.stdout), retried.stdout
    assert truth.report_differences(pg_reports(url, NIGHTS[2]), expected) == []
    assert "up to date" in ws.sync(["publish"]).stdout


def test_a_password_in_the_url_is_refused_before_anything_runs(published: Published) -> None:
    ws = published.ws
    refused = ws.sync(
        ["publish"], env=ws.env(MEMBERSYNC_PUBLISH_URL="postgresql://ana:hunter2@127.0.0.1/postgres")
    )
    assert refused.status == 2
    assert "must not carry a password" in refused.stderr and "hunter2" not in refused.stderr + refused.stdout


def test_a_storecode_of_the_role_map_that_is_no_store_is_refused_in_one_line(published: Published) -> None:
    ws = published.ws
    env = ws.env(MEMBERSYNC_PUBLISH_ROLES="north_managers=NOWHERE")
    refused = ws.sync(["publish", "--roles", "--dry-run"], env=env)
    assert refused.status == 1 and "'NOWHERE' is no store the service lists" in refused.stderr, (
        refused.describe()
    )


# --- last: retention changes the history ------------------------------------------------------------


def test_retention_removes_its_nights_from_the_database_and_keeps_the_rest_exact(
    published: Published,
) -> None:
    ws, url = published.ws, published.url()
    assert NIGHTS[0].day != 31 and (NIGHTS[0] + dt.timedelta(days=1)).day != 1  # not a month's end: thinned
    done = ws.sync(["retention"], env=ws.env(MEMBERSYNC_RETENTION="daily=1d"))
    assert_ok(done)
    with psycopg.connect(url) as con:
        nights = [
            n for (n,) in con.execute("select snapshot_date from membersync.published_nights order by 1")
        ]
        left = con.execute(
            "select count(*) from reports.membership_status_daily where snapshot_date = %s", [NIGHTS[0]]
        ).fetchone()[0]
    assert nights == list(NIGHTS[1:]) and left == 0
    expected = truth.truth_of(published.sandbox, NIGHTS[2], published.forgotten)
    assert truth.report_differences(pg_reports(url, NIGHTS[2]), expected) == []
