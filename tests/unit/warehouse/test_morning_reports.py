"""The morning reports (issue 14) against a plain-Python truth after a month of simulated nights.

One warehouse for the module: 37 nights built at once (a full build), then the 38th built
incrementally (the nightly reports continue from the published state), so every night of the
nightly-stored reports and the views over the whole history is compared. The truth is computed
from the rows landed (``tests/support/morning_scenario.py``), never with SQL.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import io
from collections.abc import Iterator
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import duckdb
import morning_scenario as ms
import pytest
from membersync.warehouse.build.builder import build_warehouse
from membersync.warehouse.exports.export import export_reports, report_path
from membersync.warehouse.landing.paths import DataDir

NIGHT_KEYED = ("balance_aging_by_store", "membership_roll_forward", "mrr_by_store", "store_scorecard")
SUMMED = {
    "balance_aging_by_store": "amount_owed",
    "membership_roll_forward": "closing_active",
    "mrr_by_store": "mrr",
    "store_scorecard": "mrr_month_ago",
}
MONTH_KEYED = ("membership_roll_forward_monthly", "churn_by_store_month")
TRUTH_OF = {
    "balance_aging_by_store": ms.Truth.aging,
    "membership_roll_forward": ms.Truth.roll_forward,
    "mrr_by_store": ms.Truth.mrr,
    "store_scorecard": ms.Truth.scorecard,
}


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> tuple[DataDir, ms.Truth]:
    data_dir = DataDir(tmp_path_factory.mktemp("morning") / "data")
    scenario = ms.simulate()
    ms.land(data_dir, scenario, ms.NIGHTS[:-1])
    assert build_warehouse(data_dir).full_refresh
    ms.land(data_dir, scenario, ms.NIGHTS[-1:])
    assert not build_warehouse(data_dir).full_refresh  # the last night continues the published state
    return data_dir, ms.Truth(scenario)


@contextlib.contextmanager
def connect(data_dir: DataDir) -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect(str(data_dir.warehouse_db), read_only=True)
    try:
        yield con
    finally:
        con.close()


def rows_of(data_dir: DataDir, report: str) -> dict[tuple[Any, str], dict[str, Any]]:
    first = "month" if report in MONTH_KEYED else "snapshot_date"
    with connect(data_dir) as con:
        cursor = con.execute(f"SELECT * FROM reports.{report}")
        header = [d[0] for d in cursor.description or []]
        out = {}
        for values in cursor.fetchall():
            row = dict(zip(header, values, strict=True))
            key = (row.pop(first), row.pop("storecode"))
            assert key not in out, f"{report}: key {key} twice"
            out[key] = row
    return out


def differences(report: str, got: dict[Any, dict[str, Any]], truth: dict[Any, dict[str, Any]]) -> list[str]:
    out = [f"{report}: missing row {k}" for k in sorted(set(truth) - set(got))]
    out += [f"{report}: extra row {k}" for k in sorted(set(got) - set(truth))]
    for key in sorted(set(got) & set(truth)):
        for column, expected in truth[key].items():
            value = got[key][column]
            same = value == expected and type(value) is type(expected)
            if not same:
                out.append(f"{report} {key} {column}: got {value!r}, truth {expected!r}")
        extra = set(got[key]) - set(truth[key])
        if extra:
            out.append(f"{report} {key}: columns without truth {sorted(extra)}")
    return out


def test_case_balance_aging_buckets_each_debt_by_the_nights_since_it_was_last_settled(warehouse) -> None:
    """Case: debts aged from our nightly history, 0-29/30-59/60-89/90+, the first-nights lower bound."""
    data_dir, truth = warehouse
    expected = truth.aging()
    assert differences("balance_aging_by_store", rows_of(data_dir, "balance_aging_by_store"), expected) == []
    # the scenario reaches every bucket (a test that passes on zeros only would prove nothing)
    for column in ("owed_0_29", "owed_30_59", "owed_60_89", "owed_90_plus"):
        assert any(row[column] > 0 for row in expected.values()), column
    # amount_owed ties out with outstanding_balances_by_store
    with connect(data_dir) as con:
        mismatched = con.execute(
            "SELECT count(*) FROM reports.balance_aging_by_store a "
            "JOIN reports.outstanding_balances_by_store o "
            "USING (snapshot_date, storecode) WHERE a.amount_owed <> o.amount_owed"
        ).fetchone()
    assert mismatched == (0,)


def test_case_membership_roll_forward_follows_each_membership_from_night_to_night(warehouse) -> None:
    """Case: new, reactivated, frozen (and on hold), canceled, expired (and gone, moved), per store."""
    data_dir, truth = warehouse
    expected = truth.roll_forward()
    assert (
        differences("membership_roll_forward", rows_of(data_dir, "membership_roll_forward"), expected) == []
    )
    for column in ("new", "reactivated", "frozen", "canceled", "expired"):
        assert sum(row[column] for row in expected.values()) > 0, column
    # the storecode never listed and the store listed late have rows (with no name) before listing
    assert expected[(ms.NIGHTS[7], ms.GHOST)]["store_name"] is None
    assert expected[(ms.NIGHTS[14], ms.LATE)]["store_name"] is None


def test_case_membership_roll_forward_monthly_sums_the_nights_of_each_month(warehouse) -> None:
    """Case: months (sparse and daily), opening = the night before the month's first night."""
    data_dir, truth = warehouse
    expected = truth.roll_forward_monthly()
    got = rows_of(data_dir, "membership_roll_forward_monthly")
    assert differences("membership_roll_forward_monthly", got, expected) == []
    assert {m for m, _ in expected} >= {dt.date(2026, 2, 1), dt.date(2026, 3, 1)}


def test_case_member_cohorts_over_thirteen_months_of_nights(warehouse) -> None:
    """Case: cohorts joined before the first night and during the history, statuses read from the
    newest night on or before each month's end (a month without a night: the one before), a
    membership moved to another store, late voids out of the revenue to date."""
    data_dir, truth = warehouse
    expected = truth.cohorts()
    with connect(data_dir) as con:
        cursor = con.execute(
            "SELECT cohort_month, storecode, months_since_join, cohort_size, still_members, revenue_to_date, "
            "retention_rate, lifetime_value FROM reports.cohort_retention"
        )
        got = {}
        for cohort, store, k, size, still, revenue, rate, value in cursor.fetchall():
            got[(cohort, store, k)] = {
                "cohort_size": size,
                "still_members": still,
                "revenue_to_date": revenue,
            }
            assert rate == (Decimal(still) / size).quantize(Decimal("0.0001"), ROUND_HALF_UP)
            assert value == (revenue / size).quantize(Decimal("0.01"), ROUND_HALF_UP)
    assert got == expected
    gap_months = {dt.date(2025, 4, 1), dt.date(2026, 1, 1)}  # no night in them
    before = [v for (c, _, k), v in expected.items() if c < dt.date(2025, 3, 1)]
    assert len(before) > 100 and any(v["still_members"] < v["cohort_size"] for v in before)
    assert {_add_months(c, k) for c, _, k in expected} >= gap_months
    assert any(v["revenue_to_date"] > 0 for v in expected.values())


def _add_months(month: dt.date, k: int) -> dt.date:
    total = month.year * 12 + month.month - 1 + k
    return dt.date(total // 12, total % 12 + 1, 1)


def test_case_mrr_by_store_moves_with_upgrades_downgrades_pauses_and_churn(warehouse) -> None:
    """Case: MRR of active EFT memberships and its bridge from the previous night, exact Decimal."""
    data_dir, truth = warehouse
    expected = truth.mrr()
    assert differences("mrr_by_store", rows_of(data_dir, "mrr_by_store"), expected) == []
    for column in ("new", "reactivated", "expansion", "contraction", "churned", "paused"):
        assert sum(row[column] for row in expected.values()) > 0, column


def test_case_churn_by_store_month_and_its_rolling_12_months(warehouse) -> None:
    """Case: cancellations over the average active, per month and over the last 12 months held."""
    data_dir, truth = warehouse
    expected = truth.churn()
    assert differences("churn_by_store_month", rows_of(data_dir, "churn_by_store_month"), expected) == []
    assert any(row["churn_rate"] for row in expected.values())
    assert max(row["months_12m"] for row in expected.values()) >= 5


def test_case_store_scorecard_compares_the_night_with_a_week_and_a_month_earlier(warehouse) -> None:
    """Case: each store's figures tonight, 7 nights before and a month before (empty when not held)."""
    data_dir, truth = warehouse
    expected = truth.scorecard()
    assert differences("store_scorecard", rows_of(data_dir, "store_scorecard"), expected) == []
    last = expected[(ms.NIGHTS[-1], ms.DOWNTOWN)]
    assert last["week_ago_date"] == dt.date(2026, 2, 28) and last["month_ago_date"] == dt.date(2026, 2, 7)
    assert expected[(dt.date(2026, 2, 3), ms.DOWNTOWN)]["week_ago_date"] is None


MEMBERS_IN, MEMBERS_OUT = ("new", "reactivated"), ("frozen", "canceled", "expired")
MRR_IN, MRR_OUT = ("new", "reactivated", "expansion"), ("contraction", "churned", "paused")


@pytest.mark.parametrize(
    ("report", "opening", "plus", "minus", "closing"),
    [
        ("membership_roll_forward", "opening_active", MEMBERS_IN, MEMBERS_OUT, "closing_active"),
        ("membership_roll_forward_monthly", "opening_active", MEMBERS_IN, MEMBERS_OUT, "closing_active"),
        ("mrr_by_store", "previous_mrr", MRR_IN, MRR_OUT, "mrr"),
    ],
)
def test_case_the_roll_forward_identity_holds_on_every_row(
    warehouse, report, opening, plus, minus, closing
) -> None:
    """Case: closing = opening + inflows - outflows on every row; each night opens at the last closing."""
    data_dir, _ = warehouse
    rows = rows_of(data_dir, report)
    assert len(rows) > 100 if report != "membership_roll_forward_monthly" else len(rows) > 10
    broken = [
        key
        for key, r in rows.items()
        if r[closing] != r[opening] + sum(r[c] for c in plus) - sum(r[c] for c in minus)
    ]
    assert broken == []
    if report == "membership_roll_forward":
        for (night, store), r in rows.items():
            i = ms.NIGHTS.index(night)
            if i:
                before = rows.get((ms.NIGHTS[i - 1], store))
                assert r[opening] == (before[closing] if before else 0), (night, store)


def read_csv(path: Path) -> list[list[str]]:
    raw = path.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf")
    return list(csv.reader(io.StringIO(raw.decode("utf-8-sig"))))


def test_case_each_new_report_has_its_csv_with_bom_snapshot_date_and_total(warehouse) -> None:
    """Case: the night's CSVs of the new reports: BOM, snapshot date, TOTAL = the exact sums."""
    data_dir, truth = warehouse
    night = ms.NIGHTS[-1]
    export_reports(data_dir, night, [*NIGHT_KEYED, *MONTH_KEYED])
    for report in NIGHT_KEYED:
        rows = read_csv(report_path(data_dir, report, night))
        header, body, total = rows[0], rows[1:-1], rows[-1]
        assert header[:2] == ["snapshot_date", "storecode"] and total[1] == "TOTAL"
        assert {r[0] for r in [*body, total]} == {night.isoformat()}
        # TOTAL is the sum of the truth's rows (the scenario's own arithmetic, not the CSV's body)
        column, expected = SUMMED[report], TRUTH_OF[report](truth)
        total_of_truth = sum(v[column] or 0 for (n, _), v in expected.items() if n == night)
        assert Decimal(total[header.index(column)]) == total_of_truth, report
    scorecard = read_csv(report_path(data_dir, "store_scorecard", night))
    h = scorecard[0]
    assert scorecard[-1][h.index("amount_owed")] == str(
        sum(v["amount_owed"] for (n, _), v in truth.scorecard().items() if n == night)
    )
    for report in MONTH_KEYED:
        rows = read_csv(report_path(data_dir, report, night))
        assert rows[0][:3] == ["month", "storecode", "snapshot_date"]
        assert rows[-1][1] != "TOTAL"
        assert {r[0] for r in rows[1:]} == {
            "2025-03-01",
            "2025-05-01",
            "2025-10-01",
            "2025-11-01",
            "2025-12-01",
            "2026-02-01",
            "2026-03-01",
        }
