"""CSV exports, `membersync reports` / `membersync sql`, and readers during a rebuild."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import textwrap
import threading
from decimal import Decimal
from pathlib import Path

import pytest
import warehouse_scenario as sc
from membersync.flows.benchmarks.synthetic import write_night
from membersync.flows.cli.commands import app
from membersync.warehouse.build.builder import build_warehouse
from membersync.warehouse.exports.export import (
    REPORT_NAMES,
    UnknownReportError,
    export_reports,
    neutralise,
    render_csv,
    report_path,
)
from membersync.warehouse.landing.paths import DataDir
from typer.testing import CliRunner
from warehouse_scenario import BOM, land_scenario, read_csv

STORE_REPORTS = (
    "outstanding_balances_by_store",
    "frozen_memberships_by_store",
    "points_liability_by_store",
    "eft_draw_forecast",
)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[DataDir, dict, list[Path]]:
    data_dir = DataDir(tmp_path_factory.mktemp("exp") / "data")
    landed = land_scenario(data_dir)
    build_warehouse(data_dir)
    return data_dir, landed, export_reports(data_dir, sc.NIGHTS[1])


def test_files_names_modes_and_bom(exported) -> None:
    data_dir, _, paths = exported
    night = sc.NIGHTS[1]
    *paths, workbook = paths  # the workbook comes last (tests/unit/warehouse/test_warehouse_xlsx.py)
    assert workbook.name == "reports_2026-03-02.xlsx"
    assert [p.name for p in paths] == [f"{name}_2026-03-02.csv" for name in REPORT_NAMES]
    for name, path in zip(REPORT_NAMES, paths, strict=True):
        assert path == report_path(data_dir, name, night) == data_dir.reports / "2026-03-02" / path.name
        assert (path.stat().st_mode & 0o777) == 0o600
        raw = path.read_bytes()
        assert raw.startswith(BOM) and b"\r\n" in raw
    assert not [p for p in paths[0].parent.iterdir() if p.name.endswith(".tmp")]
    header = read_csv(paths[0])[0]
    assert header == [
        "snapshot_date",
        "storecode",
        "store_name",
        "clients_owing",
        "amount_owed",
        "clients_in_credit",
        "credit_amount",
        "net_balance",
    ]
    # "Día" survives as UTF-8; storecodes keep their trailing spaces.
    rows = read_csv(paths[0])
    assert rows[[r[1] for r in rows].index(sc.UPTOWN)][:3] == ["2026-03-02", sc.UPTOWN, "Uptown Día"]


@pytest.mark.parametrize("name", STORE_REPORTS)
def test_store_reports_end_with_an_exact_total(exported, name: str) -> None:
    data_dir, landed, _ = exported
    rows = read_csv(report_path(data_dir, name, sc.NIGHTS[1]))
    header, body, total = rows[0], rows[1:-1], rows[-1]
    assert total[header.index("storecode")] == "TOTAL"
    assert total[header.index("snapshot_date")] == "2026-03-02"
    assert all(r[header.index("storecode")] != "TOTAL" for r in body)
    expected = sc.EXPECTED[name](landed, sc.NIGHTS[1])
    assert len(body) == len(expected)
    for column in header:
        if column in ("snapshot_date", "storecode", "store_name", "draw_day", "frozen_rate"):
            continue
        parts = [Decimal(r[header.index(column)]) for r in body]
        assert Decimal(total[header.index(column)]) == sum(parts) == sum(Decimal(e[column]) for e in expected)
        if column in ("amount_owed", "credit_amount", "net_balance", "monthly_dues_total"):
            # money: exactly two decimals in every cell, the total included
            assert all(r[header.index(column)].split(".")[1].__len__() == 2 for r in [*body, total])


def test_frozen_rate_of_the_total_is_recomputed(exported) -> None:
    data_dir, _, _ = exported
    rows = read_csv(report_path(data_dir, "frozen_memberships_by_store", sc.NIGHTS[1]))
    header, total = rows[0], rows[-1]
    active, frozen = int(total[header.index("active")]), int(total[header.index("frozen")])
    rate = (Decimal(frozen) / Decimal(active + frozen)).quantize(Decimal("0.0001"), rounding="ROUND_HALF_UP")
    assert total[header.index("frozen_rate")] == str(rate)
    empty_store = next(r for r in rows if r[header.index("storecode")] == sc.EMPTY)
    assert empty_store[header.index("frozen_rate")] == ""  # null when active + frozen = 0


def test_formula_injection_is_neutralised(exported) -> None:
    data_dir, _, _ = exported
    rows = read_csv(report_path(data_dir, "top_debtors", sc.NIGHTS[1]))
    header = rows[0]
    names = [r[header.index("client_name")] for r in rows[1:]]
    assert '\'=HYPERLINK("http://x") -Evil' in names
    stores = read_csv(report_path(data_dir, "outstanding_balances_by_store", sc.NIGHTS[1]))
    assert "'@Mall kiosk" in [r[2] for r in stores]
    # negative money stays a plain number
    credit = next(r for r in stores if r[1] == sc.DOWNTOWN_LOWER)
    assert credit[-1].startswith("-") and Decimal(credit[-1]) < 0
    assert neutralise("-12.50") == "-12.50"
    assert neutralise("+3") == "+3"
    assert neutralise("-Evil") == "'-Evil"
    assert neutralise("+1+1") == "'+1+1"
    assert neutralise("@SUM(A1)") == "'@SUM(A1)"
    assert neutralise("\tx") == "'\tx"
    assert neutralise("\rx") == "'\rx"
    assert neutralise("a=b") == "a=b"
    assert (
        render_csv(["h"], [["=1+1"], [Decimal("-0.50")], [None]]) == BOM + b'h\r\n\'=1+1\r\n-0.50\r\n""\r\n'
    )


def test_revenue_export_holds_the_history_up_to_the_night(exported) -> None:
    data_dir, landed, _ = exported
    rows = read_csv(report_path(data_dir, "revenue_by_store_day", sc.NIGHTS[1]))
    header = rows[0]
    assert header == ["storecode", "business_date", "type", "transactions", "quantity", "amount", "tax"]
    dates = {r[1] for r in rows[1:]}
    assert dates == {"2026-02-28", "2026-03-01", "2026-03-02"}  # 2026-03-03 is after the night
    expected = sc.expected_revenue(landed, up_to=sc.NIGHTS[1])
    assert [r[0] for r in rows[1:]] == [e["storecode"] for e in expected]
    assert [Decimal(r[5]) for r in rows[1:]] == [e["amount"] for e in expected]


def test_reruns_write_byte_identical_csvs(tmp_path: Path) -> None:
    data_dir = DataDir(tmp_path / "data")
    land_scenario(data_dir)
    build_warehouse(data_dir)
    first = {p.name: p.read_bytes() for p in export_reports(data_dir, sc.NIGHTS[2])}
    build_warehouse(data_dir)
    second = {p.name: p.read_bytes() for p in export_reports(data_dir, sc.NIGHTS[2])}
    assert first == second and len(first) == len(REPORT_NAMES) + 1  # the CSVs and the workbook


def test_unknown_report_and_unknown_night(exported) -> None:
    data_dir, _, _ = exported
    with pytest.raises(UnknownReportError, match="unknown report 'nope'"):
        export_reports(data_dir, None, ["nope"])
    with pytest.raises(ValueError, match="not in the warehouse"):
        export_reports(data_dir, dt.date(2025, 1, 1), None)


# ---- the CLI ---------------------------------------------------------------------------------


def invoke(data_dir: Path, *args: str):
    return CliRunner().invoke(app, list(args), env={"MEMBERSYNC_DATA_DIR": str(data_dir), "COLUMNS": "200"})


def test_cli_reports_rebuilds_and_exports(tmp_path: Path) -> None:
    data_dir = DataDir(tmp_path / "data")
    land_scenario(data_dir, nights=2)
    result = invoke(data_dir.root, "reports")
    assert result.exit_code == 0, result.output
    out_dir = data_dir.reports / "2026-03-02"
    expected = sorted([*(f"{n}_2026-03-02.csv" for n in REPORT_NAMES), "reports_2026-03-02.xlsx"])
    assert sorted(p.name for p in out_dir.iterdir()) == expected
    result = invoke(data_dir.root, "reports", "--date", "2026-03-01", "--report", "top_debtors")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (data_dir.reports / "2026-03-01").iterdir()) == [
        "reports_2026-03-01.xlsx",
        "top_debtors_2026-03-01.csv",
    ]


def test_cli_reports_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    data_dir = DataDir(tmp_path / "data")
    land_scenario(data_dir, nights=1)
    result = invoke(data_dir.root, "reports", "--report", "nope")
    assert result.exit_code == 2
    assert "unknown report 'nope'" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    result = invoke(data_dir.root, "reports", "--date", "2020-01-01")
    assert result.exit_code == 2 and "not committed" in result.output
    result = invoke(tmp_path / "missing", "reports")
    assert result.exit_code == 2 and "does not exist" in result.output
    empty = tmp_path / "empty"
    empty.mkdir()
    result = invoke(empty, "reports")
    assert result.exit_code == 2 and "no committed night" in result.output
    assert not (data_dir.warehouse_db).exists(), "bad input builds nothing"


def test_cli_sql_table_csv_and_read_only(exported) -> None:
    data_dir, _, _ = exported
    result = invoke(
        data_dir.root,
        "sql",
        "select storecode, net_balance from reports.outstanding_balances_by_store "
        "where snapshot_date = DATE '2026-03-02' order by storecode",
    )
    assert result.exit_code == 0, result.output
    assert "net_balance" in result.output and "Downtown" not in result.output
    assert "DOWNTOWN" in result.output and "5 row(s)" in result.output

    result = invoke(
        data_dir.root,
        "sql",
        "--csv",
        "select storecode, sum(amount) as amount from reports.revenue_by_store_day "
        "group by all order by storecode",
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "storecode,amount"
    # R1 0.30 + 0.20, R2 19.99, R6 0.70 + 3.00, R8 0.01; R5 is voided
    assert f"{sc.DOWNTOWN},24.20" in lines
    downtown = sum(
        e["amount"] for e in sc.expected_revenue(sc.landed_nights()) if e["storecode"] == sc.DOWNTOWN
    )
    assert downtown == Decimal("24.20")

    result = invoke(data_dir.root, "sql", "drop table reports.top_debtors")
    assert result.exit_code == 2 and "read-only" in result.output.lower()
    result = invoke(data_dir.root, "sql", "select * from no_such_table")
    assert result.exit_code == 2 and "SQL failed" in result.output
    result = invoke(data_dir.root.parent / "nowhere", "sql", "select 1")
    assert result.exit_code == 2 and "does not exist" in result.output


# ---- readers are never blocked by a rebuild --------------------------------------------------

READER = textwrap.dedent(
    """
    import json, sys, duckdb
    path = sys.argv[1]
    con = duckdb.connect(path, read_only=True)
    def answer():
        night, total = con.execute(
            "SELECT max(snapshot_date), sum(net_balance) FROM reports.outstanding_balances_by_store"
        ).fetchone()
        return {"night": str(night), "total": str(total)}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command = line.strip()
        try:
            if command == "reopen":
                con.close()
                con = duckdb.connect(path, read_only=True)
                reply = {"reopened": True}
            elif command == "quit":
                break
            else:
                reply = answer()
        except Exception as exc:  # the test fails on any error a reader would see
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(reply), flush=True)
    """
)


def test_reader_keeps_answering_while_the_warehouse_is_rebuilt(tmp_path: Path) -> None:
    data_dir = DataDir(tmp_path / "data")
    landed = sc.landed_nights()
    write_night(data_dir, sc.NIGHTS[0], landed[sc.NIGHTS[0]])
    build_warehouse(data_dir)
    # Another process (an analyst) holds the warehouse open, read-only, during the next build.
    proc = subprocess.Popen(
        [sys.executable, "-c", READER, str(data_dir.warehouse_db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None

    def ask(command: str = "q") -> dict:
        proc.stdin.write(command + "\n")
        proc.stdin.flush()
        return json.loads(proc.stdout.readline())

    try:
        assert json.loads(proc.stdout.readline()) == {"ready": True}
        before = ask()
        assert before["night"] == "2026-03-01"

        write_night(data_dir, sc.NIGHTS[1], landed[sc.NIGHTS[1]], mode="incremental")
        failures: list[BaseException] = []

        def rebuild() -> None:
            try:
                build_warehouse(data_dir)
            except BaseException as exc:  # reported below
                failures.append(exc)

        builder = threading.Thread(target=rebuild)
        builder.start()
        during = [ask()]
        while builder.is_alive():
            during.append(ask())
        builder.join()
        assert not failures, failures  # the build was not blocked by the reader's open file
        after_build = ask()
        assert all("error" not in a for a in [*during, after_build]), during
        # The reader keeps the file it opened: the previous night's answers, consistent.
        assert all(a == before for a in [*during, after_build])
        assert ask("reopen") == {"reopened": True}
        assert ask()["night"] == "2026-03-02"
    finally:
        if proc.poll() is None:
            proc.stdin.write("quit\n")
            proc.stdin.flush()
            proc.wait(timeout=60)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
