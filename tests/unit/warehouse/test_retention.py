"""Issue 51: retention by business date (``MEMBERSYNC_RETENTION``, ``membersync retention``).

Real parts: the landing zone, the dbt + DuckDB warehouse, ``membersync`` processes. The nights a
rule keeps are computed here independently (plain date arithmetic, month ends picked by hand);
"exact on what is kept" is shown two ways: every report file of a kept night is byte-identical
before and after the run, and a full rebuild from the thinned landing zone gives the same
snapshot reports (balances, statuses, points, debtors) for every kept night.
"""

from __future__ import annotations

import calendar
import datetime as dt
import filecmp
import os
import subprocess
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from membersync.extract.settings import RetentionPolicy, Span, parse_retention
from membersync.flows.benchmarks.synthetic import generate, write_night
from membersync.warehouse.build.builder import build_warehouse
from membersync.warehouse.exports.export import export_reports
from membersync.warehouse.landing.manifest import read_manifests
from membersync.warehouse.landing.paths import DataDir
from membersync.warehouse.lifecycle.retention import plan_nights
from repo_root import MEMBERSYNC, REPO

FIRST = dt.date(2025, 1, 1)
NIGHTS = 430  # 2025-01-01 .. 2026-03-06
# What a night says of itself alone (a full rebuild from the thinned landing zone finds it again);
# the reports over history (aging, roll-forward, MRR, churn, the scorecard's comparisons) are
# kept as built: a full rebuild counts them between the nights it still holds (docs/personal-data.md).
SNAPSHOT_REPORTS = (
    "outstanding_balances_by_store",
    "frozen_memberships_by_store",
    "points_liability_by_store",
    "package_liability_by_store",
    "eft_draw_forecast",
    "membership_status_daily",
    "top_debtors",
)


# Reports listing every month up to the night: after retention, the months still held.
MONTH_LISTS = (
    "churn_by_store_month",
    "membership_roll_forward_monthly",
    "dues_billing_by_store_month",
    "package_liability_roll_forward_monthly",
)
ROLLING = ("months_12m", "canceled_12m", "churn_rate_12m")  # over the months held of the last 12


def month_rows(path: Path, first_month: dt.date | None = None) -> list[dict[str, str]]:
    """A monthly report's rows (CSV text), from ``first_month`` on; a rolling 12-month figure
    only where its 12 months all lie in the history kept (else it counted removed months)."""
    import csv

    rows = list(csv.DictReader(path.read_bytes().decode("utf-8-sig").splitlines()))
    if first_month is None:
        first_month = min(dt.date.fromisoformat(r["month"]) for r in rows)
    out = []
    for row in rows:
        month = dt.date.fromisoformat(row["month"])
        if month < first_month:
            continue
        window_start = dt.date(month.year - (month.month < 12), (month.month % 12) + 1, 1)
        if window_start < first_month:
            row = {k: v for k, v in row.items() if k not in ROLLING}
        out.append(row)
    return out


def kept_by_hand(nights: list[dt.date], daily_days: int, monthly_years: int) -> list[dt.date]:
    """The rule, written out: older than ``monthly_years`` years: gone; older than ``daily_days``
    days: only the newest night of its calendar month; else kept."""
    newest = max(nights)
    daily_from = newest - dt.timedelta(days=daily_days)
    last_day = calendar.monthrange(newest.year - monthly_years, newest.month)[1]
    monthly_from = dt.date(newest.year - monthly_years, newest.month, min(newest.day, last_day))
    month_end = {}
    for night in nights:
        month_end[(night.year, night.month)] = max(night, month_end.get((night.year, night.month), night))
    return [n for n in nights if n >= monthly_from and (n >= daily_from or month_end[(n.year, n.month)] == n)]


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        ("daily=400d,monthly=7y,identity=3y", RetentionPolicy(Span(400, "d"), Span(7, "y"), Span(3, "y"))),
        (" Monthly = 18m ", RetentionPolicy(monthly=Span(18, "m"))),
        ("identity=8w", RetentionPolicy(identity=Span(8, "w"))),
    ],
)
def test_the_setting_reads_each_horizon(text: str, policy: RetentionPolicy) -> None:
    assert parse_retention(text) == policy


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("daily=400", "expected a length"),
        ("weekly=4w", "at most once each"),
        ("daily=1y,monthly=30d", "at least as long as daily"),
        ("daily=0d", "expected a length"),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(text: str, says: str) -> None:
    from membersync.extract.settings import Settings, SettingsError

    with pytest.raises(SettingsError, match=says) as caught:
        Settings.load({"MEMBERSYNC_RETENTION": text})
    assert "MEMBERSYNC_RETENTION" in str(caught.value) and "\n" not in str(caught.value)


def test_case_the_nights_kept_over_430_nights_are_the_rules_by_business_date() -> None:
    nights = [FIRST + dt.timedelta(days=i) for i in range(NIGHTS) if i % 29 != 17]  # some nights missing
    plan = plan_nights(nights, parse_retention("daily=120d,monthly=1y"))
    assert plan.kept == kept_by_hand(nights, 120, 1)
    assert sorted(plan.kept + plan.removed) == nights
    # a month whose last calendar day was not synced keeps its newest night
    assert dt.date(2025, 6, 29) in plan.kept or dt.date(2025, 6, 30) in plan.kept


def test_case_the_nights_on_the_horizons_themselves_are_kept() -> None:
    """Case: "older than a year" and "older than 120 days" are strict: the night exactly on each
    horizon is kept (the monthly one as its month's newest night), the one before it is not."""
    newest = dt.date(2026, 3, 31)
    nights = [
        dt.date(2024, 12, 1) + dt.timedelta(days=i) for i in range((newest - dt.date(2024, 12, 1)).days + 1)
    ]
    plan = plan_nights(nights, parse_retention("daily=120d,monthly=1y"))
    assert plan.kept == kept_by_hand(nights, 120, 1)
    assert dt.date(2025, 3, 31) in plan.kept and dt.date(2025, 2, 28) not in plan.kept  # monthly horizon
    daily_horizon = newest - dt.timedelta(days=120)
    assert daily_horizon in plan.kept and daily_horizon - dt.timedelta(days=2) not in plan.kept


# --- a 430-night history ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DataDir, dict[dt.date, Path]]]:
    """430 nights of 120 clients through the real landing zone, built, and the report files of a
    few nights exported before any retention (copied aside)."""
    data_dir = DataDir(tmp_path_factory.mktemp("retention") / "data")
    generate(data_dir, clients=120, nights=NIGHTS, rate=0.05, first_night=FIRST)
    build_warehouse(data_dir)
    nights = [m.snapshot_date for m in read_manifests(data_dir.manifests)]
    kept = kept_by_hand(nights, 120, 1)
    sample = [kept[0], kept[len(kept) // 3], *kept[-125:-118], kept[-1]]
    before = {}
    for night in sample:
        folder = data_dir.root / "before" / night.isoformat()
        folder.mkdir(parents=True)
        for path in export_reports(data_dir, night):
            (folder / path.name).write_bytes(path.read_bytes())
        before[night] = folder
    yield data_dir, before


def cli(data_dir: DataDir, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MEMBERSYNC_")}
    environ.update(MEMBERSYNC_DATA_DIR=str(data_dir.root), COLUMNS="200", NO_COLOR="1", **env)
    return subprocess.run(
        [*MEMBERSYNC, *argv],
        env=environ,
        cwd=REPO,
        capture_output=True,
        text=True,
    )


def cohort_rows(path: Path, first_month: dt.date) -> list[dict[str, str]]:
    """The cohort report's rows (CSV text); of a month before ``first_month`` (whose nights
    retention removed: its members are read from the membership dates now), all but who was
    still a member."""
    import csv

    rows = list(csv.DictReader(path.read_bytes().decode("utf-8-sig").splitlines()))
    assert rows
    return [
        r
        if dt.date.fromisoformat(r["month"]) >= first_month
        else {k: v for k, v in r.items() if k not in ("still_members", "retention_rate")}
        for r in rows
    ]


@pytest.mark.slow
def test_case_retention_on_430_nights_keeps_exactly_the_rules_nights_and_their_reports(
    history: tuple[DataDir, dict[dt.date, Path]],
) -> None:
    """Case: daily=120d,monthly=1y over 430 nights: the dry run lists exactly what the run removes;
    the nights left are the rule's; every kept night's reports are byte-identical; a full rebuild
    from the thinned landing gives the same snapshot reports."""
    data_dir, before = history
    nights = [m.snapshot_date for m in read_manifests(data_dir.manifests)]
    expected_kept = kept_by_hand(nights, 120, 1)
    dry = cli(data_dir, "retention", "--dry-run", MEMBERSYNC_RETENTION="daily=120d,monthly=1y")
    assert dry.returncode == 0, dry.stderr
    listed = [line.strip() for line in dry.stdout.splitlines() if line.startswith("  ")]
    assert [
        m.snapshot_date for m in read_manifests(data_dir.manifests)
    ] == nights  # the dry run changed nothing

    run = cli(data_dir, "retention", MEMBERSYNC_RETENTION="daily=120d,monthly=1y")
    assert run.returncode == 0, run.stderr
    left = [m.snapshot_date for m in read_manifests(data_dir.manifests)]
    assert left == expected_kept
    assert listed == [n.isoformat() for n in nights if n not in set(left)]  # exactly what went
    assert not any((data_dir.reports / n).exists() for n in listed)

    first_month = left[0].replace(day=1)
    for night, folder in before.items():
        for old in sorted(folder.iterdir()):
            new = data_dir.reports / night.isoformat() / old.name
            new.unlink(missing_ok=True)
        export_reports(data_dir, night)
        for old in sorted(folder.iterdir()):
            new = data_dir.reports / night.isoformat() / old.name
            if old.name.startswith(MONTH_LISTS):  # every month up to the night: the months kept
                assert month_rows(new) == month_rows(old, first_month), f"{night} {old.name} changed"
            elif old.name.startswith("cohort_retention"):  # months removed: read from the dates
                assert cohort_rows(new, first_month) == cohort_rows(old, first_month), night
            elif old.suffix == ".csv":
                assert filecmp.cmp(old, new, shallow=False), f"{night} {old.name} changed"

    build_warehouse(data_dir, full_refresh=True)  # from the thinned landing zone alone
    for night, folder in before.items():
        export_reports(data_dir, night, list(SNAPSHOT_REPORTS))
        for name in SNAPSHOT_REPORTS:
            old = folder / f"{name}_{night.isoformat()}.csv"
            new = data_dir.reports / night.isoformat() / old.name
            assert filecmp.cmp(old, new, shallow=False), f"full rebuild: {night} {name} changed"

    again = cli(data_dir, "retention", "--dry-run", MEMBERSYNC_RETENTION="daily=120d,monthly=1y")
    assert "would remove 0 night(s)" in again.stdout, again.stdout


def test_case_an_inactive_clients_identity_is_forgotten_after_the_identity_horizon(tmp_path: Path) -> None:
    """Case: identity=2y. A client with a canceled membership, no balance, no points and a last sale
    three years back is forgotten; one with an active membership, one still owing money, and one
    whose only activity is recent are kept. Their money stays, under their keys."""
    data_dir = DataDir(tmp_path / "data")
    old, recent = dt.datetime(2023, 1, 10, 12), dt.datetime(2025, 11, 1, 12)
    rows = {"stores": [{"storecode": "DOWNTOWN  ", "name": "Downtown"}], "synced_clients": [], "clients": []}
    cases = {
        "000001": ("Canceled", Decimal("0.00"), old),  # inactive: forgotten
        "000002": ("Active", Decimal("0.00"), old),  # a running membership
        "000003": ("Canceled", Decimal("12.50"), old),  # still owes
        "000004": ("Canceled", Decimal("0.00"), recent),  # bought lately
    }
    for number, (status, balance, sold) in cases.items():
        rows["synced_clients"].append({"client_number": number})
        rows["clients"].append(
            {"client_number": number, "first_name": f"Name{number}", "created_date": dt.date(2022, 5, 1)}
        )
        rows.setdefault("memberships", []).append(
            {
                "client_number": number,
                "membership_id": f"M{number}",
                "status": status,
                "storecode": "DOWNTOWN  ",
                "start_date": dt.date(2022, 5, 1),
                "cancel_date": dt.date(2022, 12, 1) if status == "Canceled" else None,
            }
        )
        rows.setdefault("ledger_balances", []).append(
            {"client_number": number, "storecode": "DOWNTOWN  ", "balance": balance}
        )
        rows.setdefault("transactions", []).append(
            {
                "client_number": number,
                "receipt_number": f"R{number}",
                "transaction_date": sold,
                "storecode": "DOWNTOWN  ",
                "status": "Saved",
            }
        )
    write_night(data_dir, dt.date(2026, 3, 1), rows)
    build_warehouse(data_dir)
    run = cli(
        data_dir,
        "retention",
        MEMBERSYNC_RETENTION="identity=2y",
        MEMBERSYNC_ERASURE_KEY_FILE=str(tmp_path / "erasure.key"),
    )
    assert run.returncode == 0, run.stderr
    assert "forgot 1 inactive client(s)" in run.stdout, run.stdout
    known = cli(
        data_dir, "sql", "--identified", "--csv", "SELECT client_number FROM identity.clients ORDER BY 1"
    )
    assert known.stdout.split() == ["client_number", "000002", "000003", "000004"]
    receipts = cli(data_dir, "sql", "--csv", "SELECT count(*) AS n FROM marts.transactions")
    assert receipts.stdout.split() == ["n", "4"]  # the forgotten client's sale stays, under their key
