"""The warehouse build: reports against values computed in Python, the checks, committed nights only."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import shutil
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest
import warehouse_scenario as sc
from membersync.flows.benchmarks.synthetic import write_night
from membersync.warehouse.build.builder import BuildResult, build_warehouse
from membersync.warehouse.build.errors import BuildCheckError, BuildInputError
from membersync.warehouse.build.project import load_models
from membersync.warehouse.exports.export import REPORTS
from membersync.warehouse.landing.paths import DataDir


def land_scenario(data_dir: DataDir) -> dict[dt.date, dict[str, list[dict]]]:
    landed = sc.landed_nights()
    for n, (night, tables) in enumerate(landed.items()):
        # Several files per table: the landing zone writes batches.
        write_night(data_dir, night, tables, mode="full" if n == 0 else "incremental", parts=3)
    return landed


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[DataDir, BuildResult, dict]:
    data_dir = DataDir(tmp_path_factory.mktemp("wh") / "data")
    landed = land_scenario(data_dir)
    return data_dir, build_warehouse(data_dir), landed


@contextlib.contextmanager
def reader(data_dir: DataDir) -> Iterator[duckdb.DuckDBPyConnection]:
    # the identified tier: every model (the analyst tier's catalog lacks the identity ones)
    con = duckdb.connect(str(data_dir.identified_db), read_only=True)
    try:
        yield con
    finally:
        con.close()


def query(data_dir: DataDir, sql: str, params: list | None = None) -> list[dict]:
    with reader(data_dir) as con:
        cur = con.execute(sql, params or [])
        return sc.rows_as_dicts([d[0] for d in cur.description], cur.fetchall())


ORDER = {
    "outstanding_balances_by_store": "storecode",
    "frozen_memberships_by_store": "storecode",
    "points_liability_by_store": "storecode",
    "eft_draw_forecast": "storecode, draw_day",
    "membership_status_daily": (
        "storecode, list_position(['active', 'frozen', 'on_hold', 'canceled', 'expired', 'other'], status)"
    ),
    "top_debtors": "storecode, balance DESC, client_number",
}


@pytest.mark.parametrize("report", sorted(sc.EXPECTED))
@pytest.mark.parametrize("night", sc.NIGHTS)
def test_snapshot_report_matches_python(built, report: str, night: dt.date) -> None:
    data_dir, _, landed = built
    source = REPORTS[report].source  # top debtors: the identified tier's, with numbers and names
    got = query(data_dir, f"SELECT * FROM {source} WHERE snapshot_date = ? ORDER BY {ORDER[report]}", [night])
    expected = sc.EXPECTED[report](landed, night)
    assert got == expected
    assert got, "the scenario gives every report rows"


def test_revenue_matches_python(built) -> None:
    data_dir, _, landed = built
    got = query(
        data_dir, "SELECT * FROM reports.revenue_by_store_day ORDER BY storecode, business_date, type"
    )
    assert got == sc.expected_revenue(landed)


def test_vanished_ledger_row_is_not_resurrected(built) -> None:
    data_dir, _, _ = built
    rows = query(
        data_dir,
        "SELECT as_of_date, storecode, balance FROM marts.ledger_balances_daily "
        "JOIN identity.clients USING (client_key) WHERE client_number = ? ORDER BY as_of_date, storecode",
        [sc.SPECIAL],
    )
    assert rows == [
        {"as_of_date": sc.NIGHTS[0], "storecode": sc.DOWNTOWN, "balance": Decimal("100.10")},
        {"as_of_date": sc.NIGHTS[0], "storecode": sc.UPTOWN, "balance": Decimal("-20.05")},
        # night 2 synced the client without its DOWNTOWN row; night 3 did not sync it at all
        {"as_of_date": sc.NIGHTS[1], "storecode": sc.UPTOWN, "balance": Decimal("-20.05")},
        {"as_of_date": sc.NIGHTS[2], "storecode": sc.UPTOWN, "balance": Decimal("-20.05")},
    ]


def test_clients_not_synced_tonight_still_count(built) -> None:
    data_dir, _, _ = built
    counts = query(
        data_dir, "SELECT as_of_date, count(*) AS n FROM marts.clients_daily GROUP BY 1 ORDER BY 1"
    )
    # 69 clients the first night, +1 (000068..000070 join on night 3: 3), none lost
    assert [r["n"] for r in counts] == [69, 69, 72]


def test_voided_transaction_is_not_revenue(built) -> None:
    data_dir, _, _ = built
    (r5,) = query(data_dir, "SELECT status, status_raw FROM marts.transactions WHERE receipt_number = 'R5'")
    assert r5 == {"status": "voided", "status_raw": "Voided"}
    day = query(
        data_dir,
        "SELECT sum(amount) AS amount FROM reports.revenue_by_store_day "
        "WHERE storecode = ? AND business_date = ?",
        [sc.DOWNTOWN, dt.date(2026, 3, 1)],
    )
    assert day == [{"amount": None}]  # R5 was the only sale there that day


def test_statuses_in_odd_casing_and_unknown_status(built) -> None:
    data_dir, result, _ = built
    rows = query(
        data_dir,
        "SELECT DISTINCT status_raw, status FROM staging.memberships ORDER BY status_raw",
    )
    mapping = {r["status_raw"]: r["status"] for r in rows}
    assert mapping["on hold"] == mapping["ON_HOLD"] == mapping["OnHold"] == "on_hold"
    assert mapping[" Active "] == mapping["active"] == "active"
    assert mapping["Suspended"] == "other"
    others = result.others["staging.memberships.status"]
    assert set(others) == {"Suspended"} and others["Suspended"] > 0


def test_storecodes_stay_byte_exact(built) -> None:
    data_dir, _, _ = built
    codes = [
        r["storecode"]
        for r in query(
            data_dir,
            "SELECT storecode FROM reports.outstanding_balances_by_store "
            "WHERE snapshot_date = ? ORDER BY storecode",
            [sc.NIGHTS[1]],
        )
    ]
    assert codes == sorted((s["storecode"] for s in sc.stores_of(1)), key=str.encode)
    assert sc.DOWNTOWN in codes and sc.DOWNTOWN_LOWER in codes and all(len(c) == 10 for c in codes)


def test_money_is_exact_decimal_and_totals_add_up(built) -> None:
    data_dir, _, landed = built
    rows = query(
        data_dir,
        "SELECT * FROM reports.outstanding_balances_by_store WHERE snapshot_date = ?",
        [sc.NIGHTS[2]],
    )
    ledger = sc._as_of(landed, sc.NIGHTS[2], "ledger_balances")
    listed = {s["storecode"] for s in sc.stores_of(2)}
    assert sum(r["net_balance"] for r in rows) == sum(
        r["balance"] for r in ledger if r["storecode"] in listed
    )
    for r in rows:
        assert isinstance(r["amount_owed"], Decimal)
        assert r["amount_owed"] - r["credit_amount"] == r["net_balance"]
    with reader(data_dir) as con:
        types = dict(
            con.execute(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = 'reports' AND table_name = 'revenue_by_store_day'"
            ).fetchall()
        )
    assert types["amount"].startswith("DECIMAL") and types["tax"].startswith("DECIMAL")


def test_result_and_meta(built) -> None:
    data_dir, result, _ = built
    assert result.nights == sc.NIGHTS
    assert result.path == data_dir.warehouse_db
    assert (data_dir.warehouse_db.stat().st_mode & 0o777) == 0o600
    assert (data_dir.identified_db.stat().st_mode & 0o777) == 0o600
    names = {r["name"] for r in query(data_dir, "SELECT name FROM meta.models")}
    assert {f"reports.{n}" for n in sc.EXPECTED} <= names
    nights = query(data_dir, "SELECT snapshot_date, mode FROM marts.nights ORDER BY 1")
    assert [n["mode"] for n in nights] == ["full", "incremental", "incremental"]
    assert not list(data_dir.root.glob("warehouse.duckdb.building-*"))
    # Every model's key is checked (by one of two singular tests): not null, and unique.
    checks = query(data_dir, "SELECT model, check_name FROM meta.checks")
    assert result.checks == len(checks) > 2 * len(load_models())  # what `membersync reports` says passed
    for model in load_models():
        key = ", ".join(model.key)
        assert {"model": model.name, "check_name": f"not_null({key})"} in checks, model.name
        assert {"model": model.name, "check_name": f"unique({key})"} in checks, model.name
    # Every staging model is reconciled with its landed table (one singular test for them all).
    for model in load_models():
        if model.layer == "staging":
            table = model.name.split(".", 1)[1]
            wanted = {"model": model.name, "check_name": f"reconciles_with(landing.{table})"}
            assert wanted in checks, model.name


def test_every_model_declares_grain_and_key() -> None:
    models = load_models()
    assert {m.layer for m in models} == {"staging", "marts", "reports", "identity"}
    for model in models:
        assert model.grain.startswith("one row per"), model.name
        assert model.key, model.name


# ---- the checks fail loudly, naming model and check; the previous warehouse stays ------------


def _project_edited(tmp_path: Path, relative: str, edit: Callable[[str], str]) -> Path:
    """A copy of the dbt project whose file ``relative`` (to ``sql/``) is ``edit`` of the real one."""
    sql_dir = tmp_path / "sql"
    shutil.copytree(Path(load_models()[0].path).parent.parent, sql_dir)
    path = sql_dir / relative
    path.write_text(edit(path.read_text()))
    return sql_dir


def _stg_memberships_edited(tmp_path: Path, edit: Callable[[str], str]) -> Path:
    """A copy of the dbt project whose stg_memberships.sql is ``edit`` of the real one."""
    return _project_edited(tmp_path, "staging/stg_memberships.sql", edit)


def _night_of_two_memberships(data_dir: DataDir) -> None:
    write_night(
        data_dir,
        dt.date(2026, 3, 1),
        {
            "stores": sc.stores_of(0),
            "synced_clients": [{"client_number": "000001"}],
            "memberships": [
                {"client_number": "000001", "membership_id": m, "status": "Active", "storecode": sc.DOWNTOWN}
                for m in ("M1", "M2")
            ],
        },
    )


def test_duplicate_key_fails_naming_model_and_check(tmp_path: Path) -> None:
    data_dir = DataDir(tmp_path / "data")
    night = dt.date(2026, 3, 1)
    base = {
        "stores": sc.stores_of(0),
        "synced_clients": [{"client_number": "000001"}],
        "memberships": [
            {"client_number": "000001", "membership_id": "M1", "status": "Active", "storecode": sc.DOWNTOWN}
        ],
    }
    write_night(data_dir, night, base)
    build_warehouse(data_dir)
    before = data_dir.warehouse_db.read_bytes()

    # The same membership landed twice in the next night (two batches), and a staging model that
    # forgot to deduplicate: the unique-key check catches it.
    dup = dict(base, memberships=base["memberships"] * 2)
    write_night(data_dir, night + dt.timedelta(days=1), dup, parts=2)

    def without_deduplication(text: str) -> str:
        start, end = text.index("    qualify row_number()"), text.index(") = 1") + len(") = 1")
        return text[:start] + text[end:]

    sql_dir = _stg_memberships_edited(tmp_path, without_deduplication)
    with pytest.raises(BuildCheckError) as caught:
        build_warehouse(data_dir, sql_dir=sql_dir)
    assert caught.value.model == "staging.memberships"
    assert caught.value.check == "unique(snapshot_date, membership_id)"
    assert "staging.memberships" in str(caught.value) and "unique" in str(caught.value)
    assert "duplicate_example=2026-03-02, M1" in caught.value.detail, "the repeated key is shown"
    assert data_dir.warehouse_db.read_bytes() == before, "a failed build leaves the warehouse as it was"
    assert not list(data_dir.root.glob("warehouse.duckdb.building-*"))

    # With the real models the duplicate is dropped and counted (reconciled with landing).
    result = build_warehouse(data_dir)
    assert result.duplicates_dropped == {"staging.memberships": 1}


def test_null_key_fails_naming_the_not_null_check(tmp_path: Path) -> None:
    """Case: a model that lets a key column go null fails on not_null(key), not unique(key)
    (one staging test checks both; its failing row says which)."""
    data_dir = DataDir(tmp_path / "data")
    _night_of_two_memberships(data_dir)

    def nulling_m1(text: str) -> str:
        column = "        membership_id,\n"
        assert text.count(column) == 1
        return text.replace(column, "        nullif(membership_id, 'M1') as membership_id,\n")

    sql_dir = _stg_memberships_edited(tmp_path, nulling_m1)
    with pytest.raises(BuildCheckError) as caught:
        build_warehouse(data_dir, sql_dir=sql_dir)
    assert (caught.value.model, caught.value.check) == (
        "staging.memberships",
        "not_null(snapshot_date, membership_id)",
    )
    assert "problem=null" in caught.value.detail and not data_dir.warehouse_db.exists()


def test_case_a_staging_model_that_loses_rows_fails_reconciliation_naming_it(tmp_path: Path) -> None:
    """Case: a staging model that drops a landed key (a filter gone wrong) fails the staging
    reconciliation, naming the model, its landed table and both counts."""
    data_dir = DataDir(tmp_path / "data")
    _night_of_two_memberships(data_dir)

    def dropping_m2(text: str) -> str:
        assert text.endswith("select * from final\n")
        return text.replace("from final\n", "from final where membership_id <> 'M2'\n")

    sql_dir = _stg_memberships_edited(tmp_path, dropping_m2)
    with pytest.raises(BuildCheckError) as caught:
        build_warehouse(data_dir, sql_dir=sql_dir)
    assert (caught.value.model, caught.value.check) == (
        "staging.memberships",
        "reconciles_with(landing.memberships)",
    )
    assert "staged_rows=1" in caught.value.detail and "landed_keys=2" in caught.value.detail
    assert not data_dir.warehouse_db.exists()


def test_case_a_report_with_a_repeated_key_fails_naming_the_report_and_the_key(tmp_path: Path) -> None:
    """Case: a report whose rows repeat (a join gone wrong) fails the key test of marts and
    reports, naming the report, unique(<its key>) and the repeated key; nothing is published."""
    data_dir = DataDir(tmp_path / "data")
    _night_of_two_memberships(data_dir)

    def rows_twice(text: str) -> str:
        assert text.endswith("select * from final\n")
        return text + "union all\nselect * from final\n"

    sql_dir = _project_edited(tmp_path, "reports/membership_status_daily.sql", rows_twice)
    with pytest.raises(BuildCheckError) as caught:
        build_warehouse(data_dir, sql_dir=sql_dir)
    assert (caught.value.model, caught.value.check) == (
        "reports.membership_status_daily",
        "unique(snapshot_date, storecode, status)",
    )
    # every row twice: each key of the night repeated, one of them shown
    counts = dict(re.findall(r"(n_rows|duplicate_keys)=(\d+)", caught.value.detail))
    assert int(counts["n_rows"]) == 2 * int(counts["duplicate_keys"]) > 0, caught.value.detail
    assert "duplicate_example=2026-03-01, " in caught.value.detail
    assert not data_dir.warehouse_db.exists()


def test_case_a_mart_left_out_of_the_key_test_fails_the_build_saying_where_to_add_it(tmp_path: Path) -> None:
    """Case: a new mart or report that is not in dbt's var keyed_models would have no key check:
    the build fails naming it and the var (an unchecked key is never published)."""
    data_dir = DataDir(tmp_path / "data")
    _night_of_two_memberships(data_dir)
    sql_dir = _project_edited(
        tmp_path, "dbt_project.yml", lambda text: text.replace("    - current_stores\n", "", 1)
    )
    with pytest.raises(BuildCheckError) as caught:
        build_warehouse(data_dir, sql_dir=sql_dir)
    assert (caught.value.model, caught.value.check) == ("marts.current_stores", "key")
    assert "keyed_models" in caught.value.detail and "sql/dbt_project.yml" in caught.value.detail
    assert not data_dir.warehouse_db.exists()


def test_manifest_row_count_mismatch_fails(tmp_path: Path) -> None:
    data_dir = DataDir(tmp_path / "data")
    night = dt.date(2026, 3, 1)
    write_night(data_dir, night, {"stores": sc.stores_of(0)})
    path = data_dir.manifests / "2026-03-01.json"
    body = json.loads(path.read_text())
    body["tables"]["stores"]["rows"] = 99
    path.write_text(json.dumps(body))
    with pytest.raises(BuildCheckError) as caught:
        build_warehouse(data_dir)
    assert (caught.value.model, caught.value.check) == ("landing.stores", "manifest_rows")


def test_rows_of_a_client_not_synced_that_night_fail(tmp_path: Path) -> None:
    data_dir = DataDir(tmp_path / "data")
    write_night(
        data_dir,
        dt.date(2026, 3, 1),
        {
            "synced_clients": [{"client_number": "000001"}],
            "ledger_balances": [
                {"client_number": "000002", "storecode": sc.DOWNTOWN, "balance": Decimal("1.00")}
            ],
        },
    )
    with pytest.raises(BuildCheckError) as caught:
        build_warehouse(data_dir)
    assert caught.value.model == "staging.ledger_balances"
    assert caught.value.check.startswith("references(staging.synced_clients")


def test_only_committed_nights_are_read(tmp_path: Path) -> None:
    data_dir = DataDir(tmp_path / "data")
    write_night(data_dir, dt.date(2026, 3, 1), {"stores": sc.stores_of(0)})
    # A night being written: its files are there, its manifest is not (or only as a temp file).
    manifest = write_night(data_dir, dt.date(2026, 3, 2), {"stores": sc.stores_of(1)})
    committed = data_dir.manifests / "2026-03-02.json"
    committed.rename(committed.with_name("2026-03-02.json.tmp"))
    # An orphan beside a committed night's files (a crashed rerun) is not named: not read either.
    orphan = data_dir.landing / "stores" / "snapshot_date=2026-03-01" / "part-99999.parquet"
    shutil.copy(data_dir.landing / manifest.tables["stores"].files[0], orphan)
    result = build_warehouse(data_dir)
    assert result.nights == (dt.date(2026, 3, 1),)
    assert result.rows["landing.stores"] == len(sc.stores_of(0))


def test_missing_file_or_no_night_is_bad_input(tmp_path: Path) -> None:
    data_dir = DataDir(tmp_path / "data")
    with pytest.raises(BuildInputError, match="no committed night"):
        build_warehouse(data_dir)
    manifest = write_night(data_dir, dt.date(2026, 3, 1), {"stores": sc.stores_of(0)})
    (data_dir.landing / manifest.tables["stores"].files[0]).unlink()
    with pytest.raises(BuildInputError, match="missing file"):
        build_warehouse(data_dir)


def test_quarantined_rows_are_loaded_and_counted(tmp_path: Path) -> None:
    data_dir = DataDir(tmp_path / "data")
    bad = {"table_name": "memberships", "client_number": "000001", "reason": "bad money", "raw": '{"x": 1}'}
    write_night(data_dir, dt.date(2026, 3, 1), {"stores": sc.stores_of(0)}, quarantine=[bad])
    result = build_warehouse(data_dir)
    assert result.rows["landing.quarantine"] == 1
    rows = query(data_dir, "SELECT snapshot_date, table_name, reason FROM landing.quarantine")
    assert rows == [
        {"snapshot_date": dt.date(2026, 3, 1), "table_name": "memberships", "reason": "bad money"}
    ]


def test_case_the_parse_is_shared_by_data_dirs_and_processes_and_a_changed_model_is_parsed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Case: dbt's parse lives in one folder per project and vars under the user's cache, so a
    process new to a data dir (here: this process with its in-memory parses forgotten) re-parses
    nothing; a model changed since is parsed again (dbt's own partial parsing), never served stale."""
    from membersync.warehouse.build import dbt_run

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    sql_dir = tmp_path / "sql"
    shutil.copytree(Path(load_models()[0].path).parent.parent, sql_dir)
    night = {
        "stores": sc.stores_of(0),
        "synced_clients": [{"client_number": "000001"}],
        "memberships": [
            {"client_number": "000001", "membership_id": m, "status": "Active", "storecode": sc.DOWNTOWN}
            for m in ("M1", "M2")
        ],
    }

    def build_as_a_new_process(name: str) -> None:
        monkeypatch.setattr(dbt_run, "_PARSED", {})  # what a new process starts with
        data_dir = DataDir(tmp_path / name)
        write_night(data_dir, dt.date(2026, 3, 1), night)
        build_warehouse(data_dir, sql_dir=sql_dir)

    def parsed_files() -> int:
        # dbt's own account of its last parse in the folder: how many files it parsed afresh
        (folder,) = [p for p in dbt_run.parse_cache_root().iterdir() if p.is_dir()]
        return int(json.loads((folder / "target" / "perf_info.json").read_text())["parsed_path_count"])

    build_as_a_new_process("first")  # a first build (full refresh vars)
    assert parsed_files() > 100  # the whole project (models, tests, dbt's macros)
    build_as_a_new_process("second")  # another data dir, a process that never parsed
    assert parsed_files() == 0, "the project was parsed again"

    model = sql_dir / "staging" / "stg_memberships.sql"
    column = "        membership_id,\n"
    model.write_text(
        model.read_text().replace(column, "        nullif(membership_id, 'M1') as membership_id,\n")
    )
    with pytest.raises(BuildCheckError) as caught:
        build_as_a_new_process("third")
    assert (caught.value.model, caught.value.check) == (
        "staging.memberships",
        "not_null(snapshot_date, membership_id)",
    )
    assert parsed_files() >= 1  # the changed model, parsed again


def test_case_a_reader_of_the_replaced_catalog_still_reads_its_identity_files(tmp_path: Path) -> None:
    """Case: a night landed again (a rerun) replaces its identity files; a reader that opened the
    identified catalog before the rebuild published must still read them (CI once saw "No files
    found" in the readers' scenario when the build swept them at once). They go at the next build."""
    data_dir = DataDir(tmp_path / "data")
    landed = sc.landed_nights()
    first, *_ = landed
    write_night(data_dir, first, landed[first])
    build_warehouse(data_dir)
    held = tmp_path / "held.duckdb"  # what a reader holds: the catalog as it was before the rebuild
    shutil.copy(data_dir.identified_db, held)
    names = "SELECT count(*) FROM identity.clients"
    with contextlib.closing(duckdb.connect(str(held), read_only=True)) as con:
        before = con.execute(names).fetchone()

    write_night(data_dir, first, landed[first])  # the same night again: new identity files
    build_warehouse(data_dir)
    with contextlib.closing(duckdb.connect(str(held), read_only=True)) as con:
        assert con.execute(names).fetchone() == before  # the replaced files are still there

    second = sorted(landed)[1]
    write_night(data_dir, second, landed[second], mode="incremental")
    build_warehouse(data_dir)  # the next build: nobody can hold the catalog that read them
    with (
        contextlib.closing(duckdb.connect(str(held), read_only=True)) as con,
        pytest.raises(duckdb.IOException),
    ):
        con.execute(names).fetchone()
