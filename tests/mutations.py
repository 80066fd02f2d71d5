"""The mutation check: does the suite catch what its tests claim? (Slow; not part of CI.)

Each mutation below is one small, plausible bug in the product (a boundary moved, a status
filter changed, a file not removed, a field no longer declared secret). For each, a scratch copy
of the repository gets that one change, and only the tests that should catch it run against
the copy (its ``membersync`` package put first on ``PYTHONPATH``, so every subprocess a test
starts runs the mutated code too). A mutation is **caught** when those tests fail, **survived**
when they pass; the table says which and names the test that caught it::

    .venv/bin/python tests/mutations.py                 # every mutation
    .venv/bin/python tests/mutations.py aging_boundary  # only these (by name)
    .venv/bin/python tests/mutations.py --list

Exit 0 when every mutation was caught. A mutation whose text is not found in its file fails
the run at once (the code moved: update the mutation, never drop it silently).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("extract", "models", "flows", "warehouse", "sql")
TRUTH = (
    "tests/scenarios/test_reports_truth.py::"
    "test_every_report_equals_the_truth_after_a_full_night_and_two_incremental_ones"
)
BUILT = "tests/unit/warehouse/test_warehouse_build.py"
ATTACKS = "tests/scenarios/test_privacy_attacks.py"
MORNING = "tests/unit/warehouse/test_morning_reports.py"
HTML = "tests/unit/warehouse/test_morning_html.py"
COHORTS = (
    "tests/scenarios/test_reports_truth.py::"
    "test_case_member_cohorts_from_the_membership_dates_and_the_nights_held"
)


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # relative to the repository
    old: str  # found exactly once
    new: str
    tests: tuple[str, ...]  # pytest node ids or files that should catch it
    why: str


MUTATIONS: tuple[Mutation, ...] = (
    # --- the report SQL ---------------------------------------------------------------------------
    Mutation(
        "aging_boundary",
        "sql/reports/balance_aging_by_store.sql",
        "(where age_days < 30)",
        "(where age_days <= 30)",
        (MORNING + "::test_case_balance_aging_buckets_each_debt_by_the_nights_since_it_was_last_settled",),
        "a debt of 30 days counted as 0-29",
    ),
    Mutation(
        "aging_90_plus",
        "sql/reports/balance_aging_by_store.sql",
        "age_days >= 60 and age_days < 90",
        "age_days >= 60 and age_days < 91",
        (MORNING + "::test_case_balance_aging_buckets_each_debt_by_the_nights_since_it_was_last_settled",),
        "a debt of 90 days counted in 60-89 too",
    ),
    Mutation(
        "forecast_status",
        "sql/reports/eft_draw_forecast.sql",
        "where is_eft and status = 'active'",
        "where is_eft and status in ('active', 'frozen')",
        (TRUTH,),
        "frozen memberships forecast to draw",
    ),
    Mutation(
        "credit_sign",
        "sql/reports/outstanding_balances_by_store.sql",
        "-sum(balance) filter (where balance < 0) as credit_amount",
        "sum(balance) filter (where balance < 0) as credit_amount",
        (TRUTH,),
        "credit shown negative",
    ),
    Mutation(
        "owing_boundary",
        "sql/reports/outstanding_balances_by_store.sql",
        "count(*) filter (where balance > 0) as clients_owing",
        "count(*) filter (where balance >= 0) as clients_owing",
        (TRUTH,),
        "a zero balance counted as owing",
    ),
    Mutation(
        "top_debtors_void",
        "sql/reports/top_debtors.sql",
        "where not transactions.is_voided and transaction_payments.date is not null",
        "where transaction_payments.date is not null",
        (TRUTH,),
        "a voided sale's payment as the last payment",
    ),
    Mutation(
        "top_debtors_future_payment",
        "sql/reports/top_debtors.sql",
        "and payments.payment_date <= top_debtors.snapshot_date",
        "and payments.payment_date <= top_debtors.snapshot_date + 1",
        ("tests/scenarios/test_reports_truth.py::test_case_payment_on_a_sale_older_than_any_window",),
        "a payment of the day after the night counted",
    ),
    Mutation(
        "mrr_paused",
        "sql/reports/mrr_by_store.sql",
        "sum(previous_dues) filter (where was_in and status in ('frozen', 'on_hold')) as paused",
        "sum(previous_dues) filter (where was_in and status in ('frozen')) as paused",
        (MORNING + "::test_case_mrr_by_store_moves_with_upgrades_downgrades_pauses_and_churn",),
        "an on-hold membership's dues not counted as paused",
    ),
    Mutation(
        "frozen_count",
        "sql/reports/frozen_memberships_by_store.sql",
        "count(*) filter (where status = 'frozen') as frozen",
        "count(*) filter (where status in ('frozen', 'on_hold')) as frozen",
        (TRUTH,),
        "on-hold memberships counted as frozen",
    ),
    Mutation(
        "points_liability",
        "sql/reports/points_liability_by_store.sql",
        "sum(points) filter (where points > 0) as points_outstanding",
        "sum(points) as points_outstanding",
        (TRUTH,),
        "negative points balances offset the liability",
    ),
    Mutation(
        "package_expiry_ignored",
        "sql/marts/client_packages_daily.sql",
        "coalesce(packages.expiration_date >= snapshots.as_of_date, true)",
        "coalesce(packages.expiration_date >= packages.purchase_date, true)",
        ("tests/scenarios/test_reports_truth.py::test_case_a_package_expires_as_a_date_passes",),
        "an expired package still counted as owed",
    ),
    Mutation(
        "package_shared_twice",
        "sql/marts/client_packages_daily.sql",
        "packages.shared_from_client_key is null",
        "true",
        (TRUTH,),
        "a shared package counted once per client it is shared with",
    ),
    Mutation(
        "package_liability_truncated",
        "sql/marts/client_packages_daily.sql",
        "+ price_list.sessions)",
        ")",
        (TRUTH,),
        "a package's liability truncated (2 x 83.33... = 166.66), not rounded half-up",
    ),
    Mutation(
        "package_expired_also_redeemed",
        "sql/reports/package_liability_roll_forward.sql",
        "sum(greatest(opening - closing, 0)) filter (where not has_expired) as redeemed",
        "sum(greatest(opening - closing, 0)) as redeemed",
        ("tests/scenarios/test_reports_truth.py::test_case_a_package_expires_as_a_date_passes",),
        "an expired package's liability counted as redeemed too",
    ),
    Mutation(
        "roll_forward_no_baseline",
        "sql/macros/night_pairs.sql",
        "coalesce(ordered.previous_night, ordered.snapshot_date) as previous_night",
        "coalesce(ordered.previous_night, ordered.snapshot_date - 1) as previous_night",
        (TRUTH,),
        "the first night's packages all counted as sold (every roll-forward's baseline)",
    ),
    Mutation(
        "chart_gift_certificates_sold",
        "warehouse/exports/morning.py",
        '("gift_certificate_liability_by_store", "outstanding")',
        '("gift_certificate_liability_by_store", "sold")',
        (
            "tests/scenarios/test_reports_truth.py::test_case_the_morning_report_plots_what_is_owed_to_clients",
        ),
        "the gift-certificate chart plots what was sold, not what is outstanding",
    ),
    Mutation(
        "gift_payment_type_case_sensitive",
        "sql/reports/gift_certificate_liability_by_store.sql",
        "and gift_payment_types.code = upper(trim(payments.payment_type))",
        "and gift_payment_types.code = payments.payment_type",
        ("tests/scenarios/test_reliability.py::test_wire_drift_reports_stay_exact",),
        "a payment's type spelled in another case not taken for a gift certificate",
    ),
    Mutation(
        "dues_every_night_after_the_draw",
        "sql/reports/dues_expected_mtd.sql",
        "draw_day = extract(day from as_of_date)",
        "draw_day <= extract(day from as_of_date)",
        (
            "tests/scenarios/test_reports_truth.py::test_case_dues_due_on_the_nights_held_beside_the_dues_billed",
        ),
        "a membership's dues expected on every night after its draw day, not once",
    ),
    Mutation(
        "month_to_date_not_carried",
        "sql/macros/month_to_date.sql",
        "{% if carrying %} + coalesce(carried.{{ column }}, 0){% endif %}",
        "",
        (
            MORNING + "::test_case_membership_roll_forward_monthly_sums_the_nights_of_each_month",
            "tests/scenarios/test_reports_truth.py::"
            "test_case_the_monthly_package_roll_forward_sums_the_nights_of_its_month",
        ),
        "an incremental build starts a month's sums again from its first night built",
    ),
    Mutation(
        "workbook_machine_headings",
        "warehouse/exports/workbook.py",
        "for col, heading in enumerate(table.headings):\n        sheet.write_string(HEADER_ROW",
        "for col, heading in enumerate(table.header):\n        sheet.write_string(HEADER_ROW",
        ("tests/unit/warehouse/test_warehouse_xlsx.py",),
        "the workbook's header shows the CSV's column names, not the headings managers read",
    ),
    Mutation(
        "cohort_on_hold_member",
        "sql/reports/cohort_retention.sql",
        "where memberships.status in ('active', 'frozen')",
        "where memberships.status in ('active', 'frozen', 'on_hold')",
        (COHORTS,),
        "a membership on hold counted as still a member",
    ),
    Mutation(
        "cohort_end_date_inclusive",
        "sql/reports/cohort_retention.sql",
        "and coalesce(newest_versions.end_date > months.as_of_date, true)",
        "and coalesce(newest_versions.end_date >= months.as_of_date, true)",
        (COHORTS,),
        "a membership ending on the month's last day counted as running that day",
    ),
    Mutation(
        "cohort_gap_month_dated",
        "sql/reports/cohort_retention.sql",
        "(select max(snapshot_date) from nights where snapshot_date <= spine.as_of_date) as night_held",
        "(select max(snapshot_date) from nights where date_trunc('month', snapshot_date) = spine.month)"
        " as night_held",
        (MORNING + "::test_case_member_cohorts_over_thirteen_months_of_nights",),
        "a month of our history without a night read from the membership dates, not the night before",
    ),
    Mutation(
        "cohort_gift_revenue",
        "sql/reports/cohort_retention.sql",
        "and lines.type <> 'G'",
        "",
        (COHORTS,),
        "gift certificates sold counted as a cohort's revenue",
    ),
    Mutation(
        "cohort_first_membership",
        "sql/reports/cohort_retention.sql",
        "order by start_date, membership_id) = 1",
        "order by start_date desc, membership_id) = 1",
        (COHORTS,),
        "a client's newest membership taken as their first",
    ),
    Mutation(
        "gift_void_counted",
        "sql/reports/gift_certificate_liability_by_store.sql",
        "where type = 'G' and not is_voided",
        "where type = 'G'",
        ("tests/scenarios/test_reports_truth.py::test_case_a_late_void_of_a_gift_certificate_sale",),
        "a voided gift-certificate sale still counted as sold",
    ),
    Mutation(
        "gift_redeemed_by_kind",
        "sql/reports/gift_certificate_liability_by_store.sql",
        "where upper(trim(kind)) = 'GIFT'",
        "where upper(trim(kind)) = 'CARD'",
        (TRUTH,),
        "card payments taken for redeemed certificates",
    ),
    Mutation(
        "churn_window",
        "sql/reports/churn_by_store_month.sql",
        "and window_months.month > monthly.month - interval 12 month",
        "and window_months.month > monthly.month - interval 11 month",
        (MORNING + "::test_case_churn_by_store_month_and_its_rolling_12_months",),
        "a rolling 11 months",
    ),
    Mutation(
        "staging_status_strict",
        "sql/staging/stg_memberships.sql",
        "case replace(replace(replace(lower(trim(status)), ' ', ''), '_', ''), '-', '')",
        "case lower(status)",
        (TRUTH,),
        "'On Hold' and 'ON_HOLD' counted as other, not OnHold",
    ),
    Mutation(
        "staging_void_case",
        "sql/staging/stg_transactions.sql",
        "coalesce(lower(trim(status)) = 'voided', false) as is_voided",
        "coalesce(status = 'Voided', false) as is_voided",
        (BUILT + "::test_voided_transaction_is_not_revenue", TRUTH),
        "a void in another casing counted as revenue",
    ),
    # --- the landing --------------------------------------------------------------------------------
    Mutation(
        "landing_keeps_replaced",
        "warehouse/landing/night.py",
        "                        _remove(entry)  # the replaced files of an earlier run of this night",
        "                        pass  # the replaced files of an earlier run of this night",
        ("tests/unit/warehouse/test_landing.py::test_rerun_of_a_night_replaces_it_without_duplicates",),
        "a rerun night's replaced files left beside the new ones",
    ),
    Mutation(
        "landing_incomplete_commit",
        "warehouse/landing/night.py",
        "    if got != expected:",
        "    if got < 0:",
        ("tests/scenarios/test_resume.py",),
        "a commit missing clients goes through",
    ),
    # --- the self-audit -----------------------------------------------------------------------------
    Mutation(
        "audit_drops_billing",
        "flows/night/audit.py",
        '    "billing_accounts",\n)',
        ")",
        (
            "tests/scenarios/test_audit.py::test_every_compared_table_has_a_kind_of_silent_change_and_every_kind_a_compared_table",
        ),
        "billing accounts no longer audited",
    ),
    Mutation(
        "audit_drops_clients",
        "flows/night/audit.py",
        'AUDITED_TABLES: tuple[str, ...] = (\n    "clients",\n',
        "AUDITED_TABLES: tuple[str, ...] = (\n",
        ("tests/scenarios/test_audit.py",),
        "client records no longer audited",
    ),
    Mutation(
        "audit_volatile",
        "flows/night/audit.py",
        'VOLATILE_COLUMNS: dict[str, frozenset[str]] = {"ledger_balances": frozenset({"as_of"})}',
        "VOLATILE_COLUMNS: dict[str, frozenset[str]] = {}",
        (
            "tests/scenarios/test_audit.py::test_no_silent_change_means_no_difference_even_with_drift_and_store_local_times",
        ),
        "every client flagged by the ledger's as-of date",
    ),
    # --- the client's retry -------------------------------------------------------------------------
    Mutation(
        "slow_start_from_construction",
        "extract/limits.py",
        "self.level, self._slow_start, self._first_request = max(K.INITIAL_RATE, start or 0.0), True, True",
        "self.level, self._slow_start, self._cut_at = max(K.INITIAL_RATE, start or 0.0), True, clock()",
        (
            "tests/unit/extract/test_limits.py::"
            "test_case_the_slow_start_doubles_every_window_from_the_first_request_not_the_start_up",
        ),
        "the slow start's clock runs from the limiter's creation: after the start-up, the first pace is huge",
    ),
    Mutation(
        "unrefused_rate_not_handed_on",
        "flows/night/nightly.py",
        "remember_rate(self.data_dir, self.client.rate.found, self.client.rate.unrefused)",
        "remember_rate(self.data_dir, self.client.rate.found)",
        (
            "tests/scenarios/test_politeness.py::"
            "test_a_night_that_met_no_429_hands_what_the_server_took_to_the_next_night_s_slow_start",
        ),
        "a night that met no 429 keeps nothing: every night slow-starts from the floor again",
    ),
    Mutation(
        "retry_no_503",
        "extract/constants.py",
        "RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})",
        "RETRY_STATUSES = frozenset({429, 500, 502, 504})",
        ("tests/unit/extract/test_retry.py",),
        "a 503 is final",
    ),
    Mutation(
        "retry_one_fewer",
        "extract/constants.py",
        "MAX_RETRIES = 5  #",
        "MAX_RETRIES = 4  #",
        ("tests/unit/extract/test_retry.py",),
        "one attempt fewer than documented",
    ),
    Mutation(
        "retry_after_cap",
        "extract/constants.py",
        "RETRY_AFTER_MAX = 120.0",
        "RETRY_AFTER_MAX = 1e9",
        ("tests/unit/extract/test_retry.py",),
        "a server's huge Retry-After obeyed whole",
    ),
    Mutation(
        "limiter_no_margin",
        "extract/limits.py",
        "        self._set(self.level * (1.0 - K.RATE_MARGIN))",
        "        self._set(self.level)",
        ("tests/unit/extract/test_limits.py",),
        "the cut lands on the limit, not under it",
    ),
    Mutation(
        "limiter_no_shared_pause",
        "extract/limits.py",
        "        self._pause(now, self._shared_pause(retry_after))\n",
        "",
        ("tests/unit/extract/test_limits.py", "tests/unit/extract/test_client.py"),
        "a 429 pauses only the refused request",
    ),
    # --- privacy: forget, retention, secrets -----------------------------------------------------------
    Mutation(
        "forget_keeps_old_files",
        "warehouse/lifecycle/forget.py",
        "    sweep_personal_files(zone.data_dir)  # ... so the old ones go",
        "    pass  # ... so the old ones go",
        (
            "tests/unit/warehouse/test_forget.py::test_case_forget_leaves_no_byte_of_the_canaries_anywhere_and_reports_stay_exact",
        ),
        "the pre-erasure identity files stay on disk",
    ),
    Mutation(
        "forget_no_reexport",
        "warehouse/lifecycle/forget.py",
        '    reports, removed = reexport(_built(zone.data_dir, erasure), erasure.plan.get("reports", []))',
        "    reports: list[str] = []\n    removed: list[str] = []",
        (
            "tests/unit/warehouse/test_forget.py::test_case_forget_leaves_no_byte_of_the_canaries_anywhere_and_reports_stay_exact",
        ),
        "the night's reports still name the forgotten client",
    ),
    Mutation(
        "retention_month_ends",
        "warehouse/lifecycle/retention.py",
        "or (daily_from is not None and n < daily_from and n not in month_ends)",
        "or (daily_from is not None and n < daily_from)",
        (
            "tests/unit/warehouse/test_retention.py::test_case_the_nights_kept_over_430_nights_are_the_rules_by_business_date",
        ),
        "month-end nights removed with the daily ones",
    ),
    Mutation(
        "retention_off_by_one",
        "warehouse/lifecycle/retention.py",
        "if (monthly_from is not None and n < monthly_from)",
        "if (monthly_from is not None and n <= monthly_from)",
        (
            "tests/unit/warehouse/test_retention.py::test_case_the_nights_kept_over_430_nights_are_the_rules_by_business_date",
            "tests/unit/warehouse/test_retention.py::test_case_the_nights_on_the_horizons_themselves_are_kept",
        ),
        "the horizon's own night removed",
    ),
    Mutation(
        "secret_not_redacted",
        "extract/redact.py",
        'SECRET_FIELD_NAMES: tuple[str, ...] = (*sorted(catalogue.SECRET_FIELDS), "authorization")',
        "SECRET_FIELD_NAMES: tuple[str, ...] = "
        '(*sorted(catalogue.SECRET_FIELDS - {"vaultToken"}), "authorization")',
        (
            "tests/unit/warehouse/test_landing.py::test_secrets_never_reach_any_written_file",
            "tests/unit/extract/test_redact.py",
        ),
        "a vault token written to a log",
    ),
    # --- the morning report's charts ------------------------------------------------------------
    Mutation(
        "chart_active_is_frozen",
        "warehouse/exports/morning.py",
        '"members": int(r["active"])',
        '"members": int(r["frozen"])',
        (HTML + "::test_case_every_chart_plots_the_report_rows",),
        '"Active members" plotting the frozen count',
    ),
    Mutation(
        "chart_mrr_of_the_night_before",
        "warehouse/exports/morning.py",
        '"SELECT snapshot_date, store_name, mrr FROM reports.mrr_by_store "',
        '"SELECT snapshot_date, store_name, previous_mrr AS mrr FROM reports.mrr_by_store "',
        (HTML + "::test_case_every_chart_plots_the_report_rows",),
        "the MRR chart plotting the night before's MRR",
    ),
    Mutation(
        "chart_debt_area_on_one_night",
        "warehouse/exports/morning_charts.py",
        "(_base(rows).mark_bar() if one_night else _base(rows).mark_area())",
        "_base(rows).mark_area()",
        (HTML + "::test_case_the_first_night_s_debt_chart_draws_the_money_owed",),
        "the first night's chart of money owed drawn as an area of no width: empty",
    ),
    # --- privacy that fails closed (issue 59) -----------------------------------------------------
    Mutation(
        "tiers_unchecked",
        "warehouse/build/verdict.py",
        "    _check_tiers(run)\n",
        "",
        (ATTACKS + "::test_case_12_the_build_refuses_a_model_declared_in_the_wrong_tier",),
        "a model declared in the wrong tier built and published",
    ),
    Mutation(
        "reader_file_access_on",
        "warehouse/build/catalog.py",
        '        "SET enable_external_access = false",\n',
        "",
        (
            ATTACKS + "::test_case_1_the_analyst_prompt_refuses_every_way_out_of_its_tier",
            ATTACKS + "::test_case_1_an_ordinary_analyst_query_still_works",
        ),
        "the analyst prompt reads any file",
    ),
    Mutation(
        "key_made_again",
        "warehouse/landing/identity.py",
        "    key = read_key(path, create=create and not started)",
        "    key = read_key(path, create=create)",
        (ATTACKS + "::test_case_2_a_lost_or_other_key_is_refused_once_the_register_has_an_erasure",),
        "a lost erasure key silently made again",
    ),
    Mutation(
        "free_text_unmasked",
        "models/privacy.py",
        "        elif mask is not None and column.name in masked:",
        "        elif False:",
        (ATTACKS + "::test_case_4_identity_nested_elsewhere_or_in_free_text_never_reaches_analysts",),
        "a client's name in a points reason lands in the analyst tier",
    ),
)


def scratch_copy(into: Path) -> tuple[Path, Path]:
    """The repository's files (as in the working tree) under ``into/src``; ``into/root`` holds
    a ``membersync`` package whose parts point at the copy (put first on PYTHONPATH)."""
    src, root = into / "src", into / "root"
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in listed.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    (root / "membersync").mkdir(parents=True)
    for package in PACKAGES:
        (root / "membersync" / package).symlink_to(src / package)
    return src, root


def check_mutations(selected: list[Mutation]) -> None:
    for m in selected:
        count = (ROOT / m.path).read_text(encoding="utf-8").count(m.old)
        if count != 1:
            sys.exit(f"mutation {m.name}: its text is found {count} times in {m.path}, not once: update it")


def run_one(m: Mutation, src: Path, root: Path) -> tuple[str, str, float]:
    """Apply ``m`` to the copy, run its tests, restore. (verdict, the failing test, seconds)."""
    target = src / m.path
    original = target.read_text(encoding="utf-8")
    target.write_text(original.replace(m.old, m.new, 1), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(root)}
    started = time.monotonic()
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-x",
                "-q",
                "-p",
                "no:randomly",
                "-p",
                "no:cacheprovider",
                *m.tests,
            ],
            cwd=src,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    finally:
        target.write_text(original, encoding="utf-8")
    seconds = time.monotonic() - started
    failed = re.findall(r"^FAILED (\S+)", done.stdout, re.MULTILINE) or re.findall(
        r"^ERROR (\S+)", done.stdout, re.MULTILINE
    )
    if done.returncode == 0:
        return "survived", "", seconds
    if done.returncode != 1 or not failed:  # usage error, collection error, interrupted
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        return "error", " / ".join(tail), seconds
    return "caught", failed[0], seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tests/mutations.py", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="only these mutations")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    args = parser.parse_args(argv)
    by_name = {m.name: m for m in MUTATIONS}
    unknown = [n for n in args.names if n not in by_name]
    if unknown:
        parser.error(f"unknown mutation(s): {', '.join(unknown)}")
    selected = [by_name[n] for n in args.names] if args.names else list(MUTATIONS)
    if args.list:
        for m in selected:
            sys.stdout.write(f"{m.name:28} {m.path:45} {m.why}\n")
        return 0
    check_mutations(selected)
    results = []
    with tempfile.TemporaryDirectory(prefix="membersync-mutations-") as tmp:
        src, root = scratch_copy(Path(tmp))
        for m in selected:
            verdict, test, seconds = run_one(m, src, root)
            sys.stderr.write(f"{m.name}: {verdict} ({seconds:.0f} s) {test}\n")
            results.append((m, verdict, test))
    sys.stdout.write("| mutation | file | the bug | verdict | caught by |\n|---|---|---|---|---|\n")
    for m, verdict, test in results:
        sys.stdout.write(f"| `{m.name}` | `{m.path}` | {m.why} | {verdict} | `{test}` |\n")
    caught = sum(v == "caught" for _, v, _ in results)
    sys.stdout.write(f"\n{caught} of {len(results)} mutations caught\n")
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
