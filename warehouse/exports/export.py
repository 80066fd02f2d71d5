"""Export the reports of one night as CSV files and one XLSX workbook for managers.

``DATA_DIR/reports/YYYY-MM-DD/<report>_YYYY-MM-DD.csv``, one file per report:

- UTF-8 with a BOM (Excel then opens accents right), CRLF line ends, a header row;
- money with exactly 2 decimals, rates with 4, exact (DECIMAL from landing to CSV);
- the store reports end with a ``TOTAL`` row whose money is the exact sum of the rows above;
- a text cell starting with ``=``, ``+``, ``-``, ``@``, tab or CR is neutralised against formula
  injection with a leading ``'``, except plain numbers (a negative amount stays ``-12.50``);
- rows in a stable order (storecode in byte order, then the report's own keys), so a rerun on
  the same data writes byte-identical files;
- each file written atomically (temporary file, fsync, rename), readable by its owner only.

``DATA_DIR/reports/YYYY-MM-DD/reports_YYYY-MM-DD.xlsx`` holds the same rows (one sheet per report,
see :mod:`membersync.warehouse.exports.workbook`): a spreadsheet opens it without losing the leading zeros
of client numbers or the second decimal of money, which it does with a CSV.

``revenue_by_store_day`` has no night of its own: its file holds every business day of the
whole history up to and including the night (each transaction in its newest fetched version).
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import io
import logging
import re
from collections.abc import Iterator, Sequence
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import duckdb
from membersync.warehouse.build.memory import bound_connection
from membersync.warehouse.exports.report_table import Report, ReportTable, TotalRow
from membersync.warehouse.exports.workbook import render_workbook
from membersync.warehouse.landing.atomic import write_file_atomic
from membersync.warehouse.landing.paths import DataDir

log = logging.getLogger(__name__)

TOTAL_LABEL = "TOTAL"
_PLAIN_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)$")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


class ExportError(ValueError):
    """Bad export input (unknown report, night not in the warehouse, no warehouse): one line."""


class UnknownReportError(ExportError):
    pass


def _frozen_rate(totals: dict[str, Any]) -> Decimal | None:
    active, frozen = int(totals["active"]), int(totals["frozen"])
    if active + frozen == 0:
        return None
    return (Decimal(frozen) / Decimal(active + frozen)).quantize(Decimal("0.0001"), rounding=ROUND_HALF_UP)


_ROLL_FORWARD = ("opening_active", "new", "reactivated", "frozen", "canceled", "expired", "closing_active")
# The monthly reports' file of a night: every month up to the night's (the current one to date).
_MONTHS_UP_TO_THE_NIGHT = "month <= date_trunc('month', CAST(? AS DATE))"


REPORTS: dict[str, Report] = {
    r.name: r
    for r in (
        Report(
            "outstanding_balances_by_store",
            "storecode",
            total=TotalRow(
                ("clients_owing", "amount_owed", "clients_in_credit", "credit_amount", "net_balance")
            ),
            sheet="Outstanding balances",
        ),
        Report(
            "frozen_memberships_by_store",
            "storecode",
            total=TotalRow(
                ("active", "frozen", "on_hold", "canceled", "expired", "other"),
                derived={"frozen_rate": _frozen_rate},
            ),
            sheet="Frozen memberships",
        ),
        Report(
            "points_liability_by_store",
            "storecode",
            total=TotalRow(("clients_with_points", "points_outstanding")),
            sheet="Points liability",
        ),
        Report(
            "package_liability_by_store",
            "storecode",
            total=TotalRow(("open_packages", "sessions_remaining", "liability")),
            sheet="Package liability",
        ),
        Report(
            "gift_certificate_liability_by_store",
            "storecode",
            total=TotalRow(("sold", "redeemed", "outstanding")),
            sheet="Gift certificate liability",
        ),
        Report(
            "package_liability_roll_forward",
            "storecode",
            total=TotalRow(("opening_liability", "sold", "redeemed", "expired", "closing_liability")),
            sheet="Package roll-forward",
        ),
        Report(
            "package_liability_roll_forward_monthly",
            "month, storecode",
            sheet="Package roll-forward month",
            where=_MONTHS_UP_TO_THE_NIGHT,
        ),
        Report(
            "dues_billing_by_store_month",
            "month, storecode",
            sheet="Dues billing by month",
            where=_MONTHS_UP_TO_THE_NIGHT,
        ),
        Report(
            "cohort_retention",
            "storecode, cohort_month, months_since_join",
            sheet="Member cohorts",
            where=_MONTHS_UP_TO_THE_NIGHT,
        ),
        Report(
            "eft_draw_forecast",
            "storecode, draw_day",
            total=TotalRow(("active_eft_memberships", "monthly_dues_total")),
            sheet="EFT draw forecast",
        ),
        Report(
            "revenue_by_store_day",
            "storecode, business_date, type",
            per_night=False,
            sheet="Revenue by store and day",
        ),
        Report(
            "membership_status_daily",
            "storecode, CASE status WHEN 'active' THEN 1 WHEN 'frozen' THEN 2 WHEN 'on_hold' THEN 3 "
            "WHEN 'canceled' THEN 4 WHEN 'expired' THEN 5 ELSE 6 END, status",
            sheet="Membership status daily",
        ),
        # Managers get the identified tier's report: numbers and names (reports.top_debtors has keys).
        Report(
            "top_debtors",
            "storecode, balance DESC, client_number",
            sheet="Top debtors",
            relation="identity.top_debtors",
            model="identified_top_debtors",
        ),
        Report(
            "balance_aging_by_store",
            "storecode",
            total=TotalRow(
                (
                    "clients_owing",
                    "amount_owed",
                    "owed_0_29",
                    "owed_30_59",
                    "owed_60_89",
                    "owed_90_plus",
                    "clients_90_plus",
                )
            ),
            sheet="Balance aging",
        ),
        Report(
            "membership_roll_forward",
            "storecode",
            total=TotalRow(_ROLL_FORWARD),
            sheet="Membership roll-forward",
        ),
        Report(
            "membership_roll_forward_monthly",
            "month, storecode",
            sheet="Membership roll-forward month",
            where=_MONTHS_UP_TO_THE_NIGHT,
        ),
        Report(
            "mrr_by_store",
            "storecode",
            total=TotalRow(
                ("previous_mrr", "new", "reactivated", "expansion", "contraction", "churned", "paused", "mrr")
            ),
            sheet="MRR by store",
        ),
        Report(
            "churn_by_store_month",
            "month, storecode",
            sheet="Churn by store and month",
            where=_MONTHS_UP_TO_THE_NIGHT,
        ),
        Report(
            "store_scorecard",
            "storecode",
            total=TotalRow(
                tuple(
                    f"{figure}{when}"
                    for figure in (
                        "active_members",
                        "frozen_memberships",
                        "mrr",
                        "amount_owed",
                        "owed_90_plus",
                        "revenue_7d",
                    )
                    for when in ("", "_week_ago", "_month_ago")
                )
            ),
            sheet="Store scorecard",
        ),
    )
}
REPORT_NAMES: tuple[str, ...] = tuple(REPORTS)


def check_report_names(names: Sequence[str] | None) -> list[str]:
    """The reports to export (all by default); an unknown name raises :class:`UnknownReportError`."""
    if not names:
        return list(REPORT_NAMES)
    unknown = [n for n in names if n not in REPORTS]
    if unknown:
        raise UnknownReportError(f"unknown report {unknown[0]!r}; known: {', '.join(REPORT_NAMES)}")
    return list(dict.fromkeys(names))


def night_folder(data_dir: DataDir, night: dt.date, store: str | None = None) -> Path:
    """``reports/<night>/``, or a store's own ``reports/<night>/stores/<storecode>/`` (the storecode
    percent-encoded: it may hold spaces or a ``/``, and two storecodes never share a folder)."""
    folder = data_dir.reports / night.isoformat()
    return folder if store is None else folder / "stores" / store_folder_name(store)


def store_folder_name(store: str) -> str:
    from urllib.parse import quote

    return quote(store, safe="")


def report_path(data_dir: DataDir, report: str, night: dt.date, store: str | None = None) -> Path:
    return night_folder(data_dir, night, store) / f"{report}_{night.isoformat()}.csv"


def workbook_path(data_dir: DataDir, night: dt.date, store: str | None = None) -> Path:
    return night_folder(data_dir, night, store) / f"reports_{night.isoformat()}.xlsx"


@contextlib.contextmanager
def open_at_night(
    data_dir: DataDir, night: dt.date | None, tier: str = "identified"
) -> Iterator[tuple[duckdb.DuckDBPyConnection, dt.date]]:
    """The warehouse's catalog of ``tier`` opened read-only (the reports managers get are the
    identified tier's), and ``night`` checked against its nights (default: the newest); an
    ExportError (one line) when there is no warehouse or no such night."""
    path = data_dir.catalog(tier)
    if not path.is_file():
        raise ExportError(f"no warehouse at {path}: run `membersync reports` first")
    # held to the build's memory bound: the reports of every night are exported one after another
    with contextlib.closing(bound_connection(data_dir, str(path), read_only=True)) as con:
        con.execute("SET TimeZone = 'UTC'")
        nights = [r[0] for r in con.execute("SELECT snapshot_date FROM meta.nights ORDER BY 1").fetchall()]
        if not nights:
            raise ExportError(f"the warehouse {path} holds no night")
        night = night or nights[-1]
        if night not in nights:
            raise ExportError(
                f"night {night.isoformat()} is not in the warehouse (committed nights: "
                f"{nights[0].isoformat()} .. {nights[-1].isoformat()}, {len(nights)} in all)"
            )
        yield con, night


def export_reports(
    data_dir: DataDir,
    night: dt.date | None = None,
    reports: list[str] | None = None,
    store: str | None = None,
) -> list[Path]:
    """Write the CSVs and the workbook of ``night`` (default: the newest night of the warehouse);
    return their paths, the workbook last. With ``store``: that store's rows only, in its folder."""
    names = check_report_names(reports)
    with open_at_night(data_dir, night) as (con, night):
        tables = [read_report(con, REPORTS[name], night, store) for name in names]
        store_name = None if store is None else _store_name(con, night, store)
    written = []
    for table in tables:
        path = report_path(data_dir, table.report.name, night, store)
        write_file_atomic(path, render_csv(table.header, table.rows))
        written.append(path)
    path = workbook_path(data_dir, night, store)
    write_file_atomic(path, render_workbook(tables, night, store, store_name))
    written.append(path)
    log.info("exported %d report(s) of %s to %s", len(tables), night.isoformat(), path.parent)
    return written


def _store_name(con: duckdb.DuckDBPyConnection, night: dt.date, store: str) -> str | None:
    """The store's name in the night's store list (None: not listed that night)."""
    row = con.execute(
        "SELECT store_name FROM reports.store_scorecard WHERE snapshot_date = ? AND storecode = ?",
        [night, store],
    ).fetchone()
    return None if row is None or row[0] is None else str(row[0])


def night_stores(data_dir: DataDir, night: dt.date | None = None) -> list[str]:
    """The storecodes of the night's store list (byte-exact), in byte order."""
    with open_at_night(data_dir, night) as (con, night):
        rows = con.execute(
            "SELECT DISTINCT storecode FROM reports.store_scorecard WHERE snapshot_date = ?", [night]
        ).fetchall()
    return sorted(str(r[0]) for r in rows)


def read_report(
    con: duckdb.DuckDBPyConnection, report: Report, night: dt.date, store: str | None = None
) -> ReportTable:
    """The report's header, column types and rows for the night (one store's, with ``store``),
    in export order, with its TOTAL row."""
    where = report.where or ("snapshot_date = ?" if report.per_night else "business_date <= ?")
    params: list[Any] = [night]
    if store is not None:
        where = f"({where}) AND storecode = ?"
        params.append(store)
    cursor = con.execute(f"SELECT * FROM {report.source} WHERE {where} ORDER BY {report.order_by}", params)
    description = cursor.description or []
    header = [d[0] for d in description]
    types = [str(d[1]) for d in description]
    rows = [list(r) for r in cursor.fetchall()]
    if report.total is not None:
        rows.append(total_row(header, rows, report.total, night))
    return ReportTable(report, header, types, rows)


def total_row(header: list[str], rows: list[list[Any]], spec: TotalRow, night: dt.date) -> list[Any]:
    sums: dict[str, Any] = {}
    for column in spec.sums:
        i = header.index(column)
        values = [r[i] for r in rows if r[i] is not None]
        # a column empty on every row (a night not held, compared with) stays empty in TOTAL
        sums[column] = sum(values, start=_zero_like(rows, i)) if values or not rows else None
    out: list[Any] = []
    for column in header:
        if column == "snapshot_date":
            out.append(night)
        elif column == spec.label_column:
            out.append(TOTAL_LABEL)
        elif column in sums:
            out.append(sums[column])
        elif column in spec.derived:
            out.append(spec.derived[column](sums))
        else:
            out.append(None)
    return out


def _zero_like(rows: list[list[Any]], i: int) -> Any:
    """0 of the column's type: Decimal('0.00') for money so an empty total still has 2 decimals."""
    for r in rows:
        if isinstance(r[i], Decimal):
            return Decimal(0).quantize(r[i])
    return 0


def cell_text(value: Any) -> str:
    """A value as text: exact decimals (never scientific), ISO dates, true/false, empty for null."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, dt.date):
        return value.isoformat()
    return str(value)


def format_cell(value: Any) -> str:
    """A CSV cell for a spreadsheet: :func:`cell_text`, neutralised against formula injection."""
    return neutralise(cell_text(value))


def neutralise(text: str) -> str:
    """Prefix ``'`` to a cell a spreadsheet would run as a formula (plain numbers stay as they are)."""
    if text.startswith(_FORMULA_START) and not _PLAIN_NUMBER.match(text):
        return "'" + text
    return text


def render_csv(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> bytes:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow([neutralise(h) for h in header])
    for row in rows:
        writer.writerow([format_cell(v) for v in row])
    return buffer.getvalue().encode("utf-8-sig")
