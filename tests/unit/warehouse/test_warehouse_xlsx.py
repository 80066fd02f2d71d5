"""Issue 8: the night's reports as one XLSX workbook that managers' spreadsheets open right.

Read back with openpyxl (typed cells, formats, header, TOTAL rows, print setup, the same values
as the CSVs), then opened by a real spreadsheet: LibreOffice converts it to PDF and the PDF's
text must show client numbers with their leading zeros, accented names, money with 2 decimals.

LibreOffice (``soffice``) and ``pdftotext`` are required: without them these tests FAIL (they
are Debian packages that ``tests/checks.py`` installs, see ``SYSTEM_PACKAGES``).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import openpyxl
import pytest
import warehouse_scenario as sc
import yaml
from membersync.extract.settings import ServiceSettings
from membersync.flows.night.nightly import run_night
from membersync.flows.night.options import SyncOptions
from membersync.warehouse.build.builder import build_warehouse
from membersync.warehouse.exports.export import (
    REPORT_NAMES,
    REPORTS,
    export_reports,
    report_path,
    workbook_path,
)
from membersync.warehouse.landing.paths import DataDir
from openpyxl.worksheet.worksheet import Worksheet
from pydantic import SecretStr
from repo_root import REPO
from system import SYSTEM_PACKAGES
from warehouse_scenario import land_scenario, read_csv

NIGHT = sc.NIGHTS[1]
SHEETS = {
    "outstanding_balances_by_store": "Outstanding balances",
    "frozen_memberships_by_store": "Frozen memberships",
    "points_liability_by_store": "Points liability",
    "package_liability_by_store": "Package liability",
    "gift_certificate_liability_by_store": "Gift certificate liability",
    "package_liability_roll_forward": "Package roll-forward",
    "package_liability_roll_forward_monthly": "Package roll-forward month",
    "dues_billing_by_store_month": "Dues billing by month",
    "cohort_retention": "Member cohorts",
    "eft_draw_forecast": "EFT draw forecast",
    "revenue_by_store_day": "Revenue by store and day",
    "membership_status_daily": "Membership status daily",
    "top_debtors": "Top debtors",
    "balance_aging_by_store": "Balance aging",
    "membership_roll_forward": "Membership roll-forward",
    "membership_roll_forward_monthly": "Membership roll-forward month",
    "mrr_by_store": "MRR by store",
    "churn_by_store_month": "Churn by store and month",
    "store_scorecard": "Store scorecard",
}
MONEY = {"amount_owed", "credit_amount", "net_balance", "monthly_dues_total", "amount", "tax", "balance"}
MONEY |= {"owed_0_29", "owed_30_59", "owed_60_89", "owed_90_plus", "revenue_7d"}
MONEY |= {"previous_mrr", "expansion", "contraction", "churned", "paused", "mrr", "liability"}
MONEY |= {"sold", "redeemed", "outstanding", "opening_liability", "closing_liability"}
MONEY |= {"expected_dues", "billed_dues", "gap", "revenue_to_date", "lifetime_value"}
# the scorecard's figures a week and a month earlier: empty here (the scenario has 3 nights)
MONEY_COMPARED = {
    f"{f}{w}" for f in ("mrr", "amount_owed", "owed_90_plus", "revenue_7d") for w in ("_week", "_month")
}
MONEY_COMPARED = {f"{name}_ago" for name in MONEY_COMPARED}
MRR_FLOWS = {"new", "reactivated"}  # money in mrr_by_store, counts in membership_roll_forward
# Money in one sheet, a count in others (by sheet title)
SHEET_MONEY = {
    "MRR by store": frozenset(MRR_FLOWS),
    "Package roll-forward": frozenset({"expired"}),
    "Package roll-forward month": frozenset({"expired"}),
}
RATES = {"frozen_rate", "churn_rate", "churn_rate_12m", "retention_rate"}
DATES = {
    "snapshot_date",
    "business_date",
    "last_payment_date",
    "month",
    "first_night",
    "cohort_month",
    "as_of_date",
}
DATES_COMPARED = {"week_ago_date", "month_ago_date"}
BOOLEANS = {"eft_on_file"}
TEXT = {"storecode", "store_name", "type", "status", "client_number", "client_name"}
SOFFICE_TIMEOUT_S = 240
TITLE_ROW, HEADER_ROW, FIRST_ROW = 1, 2, 3  # openpyxl counts rows from 1


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[DataDir, list[Path]]:
    data_dir = DataDir(tmp_path_factory.mktemp("xlsx") / "data")
    land_scenario(data_dir)
    build_warehouse(data_dir)
    return data_dir, export_reports(data_dir, NIGHT)


@pytest.fixture(scope="module")
def workbook(exported) -> openpyxl.Workbook:
    _, paths = exported
    return openpyxl.load_workbook(paths[-1])


def declared_headings() -> dict[str, dict[str, str]]:
    """Model -> column -> heading, read from the dbt YAML here (not through the product's code)."""
    out: dict[str, dict[str, str]] = {}
    for path in sorted((REPO / "sql").glob("*/_*.yml")):
        for model in yaml.safe_load(path.read_text(encoding="utf-8")).get("models", []):
            out[model["name"]] = {
                c["name"]: ((c.get("config") or {}).get("meta") or {}).get("heading")
                for c in model.get("columns", [])
            }
    return out


HEADINGS = declared_headings()
REPORT_OF_SHEET = {title: name for name, title in SHEETS.items()}


def headings_of(report: str) -> dict[str, str]:
    return HEADINGS["identified_top_debtors" if report == "top_debtors" else report]


def names_of(sheet: Worksheet) -> list[str]:
    """The column names of a sheet, from its headings (row 2) and the YAML."""
    name_of = {h: n for n, h in headings_of(REPORT_OF_SHEET[sheet.title]).items()}
    return [name_of[c.value] for c in sheet[HEADER_ROW]]


def column(sheet: Worksheet, name: str) -> list[Any]:
    """The cells of a column below the header."""
    return [row[names_of(sheet).index(name)] for row in sheet.iter_rows(min_row=FIRST_ROW)]


# --- the file ------------------------------------------------------------------------------------


def test_the_workbook_is_written_beside_the_csvs_atomically_and_owner_only(exported) -> None:
    data_dir, paths = exported
    assert paths[:-1] == [report_path(data_dir, name, NIGHT) for name in REPORT_NAMES]
    assert (
        paths[-1]
        == workbook_path(data_dir, NIGHT)
        == data_dir.reports / "2026-03-02" / "reports_2026-03-02.xlsx"
    )
    assert (paths[-1].stat().st_mode & 0o777) == 0o600
    assert not [p for p in paths[-1].parent.iterdir() if p.name.endswith(".tmp")]
    assert openpyxl.load_workbook(paths[-1]).sheetnames == [SHEETS[name] for name in REPORT_NAMES]
    assert all(len(title) <= 31 for title in SHEETS.values())


def test_a_subset_of_reports_gets_a_workbook_of_that_subset(exported, tmp_path: Path) -> None:
    data_dir, _ = exported
    paths = export_reports(data_dir, sc.NIGHTS[2], ["top_debtors", "eft_draw_forecast"])
    assert paths[-1] == workbook_path(data_dir, sc.NIGHTS[2])
    assert openpyxl.load_workbook(paths[-1]).sheetnames == ["Top debtors", "EFT draw forecast"]


def test_reruns_write_a_byte_identical_workbook(exported) -> None:
    data_dir, paths = exported
    before = paths[-1].read_bytes()
    assert export_reports(data_dir, NIGHT)[-1].read_bytes() == before


# --- cells ---------------------------------------------------------------------------------------


def test_identifiers_and_storecodes_are_text_byte_exact(workbook) -> None:
    debtors = workbook["Top debtors"]
    numbers = column(debtors, "client_number")
    assert numbers and all(c.data_type == "s" and isinstance(c.value, str) for c in numbers)
    assert any(c.value.startswith("0") for c in numbers)  # e.g. "000017", not 17
    assert all(re.fullmatch(r"\d{6}", c.value) for c in numbers)
    stores = workbook["Outstanding balances"]
    codes = [c.value for c in column(stores, "storecode")]
    # trailing spaces kept; DOWNTOWN and downtown are two stores
    assert {sc.DOWNTOWN, sc.DOWNTOWN_LOWER, sc.UPTOWN, sc.EMPTY, sc.NEW} <= set(codes)
    assert "Uptown Día" in [c.value for c in column(stores, "store_name")]
    for sheet in workbook.worksheets:
        for name in TEXT & set(names_of(sheet)):
            assert all(c.value is None or c.data_type == "s" for c in column(sheet, name)), (
                sheet.title,
                name,
            )


def test_money_rates_counts_and_dates_are_typed_and_formatted(workbook) -> None:
    seen: set[str] = set()
    for sheet in workbook.worksheets:
        for name in names_of(sheet):
            cells = [c for c in column(sheet, name) if c.value is not None]
            if not cells:
                continue
            seen.add(name)
            if name in MONEY | MONEY_COMPARED | SHEET_MONEY.get(sheet.title, frozenset()):
                assert all(isinstance(c.value, int | float) and c.number_format == "#,##0.00" for c in cells)
            elif name in RATES:
                # a rate of exactly 0 (no cancellation) reads back as the integer 0
                assert all(isinstance(c.value, int | float) and c.number_format == "0.0000" for c in cells)
            elif name in DATES | DATES_COMPARED:
                assert all(isinstance(c.value, dt.datetime) and c.is_date for c in cells), (sheet.title, name)
                assert {c.number_format for c in cells} == {"yyyy-mm-dd"}
            elif name in BOOLEANS:
                assert all(isinstance(c.value, bool) for c in cells)
            elif name not in TEXT:  # counts
                assert all(type(c.value) is int for c in cells), (sheet.title, name)
    assert seen >= MONEY | RATES | DATES | BOOLEANS


def test_formula_looking_text_stays_text(workbook) -> None:
    names = [c for c in column(workbook["Top debtors"], "client_name")]
    evil = next(c for c in names if c.value and c.value.startswith("="))
    assert evil.value == '=HYPERLINK("http://x") -Evil' and evil.data_type == "s"
    assert "@Mall kiosk" in [c.value for c in column(workbook["Outstanding balances"], "store_name")]
    for sheet in workbook.worksheets:
        assert not [c.coordinate for row in sheet.iter_rows() for c in row if c.data_type == "f"], sheet.title


# --- layout --------------------------------------------------------------------------------------


def test_title_line_header_frozen_bold_filtered_total_bold_widths_and_print_setup(workbook) -> None:
    for name, title in SHEETS.items():
        sheet = workbook[title]
        (shown_title,) = [c.value for c in sheet[TITLE_ROW] if c.value is not None]
        assert shown_title == f"{title} \u2014 all stores \u2014 night of {NIGHT.isoformat()}"
        assert sheet.cell(TITLE_ROW, 1).font.b
        header = [c.value for c in sheet[HEADER_ROW]]
        assert all(c.font.b for c in sheet[HEADER_ROW])
        assert sheet.freeze_panes == "A3"
        assert sheet.page_setup.orientation == "landscape"
        assert sheet.sheet_properties.pageSetUpPr.fitToPage
        # one page wide (1 is the file format's default, so it may be left out), any number tall
        assert (sheet.page_setup.fitToWidth or 1, sheet.page_setup.fitToHeight) == (1, 0)
        assert sheet.print_title_rows.replace("$", "") == "1:2"
        totalled = REPORTS[name].total is not None
        last = sheet.max_row - (1 if totalled else 0)  # the filter leaves TOTAL out
        assert sheet.auto_filter.ref == f"A2:{sheet.cell(HEADER_ROW, len(header)).column_letter}{last}"
        body = list(sheet.iter_rows(min_row=FIRST_ROW))
        if totalled:
            *body, total = body
            assert total[names_of(sheet).index("storecode")].value == "TOTAL"
            assert all(c.font.b for c in total)
        assert not [c for row in body for c in row if c.font.b]
        for i, (heading, name_) in enumerate(zip(header, names_of(sheet), strict=True)):
            width = column_width(sheet, i + 1)
            cells = [shown(name_, r[i].value) for r in sheet.iter_rows(min_row=FIRST_ROW)]
            longest = max([len(heading), *(len(c) for c in cells)])
            assert longest <= width <= max(longest + 8, 10), (title, heading, width)


def test_every_sheet_reads_human_headings_declared_beside_each_columns_description(
    exported, workbook
) -> None:
    """Row 2 of each sheet: each CSV column's heading from the dbt YAML, every one declared, none
    the machine name, none twice in a sheet; the CSV keeps the machine names."""
    data_dir, _ = exported
    for name, title in SHEETS.items():
        csv_header = read_csv(report_path(data_dir, name, NIGHT))[0]
        declared = headings_of(name)
        assert set(declared) == set(csv_header) and all(declared.values()), (name, declared)
        headings = [declared[c] for c in csv_header]
        assert [c.value for c in workbook[title][HEADER_ROW]] == headings
        assert all(h != c for h, c in zip(headings, csv_header, strict=True)), name
        assert len(set(headings)) == len(headings), name


def is_money(name: str, value: Any, sheet_money: frozenset[str] = frozenset()) -> bool:
    return name in MONEY | MONEY_COMPARED | sheet_money or (name in MRR_FLOWS and isinstance(value, float))


def column_width(sheet: Worksheet, index: int) -> float:
    """A column's width; xlsxwriter writes adjacent columns of one width as one range (min..max)."""
    for dimension in sheet.column_dimensions.values():
        if (
            dimension.min is not None
            and dimension.max is not None
            and dimension.min <= index <= dimension.max
        ):
            return float(dimension.width)
    return float(sheet.column_dimensions[sheet.cell(1, index).column_letter].width)


def shown(name: str, value: Any) -> str:
    """The text a spreadsheet shows for a cell of the column (to check the column fits it)."""
    if value is None:
        return ""
    if is_money(name, value):
        return f"{value:,.2f}"
    if name in RATES:
        return f"{value:.4f}"
    if name in DATES | DATES_COMPARED:
        return value.date().isoformat()
    if name in BOOLEANS:
        return "TRUE" if value else "FALSE"
    return str(value)


# --- the same values as the CSV --------------------------------------------------------------------


def expected_csv_text(name: str, value: Any, sheet_money: frozenset[str] = frozenset()) -> str:
    """What the CSV holds for a sheet's value (text the CSV neutralises gets a leading ')."""
    if value is None:
        return ""
    if is_money(name, value, sheet_money):
        return str(Decimal(repr(value)).quantize(Decimal("0.01")))
    if name in RATES:
        return str(Decimal(repr(value)).quantize(Decimal("0.0001")))
    if name in DATES | DATES_COMPARED:
        return value.date().isoformat()
    if name in BOOLEANS:
        return "true" if value else "false"
    if isinstance(value, str):
        formula_like = value[:1] in ("=", "+", "-", "@", "\t", "\r")
        return "'" + value if formula_like and not re.fullmatch(r"[+-]?[\d.]+", value) else value
    return str(value)


@pytest.mark.parametrize("name", REPORT_NAMES)
def test_each_sheet_holds_the_csvs_rows_in_order(exported, workbook, name: str) -> None:
    data_dir, _ = exported
    csv_rows = read_csv(report_path(data_dir, name, NIGHT))
    sheet_rows = [[c.value for c in row] for row in workbook[SHEETS[name]].iter_rows(min_row=HEADER_ROW)]
    header = csv_rows[0]
    assert sheet_rows[0] == [headings_of(name)[c] for c in header]
    assert len(sheet_rows) == len(csv_rows)
    for line, (sheet_row, csv_row) in enumerate(zip(sheet_rows[1:], csv_rows[1:], strict=True), start=2):
        money = SHEET_MONEY.get(SHEETS[name], frozenset())
        got = [expected_csv_text(col, v, money) for col, v in zip(header, sheet_row, strict=True)]
        assert got == csv_row, f"{name} line {line}"
        for col, cell in zip(header, csv_row, strict=True):
            if col in MONEY and cell:  # to the cent, as Decimals
                value = sheet_row[header.index(col)]
                assert Decimal(repr(value)).quantize(Decimal("0.01")) == Decimal(cell)


# --- a real spreadsheet opens it -------------------------------------------------------------------


def require_tool(executable: str) -> str:
    path = shutil.which(executable)
    if path is None:
        pytest.fail(
            f"{executable} is not installed: it is in the Debian package {SYSTEM_PACKAGES[executable]} "
            f"(`tests/checks.py` installs it when run as root; or apt-get install it)",
            pytrace=False,
        )
    return path


def libreoffice_pdf_text(xlsx: Path, workdir: Path) -> str:
    """Open the workbook in LibreOffice Calc (headless), print it to PDF, return the PDF's text."""
    soffice, pdftotext = require_tool("soffice"), require_tool("pdftotext")
    home = workdir / "home"  # soffice writes its user profile under HOME
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(home)}
    done = subprocess.run(
        [soffice, "--headless", "--norestore", "--convert-to", "pdf", "--outdir", str(workdir), str(xlsx)],
        env=env,
        capture_output=True,
        text=True,
        timeout=SOFFICE_TIMEOUT_S,
    )
    pdf = workdir / (xlsx.stem + ".pdf")
    assert done.returncode == 0 and pdf.is_file(), f"soffice failed: {done.stdout} {done.stderr}"
    text = subprocess.run(
        [pdftotext, "-layout", str(pdf), "-"], capture_output=True, text=True, timeout=60, check=True
    )
    return text.stdout


def money_shown(cell: str) -> str:
    """How #,##0.00 shows a CSV money cell: thousands separated, exactly two decimals."""
    return f"{Decimal(cell):,.2f}"


def test_libreoffice_shows_leading_zeros_accents_and_two_decimals(exported, tmp_path: Path) -> None:
    data_dir, paths = exported
    text = libreoffice_pdf_text(paths[-1], tmp_path)
    tokens = set(text.split())
    debtors = read_csv(report_path(data_dir, "top_debtors", NIGHT))
    numbers = [r[debtors[0].index("client_number")] for r in debtors[1:]]
    zeros = [n for n in numbers if n.startswith("00")]
    assert zeros and set(zeros) <= tokens  # "000017", not "17"
    assert "Uptown Día" in text
    # Money ending in a zero cent keeps it: "155.70", never "155.7".
    stores = read_csv(report_path(data_dir, "outstanding_balances_by_store", NIGHT))
    header = stores[0]
    amounts = [
        r[header.index(c)] for r in stores[1:] for c in ("amount_owed", "credit_amount", "net_balance")
    ]
    round_cents = [a for a in amounts if a.endswith("0") and not a.endswith(".00")]
    assert round_cents
    for amount in round_cents:
        shown = money_shown(amount)
        assert shown in tokens, shown
        assert shown[:-1] not in tokens
    # Every amount, as LibreOffice renders it (not as our helper would format it): two decimals.
    assert [a for a in amounts if money_shown(a) not in tokens] == []
    assert {"TOTAL", "2026-03-02"} <= tokens  # totals, dates
    # the title line and human headings, not the CSV's column names
    assert f"Outstanding balances \u2014 all stores \u2014 night of {NIGHT.isoformat()}" in text
    for heading in (
        "Clients owing",
        "Amount owed",
        "Client number",
        "Owed 90+ days",
        "Lifetime value per client",
    ):
        assert heading in text, heading
    assert not {"clients_owing", "amount_owed", "client_number", "snapshot_date"} & tokens
    # booleans read TRUE/FALSE (not 1/0) on each debtor's line
    lines = text.splitlines()
    eft = debtors[0].index("eft_on_file")
    for row, number in zip(debtors[1:], numbers, strict=True):
        line = next(line for line in lines if number in line.split())
        assert ("TRUE" if row[eft] == "true" else "FALSE") in line.split(), line


def test_a_sandbox_night_exports_a_workbook_libreoffice_shows_with_accented_names(
    fresh_sandbox: Callable[..., Any], tmp_path: Path
) -> None:
    """End to end: the sandbox's synthetic clients (names like José, Zoë, Siobhán), synced by the
    nightly run, exported by it, and opened by LibreOffice."""
    sandbox = fresh_sandbox(clients=80, seed=8)
    data_dir = DataDir(tmp_path / "data")
    night = dt.date.today()
    settings = ServiceSettings(sandbox.url, SecretStr("sandbox"), SecretStr("sandbox"))
    summary = run_night(settings, data_dir, night, options=SyncOptions(batch_size=40))
    xlsx = workbook_path(data_dir, night)
    assert str(xlsx) in summary.reports
    debtors = openpyxl.load_workbook(xlsx)["Top debtors"]
    names = [c.value for c in column(debtors, "client_name") if c.value]
    accented = sorted({n for n in names if not n.isascii()})
    assert accented, names
    numbers = [c.value for c in column(debtors, "client_number")]
    assert all(isinstance(n, str) for n in numbers) and any(n.startswith("0") for n in numbers)
    text = libreoffice_pdf_text(xlsx, tmp_path / "pdf")
    for name in accented:
        assert name in text, name
    tokens = set(text.split())
    assert {n for n in numbers if n.startswith("0")} <= tokens
