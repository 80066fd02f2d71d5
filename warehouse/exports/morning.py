"""The morning report: one self-contained HTML page per night for managers (issue 14).

``DATA_DIR/reports/<night>/morning_report_<night>.html``: the store scorecard (each figure with
its change since a week and a month earlier), a chart per trend over the last 90 nights (owed
and aged debt, frozen rate, active members, MRR, revenue by day), the top debtors per store, and
the night's data-quality line (rows quarantined by the landing zone, the self-audit's findings
when the night has them, the warehouse's freshness).

One file, nothing fetched: the charts are Vega-Lite specifications (altair) rendered to SVG
offline by vl-convert and inlined, the CSS is inline, there is no script. Responsive: the charts
scale to the screen's width and wide tables scroll sideways on a phone.

The figures come from the warehouse's reports (``reports.store_scorecard`` and the reports it
compares, ``identity.top_debtors``, ``reports.revenue_by_store_day``), the identified catalog
opened read-only (the morning report names the top debtors).
"""

from __future__ import annotations

import datetime as dt
import html
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
from membersync.extract.settings import Settings
from membersync.warehouse.exports.export import (
    REPORTS,
    ReportTable,
    night_folder,
    open_at_night,
    read_report,
)
from membersync.warehouse.exports.morning_charts import (
    BUCKETS,
    area_chart,
    bar_chart,
    cohort_chart,
    line_chart,
    month_bars,
)
from membersync.warehouse.landing import freshness as fresh
from membersync.warehouse.landing.atomic import write_file_atomic
from membersync.warehouse.landing.manifest import read_manifest
from membersync.warehouse.landing.paths import DataDir

log = logging.getLogger(__name__)

TREND_NIGHTS = 90
TOP_DEBTORS_SHOWN = 10
COHORTS_SHOWN = 6  # the cohort chart's lines: the months of joining up to the night's
MONTHS_SHOWN = 6  # the month charts' months, up to the night's
# The scorecard's figures: (column, label, money?)
FIGURES: tuple[tuple[str, str, bool], ...] = (
    ("active_members", "Active members", False),
    ("frozen_memberships", "Frozen", False),
    ("mrr", "MRR", True),
    ("amount_owed", "Owed", True),
    ("owed_90_plus", "Owed 90+ days", True),
    ("revenue_7d", "Revenue, 7 days", True),
)


@dataclass(frozen=True)
class Chart:
    key: str  # a stable id (the page's anchor and the browser test's handle)
    title: str
    svg: str  # empty: no data to draw


@dataclass
class MorningData:
    night: dt.date
    scorecard: ReportTable
    charts: list[Chart]
    debtors: dict[str, list[dict[str, Any]]]  # storecode -> rows, largest balance first
    store_names: dict[str, str]
    quality: list[str] = field(default_factory=list)


def morning_report_path(data_dir: DataDir, night: dt.date, store: str | None = None) -> Path:
    return night_folder(data_dir, night, store) / f"morning_report_{night.isoformat()}.html"


def write_morning_report(
    data_dir: DataDir,
    night: dt.date | None = None,
    *,
    now: dt.datetime | None = None,
    store: str | None = None,
) -> Path:
    """Write the night's morning report (default: the newest night of the warehouse; ``store``:
    that store's own, in its folder); its path."""
    data = read_morning_data(data_dir, night, now=now, store=store)
    path = morning_report_path(data_dir, data.night, store)
    write_file_atomic(path, render_html(data).encode("utf-8"))
    log.info("morning report of %s written to %s", data.night.isoformat(), path)
    return path


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


def read_morning_data(
    data_dir: DataDir,
    night: dt.date | None = None,
    *,
    now: dt.datetime | None = None,
    store: str | None = None,
) -> MorningData:
    with open_at_night(data_dir, night) as (con, night):
        scorecard = read_report(con, REPORTS["store_scorecard"], night, store)
        names = {
            str(r[0]): str(r[1])
            for r in con.execute(
                "SELECT storecode, store_name FROM reports.store_scorecard WHERE snapshot_date = ?"
                + _OF_STORE,
                [night, store, store],
            ).fetchall()
        }
        charts = read_charts(con, night, store)
        debtors = read_top_debtors(con, night, store)
    return MorningData(night, scorecard, charts, debtors, names, quality_lines(data_dir, night, now))


def _query(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
    cursor = con.execute(sql, list(params))
    header = [d[0] for d in cursor.description or []]
    return [dict(zip(header, row, strict=True)) for row in cursor.fetchall()]


# Every query of the morning report takes the store last: NULL for the chain, a storecode for its own.
_OF_STORE = " AND (CAST(? AS VARCHAR) IS NULL OR storecode = ?)"


def read_charts(con: duckdb.DuckDBPyConnection, night: dt.date, store: str | None = None) -> list[Chart]:
    """One chart per trend over the last 90 nights (days, for revenue) ending with ``night``
    (``store``: that store's only)."""
    first = night - dt.timedelta(days=TREND_NIGHTS - 1)
    window = [first, night, store, store]
    debt = _debt_points(con, window)
    frozen_rate, active = _membership_points(con, window)
    mrr = _mrr_points(con, window)
    revenue = _revenue_points(con, window)
    packages, gift_certificates = _owed_points(con, window)
    cohorts = _cohort_points(con, [night, night, store, store])
    dues, package_moves = _month_points(con, [night, night, store, store])
    return [
        Chart("debt", "Owed, by age of the debt", area_chart(debt)),
        Chart(
            "frozen-rate", "Frozen rate (frozen / active + frozen)", line_chart(frozen_rate, "rate", ".1%")
        ),
        Chart("active-members", "Active members", line_chart(active, "members", ",d")),
        Chart("mrr", "MRR (monthly dues of active EFT memberships)", line_chart(mrr, "mrr", "$,.0f")),
        Chart("revenue", "Revenue by day (before tax)", bar_chart(revenue)),
        Chart(
            "package-liability",
            "Owed in package sessions (sessions left at the list price)",
            line_chart(packages, "liability", "$,.0f"),
        ),
        Chart(
            "gift-certificates",
            "Gift certificates outstanding (sold - redeemed; the chain's is the sum)",
            line_chart(gift_certificates, "outstanding", "$,.0f"),
        ),
        Chart(
            "package-moves",
            "Package liability by month: sold, redeemed, expired",
            month_bars(package_moves, "moved"),
        ),
        Chart(
            "dues-billing",
            "Dues by month: what memberships say should be billed, and what was billed",
            month_bars(dues, "dues"),
        ),
        Chart(
            "cohort-retention",
            f"Members still with us, by month of joining (the last {COHORTS_SHOWN} cohorts)",
            cohort_chart(cohorts),
        ),
    ]


# The trends' points: ``window`` is [first night, last night, store, store] (see _OF_STORE).


def _debt_points(con: duckdb.DuckDBPyConnection, window: list[Any]) -> list[dict[str, Any]]:
    """What is owed each night, the chain's (or the store's) sum, one point per age bucket."""
    aging = _query(
        con,
        "SELECT snapshot_date, sum(owed_0_29) AS owed_0_29, sum(owed_30_59) AS owed_30_59, "
        "sum(owed_60_89) AS owed_60_89, sum(owed_90_plus) AS owed_90_plus "
        "FROM reports.balance_aging_by_store WHERE snapshot_date BETWEEN ? AND ?"
        + _OF_STORE
        + " GROUP BY 1 ORDER BY 1",
        window,
    )
    return [
        {"night": r["snapshot_date"].isoformat(), "bucket": label, "order": i, "amount": float(r[col])}
        for r in aging
        for i, (col, label) in enumerate(BUCKETS)
    ]


def _membership_points(
    con: duckdb.DuckDBPyConnection, window: list[Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(frozen rate, active members) of each store each night, from one read of the report
    (a store without an active or frozen membership has no rate: no point)."""
    statuses = _query(
        con,
        "SELECT snapshot_date, storecode, store_name, active, frozen, frozen_rate "
        "FROM reports.frozen_memberships_by_store WHERE snapshot_date BETWEEN ? AND ?"
        + _OF_STORE
        + " ORDER BY 1, 2",
        window,
    )
    frozen_rate = [
        {"night": r["snapshot_date"].isoformat(), "store": r["store_name"], "rate": float(r["frozen_rate"])}
        for r in statuses
        if r["frozen_rate"] is not None
    ]
    active = [
        {"night": r["snapshot_date"].isoformat(), "store": r["store_name"], "members": int(r["active"])}
        for r in statuses
    ]
    return frozen_rate, active


def _mrr_points(con: duckdb.DuckDBPyConnection, window: list[Any]) -> list[dict[str, Any]]:
    return [
        {"night": r["snapshot_date"].isoformat(), "store": r["store_name"], "mrr": float(r["mrr"])}
        for r in _query(
            con,
            "SELECT snapshot_date, store_name, mrr FROM reports.mrr_by_store "
            "WHERE snapshot_date BETWEEN ? AND ? AND store_name IS NOT NULL" + _OF_STORE + " ORDER BY 1, 2",
            window,
        )
    ]


def _owed_points(
    con: duckdb.DuckDBPyConnection, window: list[Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(package liability, gift certificates outstanding) of each store each night."""
    points = []
    for report, value in (
        ("package_liability_by_store", "liability"),
        ("gift_certificate_liability_by_store", "outstanding"),
    ):
        rows = _query(
            con,
            f"SELECT snapshot_date, store_name, {value} FROM reports.{report} "
            "WHERE snapshot_date BETWEEN ? AND ?" + _OF_STORE + " ORDER BY 1, 2",
            window,
        )
        points.append(
            [
                {"night": r["snapshot_date"].isoformat(), "store": r["store_name"], value: float(r[value])}
                for r in rows
            ]
        )
    return points[0], points[1]


def _cohort_points(con: duckdb.DuckDBPyConnection, window: list[Any]) -> list[dict[str, Any]]:
    """The retention of each cohort joined in the last COHORTS_SHOWN months up to the night's,
    month by month to the night's: the chain's (or the store's) still members over its cohort size.
    ``window``: [night, night, store, store]."""
    rows = _query(
        con,
        "SELECT cohort_month, months_since_join, sum(still_members) AS still, sum(cohort_size) AS size "
        "FROM reports.cohort_retention "
        f"WHERE cohort_month > date_trunc('month', CAST(? AS DATE)) - INTERVAL {COHORTS_SHOWN} MONTH "
        "AND month <= date_trunc('month', CAST(? AS DATE))" + _OF_STORE + " GROUP BY 1, 2 ORDER BY 1, 2",
        window,
    )
    return [
        {
            "cohort": r["cohort_month"].strftime("%Y-%m"),
            "months": int(r["months_since_join"]),
            "retention": int(r["still"]) / int(r["size"]),
        }
        for r in rows
    ]


# The month charts: (report, its columns plotted, the value's field in the chart's rows)
_MONTH_FIGURES = (
    ("dues_billing_by_store_month", ("expected_dues", "billed_dues"), "dues"),
    ("package_liability_roll_forward_monthly", ("sold", "redeemed", "expired"), "moved"),
)


def _month_points(
    con: duckdb.DuckDBPyConnection, window: list[Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(dues expected and billed, package liability sold, redeemed and expired) of each of the
    last MONTHS_SHOWN months up to the night's, the chain's (or the store's) sums.
    ``window``: [night, night, store, store]."""
    charts = []
    for report, columns, value in _MONTH_FIGURES:
        sums = ", ".join(f"sum({c}) AS {c}" for c in columns)
        rows = _query(
            con,
            f"SELECT month, {sums} FROM reports.{report} "
            f"WHERE month > date_trunc('month', CAST(? AS DATE)) - INTERVAL {MONTHS_SHOWN} MONTH "
            "AND month <= date_trunc('month', CAST(? AS DATE))" + _OF_STORE + " GROUP BY 1 ORDER BY 1",
            window,
        )
        charts.append(
            [
                {
                    "month": r["month"].strftime("%Y-%m"),
                    "figure": c.replace("_", " "),
                    "order": i,
                    value: float(r[c]),
                }
                for r in rows
                for i, c in enumerate(columns)
            ]
        )
    return charts[0], charts[1]


def _revenue_points(con: duckdb.DuckDBPyConnection, window: list[Any]) -> list[dict[str, Any]]:
    """Revenue per store per business day (days, not nights: a sale belongs to the day it was made)."""
    return [
        {
            "day": r["business_date"].isoformat(),
            "store": r["storecode"].rstrip(),
            "amount": float(r["amount"]),
        }
        for r in _query(
            con,
            "SELECT business_date, storecode, sum(amount) AS amount FROM reports.revenue_by_store_day "
            "WHERE business_date BETWEEN ? AND ?" + _OF_STORE + " GROUP BY 1, 2 ORDER BY 1, 2",
            window,
        )
    ]


def read_top_debtors(
    con: duckdb.DuckDBPyConnection, night: dt.date, store: str | None = None
) -> dict[str, list[dict[str, Any]]]:
    rows = _query(
        con,
        "SELECT storecode, client_number, client_name, balance, last_payment_date, active_memberships, "
        "eft_on_file FROM identity.top_debtors WHERE snapshot_date = ?"
        + _OF_STORE
        + " ORDER BY storecode, balance DESC, client_number",
        [night, store, store],
    )
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        shown = out.setdefault(row["storecode"], [])
        if len(shown) < TOP_DEBTORS_SHOWN:
            shown.append(row)
    return out


def quality_lines(data_dir: DataDir, night: dt.date, now: dt.datetime | None = None) -> list[str]:
    """The night's data quality: quarantined rows, the self-audit's findings, freshness."""
    lines = []
    manifest = read_manifest(data_dir.manifests, night)
    if manifest is not None:
        rows = manifest.quarantine.rows
        by_table = ", ".join(f"{t} {n}" for t, n in sorted(manifest.quarantine_by_table.items()) if n)
        lines.append(
            f"Quarantined rows: {rows}" + (f" ({by_table})" if by_table else "") + " (landing/_quarantine/)"
        )
    audit_file = data_dir.state_file.parent / "audits" / f"{night.isoformat()}.json"
    if audit_file.is_file():
        try:
            body = json.loads(audit_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            lines.append(f"Self-audit: {audit_file.name} cannot be read")
        else:
            sampled, differed = _count(body.get("sampled")), _count(body.get("differed"))
            keys = _count(body.get("keys"))
            lines.append(
                f"Self-audit: {sampled} client(s) re-fetched, {differed} differed"
                + (f" ({keys} key(s)), queued for re-sync" if differed else "")
            )
    else:
        lines.append("Self-audit: none this night (a full night, or the audit is off)")
    state = fresh.check(data_dir.manifests, Settings.load().stale_after_hours, now)
    lines.append("Freshness: " + fresh.describe(state))
    return lines


def _count(value: Any) -> int:
    if isinstance(value, bool) or value is None:
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, list | dict):
        return len(value)
    return 0


# --------------------------------------------------------------------------------------------
# The page
# --------------------------------------------------------------------------------------------

CSS = """
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; color: #1d232a;
  background: #f4f6f8; line-height: 1.4; }
header { background: #1f3a5f; color: #fff; padding: 16px 20px; }
header h1 { margin: 0; font-size: 1.35rem; }
header p { margin: 4px 0 0; opacity: .85; font-size: .9rem; }
main { max-width: 1100px; margin: 0 auto; padding: 12px; }
section { background: #fff; border-radius: 8px; padding: 14px 16px; margin: 12px 0;
  box-shadow: 0 1px 2px rgba(0,0,0,.08); }
h2 { font-size: 1.1rem; margin: 0 0 10px; }
h3 { font-size: 1rem; margin: 14px 0 6px; }
.scroll { overflow-x: auto; -webkit-overflow-scrolling: touch; }
table { border-collapse: collapse; width: 100%; font-size: .9rem; }
th, td { padding: 6px 8px; border-bottom: 1px solid #e3e7eb; text-align: right; white-space: nowrap;
  vertical-align: top; }
th:first-child, td:first-child { text-align: left; }
th { font-weight: 600; color: #4a5560; font-size: .8rem; }
tr.total td { font-weight: 700; border-top: 2px solid #1f3a5f; }
.delta { display: block; font-size: .75rem; color: #66717c; }
.up { color: #1a7f37; } .down { color: #b42318; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(100%, 480px), 1fr)); gap: 12px; }
figure { margin: 0; }
figcaption { font-weight: 600; margin-bottom: 6px; }
figure svg { width: 100%; height: auto; display: block; }
.empty { color: #66717c; font-style: italic; }
ul.quality { margin: 0; padding-left: 18px; }
@media (max-width: 600px) {
  main { padding: 6px; }
  section { padding: 10px; margin: 8px 0; }
  table { font-size: .8rem; }
  th, td { padding: 5px 6px; }
}
"""


def _money(value: Any) -> str:
    if value is None:
        return ""
    amount = Decimal(value).quantize(Decimal("0.01"))
    return f"{amount:,}"


def _figure(value: Any, money: bool) -> str:
    if value is None:
        return "–"
    return _money(value) if money else f"{int(value):,}"


def _delta(now: Any, then: Any, money: bool, label: str) -> str:
    if now is None or then is None:
        return f"{label} –"
    change = Decimal(now) - Decimal(then)
    sign = "+" if change > 0 else "−" if change < 0 else "±"
    text = _money(abs(change)) if money else f"{int(abs(change)):,}"
    return f"{label} {sign}{text}"


def _scorecard_html(table: ReportTable, names: dict[str, str]) -> str:
    header = table.header
    out = ['<div class="scroll"><table id="scorecard"><thead><tr><th>Store</th>']
    out += [f"<th>{html.escape(label)}</th>" for _, label, _ in FIGURES]
    out.append("</tr></thead><tbody>")
    for row in table.rows:
        values = dict(zip(header, row, strict=True))
        code = str(values["storecode"])
        total = table.has_total and row is table.rows[-1]
        label = "All stores" if total else f"{names.get(code) or code.rstrip()} ({code.rstrip()})"
        opening = '<tr class="total">' if total else "<tr>"
        out.append(f"{opening}<td>{html.escape(label)}</td>")
        for column, _, money in FIGURES:
            now = values[column]
            week = _delta(now, values[f"{column}_week_ago"], money, "wk")
            month = _delta(now, values[f"{column}_month_ago"], money, "mo")
            out.append(
                f"<td>{html.escape(_figure(now, money))}"
                f'<span class="delta">{html.escape(week)}</span>'
                f'<span class="delta">{html.escape(month)}</span></td>'
            )
        out.append("</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _debtors_html(debtors: dict[str, list[dict[str, Any]]], names: dict[str, str]) -> str:
    if not debtors:
        return '<p class="empty">No client owes anything tonight.</p>'
    out = []
    for code, rows in sorted(debtors.items()):
        title = f"{names.get(code) or code.rstrip()} ({code.rstrip()})"
        out.append(f"<h3>{html.escape(title)}</h3>")
        out.append(
            '<div class="scroll"><table class="debtors"><thead><tr><th>Client</th><th>Balance</th>'
            "<th>Last payment</th><th>Active memberships</th><th>EFT on file</th></tr></thead><tbody>"
        )
        for r in rows:
            who = f"{r['client_name'] or ''} ({r['client_number']})".strip()
            paid = r["last_payment_date"].isoformat() if r["last_payment_date"] else "never"
            out.append(
                f"<tr><td>{html.escape(who)}</td><td>{html.escape(_money(r['balance']))}</td>"
                f"<td>{html.escape(paid)}</td><td>{int(r['active_memberships'])}</td>"
                f"<td>{'yes' if r['eft_on_file'] else 'no'}</td></tr>"
            )
        out.append("</tbody></table></div>")
    return "".join(out)


def _charts_html(charts: Sequence[Chart]) -> str:
    out = ['<div class="charts">']
    for chart in charts:
        body = chart.svg or '<p class="empty">No data over the last 90 nights.</p>'
        out.append(
            f'<figure class="chart" id="chart-{html.escape(chart.key)}">'
            f"<figcaption>{html.escape(chart.title)}</figcaption>{body}</figure>"
        )
    out.append("</div>")
    return "".join(out)


def render_html(data: MorningData) -> str:
    night = data.night.isoformat()
    quality = "".join(f"<li>{html.escape(line)}</li>" for line in data.quality)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; img-src data:\">"
        f"<title>Morning report {night}</title><style>{CSS}</style></head><body>"
        f"<header><h1>Morning report</h1><p>Night of {night} · {len(data.store_names)} store(s)</p></header>"
        "<main>"
        f'<section id="scorecard-section"><h2>Store scorecard</h2>'
        f"{_scorecard_html(data.scorecard, data.store_names)}"
        '<p class="delta">wk: change since the night a week earlier · mo: since the same night a month '
        "earlier (– when the warehouse does not hold it) · revenue before tax, voids excluded</p></section>"
        f'<section id="trends"><h2>Trends, last {TREND_NIGHTS} nights</h2>'
        f"{_charts_html(data.charts)}</section>"
        f'<section id="top-debtors"><h2>Top debtors per store</h2>'
        f"{_debtors_html(data.debtors, data.store_names)}</section>"
        f'<section id="data-quality"><h2>Data quality</h2><ul class="quality">{quality}</ul></section>'
        "</main></body></html>\n"
    )
