"""`membersync sql` and `--date` on a real warehouse (issue 8, defect 6).

Each test names the part of defect 6 it covers:

- 6a: an empty query (blank, or only comments) is one line and exit 2, not an AttributeError;
- 6b: a query that starts with an SQL comment (`-- note`) is a query, not an unknown option;
- 6c: the table never cuts a number or a date on a narrow terminal; it folds text and leaves out
  trailing columns, naming them;
- 6d: `--date` takes only YYYY-MM-DD (Python 3.11's fromisoformat also takes 20261124).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest
import warehouse_scenario as sc
from membersync.flows.benchmarks.synthetic import write_night
from membersync.flows.cli.commands import UsageError, app, parse_date
from membersync.warehouse.build.builder import build_warehouse
from membersync.warehouse.exports.table_print import print_table
from membersync.warehouse.landing.paths import DataDir
from rich.cells import cell_len
from rich.console import Console
from typer.testing import CliRunner

MEMBERSYNC = Path(sys.executable).with_name("membersync")  # the installed console script

# Money and dates wider than their headers leave room for, next to text that can fold.
WIDE_QUERY = """
    select snapshot_date, storecode, store_name,
           amount_owed * 1000 as owed_x1000, net_balance, credit_amount,
           clients_owing, snapshot_date + 1 as next_night, store_name as name_again
    from reports.outstanding_balances_by_store
    order by snapshot_date, storecode
"""


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> DataDir:
    """The three nights of warehouse_scenario, landed by the real landing zone and built."""
    data_dir = DataDir(tmp_path_factory.mktemp("sql") / "data")
    landed = sc.landed_nights()
    for n, night in enumerate(sc.NIGHTS):
        write_night(data_dir, night, landed[night], mode="full" if n == 0 else "incremental", parts=2)
    build_warehouse(data_dir)
    return data_dir


def invoke(data_dir: DataDir, *args: str, stdin: str | None = None):
    env = {"MEMBERSYNC_DATA_DIR": str(data_dir.root), "COLUMNS": "200"}
    return CliRunner().invoke(app, list(args), env=env, input=stdin)


def run_cli(data_dir: DataDir, *args: str, columns: int) -> subprocess.CompletedProcess[str]:
    """The real entry point in a child process, on a terminal ``columns`` wide."""
    env = {**os.environ, "MEMBERSYNC_DATA_DIR": str(data_dir.root), "COLUMNS": str(columns)}
    return subprocess.run(
        [str(MEMBERSYNC), *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def assert_one_line_error(result, expected: str) -> None:
    assert result.exit_code == 2, result.output
    assert expected in result.output
    assert "Traceback" not in result.output and "AttributeError" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


# ---- 6a: an empty query -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "query", ["", "   ", "\n\t\n", "-- only a note", "/* a block */", "-- one\n-- two\n", " ; ", "-- x\n;"]
)
def test_defect6a_empty_query_is_one_line_and_exit_2(data_dir: DataDir, query: str) -> None:
    assert_one_line_error(invoke(data_dir, "sql", query), "empty query")
    assert_one_line_error(invoke(data_dir, "sql", "--csv", query), "empty query")


def test_defect6a_empty_query_from_stdin(data_dir: DataDir) -> None:
    assert_one_line_error(invoke(data_dir, "sql", "-", stdin="  -- nothing here\n"), "empty query")


def test_defect6a_real_errors_still_say_sql_failed(data_dir: DataDir) -> None:
    """A comment is not a free pass: a broken query after it is still "SQL failed", exit 2."""
    assert_one_line_error(invoke(data_dir, "sql", "-- note\nselec 1"), "SQL failed")


# ---- 6b: a query that starts with a comment ---------------------------------------------------


def test_defect6b_query_starting_with_a_comment_runs(data_dir: DataDir) -> None:
    result = invoke(
        data_dir, "sql", "-- how many stores?\nselect count(*) as stores from marts.current_stores"
    )
    assert result.exit_code == 0, result.output
    assert "stores" in result.output and "No such option" not in result.output

    # Before or after --csv; an `=` inside the comment is not an option's value either.
    result = invoke(data_dir, "sql", "--csv", "-- total = owed\nselect 16273.45::decimal(12,2) as owed")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == ["owed", "16273.45"]
    result = invoke(data_dir, "sql", "/* c */ select 1 as one -- trailing", "--csv")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == ["one", "1"]


def test_defect6b_comment_first_through_the_real_entry_point(data_dir: DataDir) -> None:
    done = run_cli(data_dir, "sql", "--csv", "-- note\nselect DATE '2024-12-31' as d", columns=80)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["d", "2024-12-31"]


def test_defect6b_query_from_stdin(data_dir: DataDir) -> None:
    result = invoke(data_dir, "sql", "--csv", "-", stdin="-- from a file\nselect 7 as seven\n")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == ["seven", "7"]


def test_defect6b_unknown_option_after_the_query_is_still_refused(data_dir: DataDir) -> None:
    result = invoke(data_dir, "sql", "select 1", "--date", "2026-03-01")
    assert result.exit_code == 2 and "unexpected extra argument" in result.output


# ---- 6c: the table never cuts a number or a date ----------------------------------------------


def table_cells(stdout: str) -> list[list[str]]:
    """The body lines of a rich table as lists of stripped cells (one list per printed line)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("┡"))
    end = next(i for i, line in enumerate(lines) if line.startswith("└"))
    return [[cell.strip() for cell in line.strip("│").split("│")] for line in lines[start + 1 : end]]


def expected_csv(data_dir: DataDir, query: str) -> tuple[list[str], list[list[str]]]:
    """The query's answer read straight from the analyst catalog with DuckDB, each value as
    plain Python writes it (``str`` of a Decimal or an int, a date's ISO form): what the table
    must show, never derived from the CLI's own output."""
    with contextlib.closing(duckdb.connect(str(data_dir.catalog("analyst")), read_only=True)) as con:
        cursor = con.execute(query)
        header = [d[0] for d in cursor.description]
        rows = [["" if v is None else str(v) for v in row] for row in cursor.fetchall()]
    return header, rows


@pytest.mark.parametrize("columns", [60, 72, 45])
def test_defect6c_narrow_terminal_never_cuts_money_or_dates(data_dir: DataDir, columns: int) -> None:
    header, rows = expected_csv(data_dir, WIDE_QUERY)
    done = run_cli(data_dir, "sql", WIDE_QUERY, columns=columns)
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout and "..." not in done.stdout
    assert all(cell_len(line) <= columns for line in done.stdout.splitlines()), done.stdout

    printed = table_cells(done.stdout)
    kept = len(printed[0])
    whole = {"snapshot_date", "owed_x1000", "net_balance", "credit_amount", "clients_owing", "next_night"}
    first_lines = [line for line in printed if line[0]]  # a row's first line holds its date
    assert len(first_lines) == len(rows)
    for line, row in zip(first_lines, rows, strict=True):
        for index, name in enumerate(header[:kept]):
            if name in whole:
                assert line[index] == row[index], (name, line, row)  # the whole value, exactly
    assert any(Decimal(row[3]) >= Decimal("10000") for row in rows), "the money is wide on purpose"

    dropped = header[kept:]
    assert dropped, f"{columns} columns cannot hold all {len(header)} columns"
    note = done.stderr.strip()
    assert len(note.splitlines()) == 1 and "--csv" in note
    assert f"{len(dropped)} column(s) left out" in note and ", ".join(dropped) in note


def test_defect6c_wide_terminal_shows_everything(data_dir: DataDir) -> None:
    header, rows = expected_csv(data_dir, WIDE_QUERY)
    done = run_cli(data_dir, "sql", WIDE_QUERY, columns=250)
    assert done.returncode == 0 and done.stderr == ""
    assert all(f" {name} " in done.stdout for name in header)
    # Every cell whole, on one line each (text stripped as the table pads it).
    assert table_cells(done.stdout) == [[cell.strip() for cell in row] for row in rows]
    assert f"{len(rows)} row(s)" in done.stdout


ROWS = [
    (
        Decimal("16273.45"),
        dt.date(2024, 12, 31),
        "a long store name that has to fold over several lines",
        dt.datetime(2024, 12, 31, 23, 59, 59),
        -1234567,
        True,
        None,
        "tail",
    ),
    (Decimal("-0.01"), None, None, dt.datetime(2025, 1, 1), 0, False, 3.5, "x"),
]
HEADER = ["amount", "business_date", "store_name", "paid_at", "points", "eft", "ratio", "last"]


@pytest.mark.parametrize("width", range(24, 141, 6))
def test_defect6c_any_width_keeps_every_shown_value_whole(width: int) -> None:
    out = Console(file=io.StringIO(), width=width, highlight=False)
    err = Console(file=io.StringIO(), width=width, highlight=False)
    print_table(HEADER, ROWS, full_view="--csv prints every column", out=out, err=err)
    text = out.file.getvalue()  # type: ignore[attr-defined]
    assert "…" not in text
    assert all(cell_len(line) <= width for line in text.splitlines()), text

    printed = table_cells(text)
    kept = len(printed[0])
    wholes = {
        0: ["16273.45", "-0.01"],
        1: ["2024-12-31", "NULL"],
        3: ["2024-12-31 23:59:59", "2025-01-01 00:00:00"],
    }
    wholes |= {4: ["-1234567", "0"], 5: ["true", "false"], 6: ["NULL", "3.5"]}
    shown = [cell for line in printed for cell in line]
    for index, values in wholes.items():
        if index < kept:
            assert all(v in shown for v in values), (index, text)
    if kept > 2:  # text folds, and every character of it is still there
        folded = "".join(line[2] for line in printed[: len(printed)])
        assert folded.replace(" ", "").startswith("alongstorenamethathastofoldoverseverallines")

    dropped = HEADER[kept:]
    note = err.file.getvalue()  # type: ignore[attr-defined]
    assert (", ".join(dropped) in note and "--csv" in note) if dropped else note == ""


# ---- 6d: --date takes only YYYY-MM-DD ---------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "20261124",
        "2026-W47-2",
        "2026W472",
        "2026-11-24T00:00",
        " 2026-11-24",
        "2026-11-24 ",
        "2026-1-24",
        "2026-02-30",
        "\u0662\u0660\u0662\u0666-\u0661\u0661-\u0662\u0664",
        "2026-328",
        "",
    ],
)
def test_defect6d_parse_date_takes_only_yyyy_mm_dd(value: str) -> None:
    with pytest.raises(UsageError, match="expected YYYY-MM-DD"):
        parse_date(value)


def test_defect6d_parse_date_accepts_the_promised_form() -> None:
    assert parse_date("2026-11-24") == dt.date(2026, 11, 24)
    assert parse_date("2024-02-29") == dt.date(2024, 2, 29)
    assert parse_date(None) is None


@pytest.mark.parametrize(
    "args",
    [
        ["reports", "--date", "20260302"],
        ["sync", "--date", "20261124"],
        ["sandbox", "--anchor-date", "20261124", "--port", "0"],
    ],
    ids=["reports", "sync", "sandbox"],
)
def test_defect6d_every_date_option_refuses_the_basic_form(data_dir: DataDir, args: list[str]) -> None:
    result = invoke(data_dir, *args)
    assert_one_line_error(result, f"bad date '{args[2]}': expected YYYY-MM-DD")
    assert not (data_dir.reports / "2026-03-02").exists(), "bad input exports nothing"


def test_defect52_4_the_demo_closing_screen_at_80_columns_never_cuts_an_amount(
    data_dir: DataDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 52 point 4: the demo cut money at 80 columns (``29638.…``); issue 65 replaced its peek
    at a CSV by the chain's figures, which must show every amount whole at 80 columns too."""
    from membersync.flows.cli import demo

    out = Console(file=io.StringIO(), width=80, highlight=False)
    monkeypatch.setattr(demo, "out", out)
    plan = demo.DemoPlan(0, tuple(sc.NIGHTS), data_dir)
    demo.show_closing(plan)
    text = out.file.getvalue()  # type: ignore[attr-defined]
    table = text.split("where it is", 1)[0]
    assert "…" not in text and all(cell_len(line) <= 80 for line in table.splitlines()), text
    figures = demo.chain_figures(data_dir, plan.last)
    amounts = [
        f"{Decimal(v):,.2f}"
        for _, now, before, money in figures
        if money
        for v in (now, before)
        if v is not None
    ]
    assert amounts and all(a in table for a in amounts), (amounts, text)
