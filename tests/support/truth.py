"""Ground truth of the management reports, computed from the sandbox's own in-memory state.

Finance staff act on the reports every morning, so the tests never check our SQL against
itself: every report is recomputed here, in plain Python with ``Decimal``, from the sandbox's
:class:`~membersync.extract.sandbox.state.Service` (what the service *is*, not what we fetched),
and compared with what the warehouse holds and what the CSVs say, to the cent.

    truth = truth_of(sandbox, night)                  # on the sandbox's loop thread (consistent)
    assert_reports_equal(warehouse_reports(data_dir, night), truth)
    assert_csvs_equal(data_dir, night, truth)

Rows are dicts of Python values with the report's column names: ``date``, ``str`` (storecodes
byte-exact, trailing spaces kept), ``int``, ``Decimal`` (money with 2 decimals, ``frozen_rate``
with 4), ``bool`` and ``None``.

Written from the contract (``../shared/spec/contract.md``) and the sandbox's own state, never
from ``sql/``: where the contract is silent, the interpretation is stated here once, and the SQL
must agree with it (not the other way round). A case where the two could share a misreading is
exercised by the sandbox: statuses come in every casing (``--drift``, varying record by record),
and as "On Hold" and "ON_HOLD" (``SPELLED_STATUSES``). Interpretations:

- The store reports have one row per store of the night's store list (inactive stores too);
  a balance, membership or points row at a storecode outside the list counts nowhere.
- Statuses compare case-insensitively against the contract's list (``Active``, ``Frozen``,
  ``OnHold``, ``Canceled``, ``Expired``), and a status written with spaces, underscores or dashes
  around or between its words is the same status (``On Hold``, ``ON_HOLD``: the contract says
  "compare case-insensitively"; we read its enumerations as words, however joined); anything
  else is ``other``. Sale statuses and line types are compared the same way. The sandbox's own
  (canonical) status is the truth; wire drift only changes how it is spelled on the wire.
- ``frozen_rate`` = frozen / (active + frozen), rounded half-up to 4 decimals (the SQL does the
  same with exact integer arithmetic); ``None`` when active + frozen = 0.
- ``eft_draw_forecast``: every store x every draw day of the night's draw-day list, plus any
  day an active EFT membership uses (0 for a membership without one), zeros included.
- ``package_liability_by_store``: the packages each client owns (a shared package counts once, at
  its owner), by the client package's storecode: open on a night when sessions remain and its
  expiration date is on or after the night (none: no expiry); liability = sessions remaining x
  the package list's price / its sessions, half-up to the cent per package, summed per store; a
  package off the night's list counts at no price.
- ``gift_certificate_liability_by_store``: per store of the night's list, ``sold`` = the amounts of
  the G lines of its non-voided sales dated (local) on or before the night, ``redeemed`` = the
  payments whose payment type is of kind GIFT in the store's payment-type list, on its non-voided
  sales, dated (local) on or before the night; ``outstanding`` = sold - redeemed.
- ``package_liability_roll_forward``: each package followed between consecutive nights at its
  liability of each night (0 when not open): owed before and not now with its expiration date
  passed is expired; any other fall is redeemed; any rise is sold; the first night is the
  baseline. Rows: the night's store list and any storecode a package is owed at on either night.
- ``dues_billing_by_store_month``: expected = the monthly dues of the EFT memberships active on a
  night held that is their draw day (the night's day of the month), at the membership's store;
  billed = the type-1 lines of the store's non-voided sales dated (local) in the month, before tax.
- ``cohort_retention``: a client's cohort is the month and store of their first membership (the
  earliest start date, ties by membership id, at its store); a month from the first night held on
  counts as members the clients with a membership active or frozen on the newest night held on or
  before its last day (the newest night for the current month); a month before the first night
  counts those with a membership started by its last day and neither canceled nor ended by then
  (an end or cancel date is the first day out). Revenue: lines of the client's non-voided sales at
  any store dated (local) up to the month's end or the newest night, before tax, G lines left out.
- ``revenue_by_store_day``: non-voided transactions of the whole history, by the transaction's
  storecode and local date; ``transactions`` counts distinct receipts per (store, date, type);
  amount is before tax. Rows up to and including the night (the CSV's rule; the view can hold a
  store's next local day, which the comparison leaves out on both sides).
- ``top_debtors``: the 50 largest positive balances per store, ties broken by client_number;
  ``client_name`` = first and last name joined by a space and trimmed; ``active_memberships``
  and ``eft_on_file`` (a billing account on file) are the client's across all stores;
  ``last_payment_date`` = local date of the client's newest payment on a non-voided transaction
  **at this store**, on or before the night. Payments made with ``postaccountledgerpayment`` are
  not visible through any read endpoint, so they cannot count (the service shows them only as a
  lower balance).
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import io
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from membersync.extract.sandbox import model as m
    from membersync.extract.sandbox.state import Service
    from membersync.warehouse.landing.paths import DataDir

Row = dict[str, Any]
Reports = dict[str, list[Row]]

CENT = Decimal("0.01")
ZERO = Decimal("0.00")
RATE_PLACES = Decimal("0.0001")
TOP_DEBTORS_PER_STORE = 50
STATUS_BUCKETS = ("active", "frozen", "on_hold", "canceled", "expired", "other")
_CONTRACT_STATUSES = {
    "active": "active",
    "frozen": "frozen",
    "onhold": "on_hold",
    "canceled": "canceled",
    "expired": "expired",
}
_LINE_TYPES = ("R", "P", "M", "1", "G")


@dataclass(frozen=True)
class ReportSpec:
    name: str
    key: tuple[str, ...]
    columns: tuple[str, ...]
    per_night: bool = True  # False: the whole history up to the night (revenue)
    sums: tuple[str, ...] = ()  # columns the CSV's TOTAL row sums (store reports)


SPECS: dict[str, ReportSpec] = {
    s.name: s
    for s in (
        ReportSpec(
            "outstanding_balances_by_store",
            ("snapshot_date", "storecode"),
            (
                "snapshot_date",
                "storecode",
                "store_name",
                "clients_owing",
                "amount_owed",
                "clients_in_credit",
                "credit_amount",
                "net_balance",
            ),
            sums=("clients_owing", "amount_owed", "clients_in_credit", "credit_amount", "net_balance"),
        ),
        ReportSpec(
            "frozen_memberships_by_store",
            ("snapshot_date", "storecode"),
            (
                "snapshot_date",
                "storecode",
                "store_name",
                "active",
                "frozen",
                "on_hold",
                "canceled",
                "expired",
                "other",
                "frozen_rate",
            ),
            sums=("active", "frozen", "on_hold", "canceled", "expired", "other"),
        ),
        ReportSpec(
            "points_liability_by_store",
            ("snapshot_date", "storecode"),
            ("snapshot_date", "storecode", "store_name", "clients_with_points", "points_outstanding"),
            sums=("clients_with_points", "points_outstanding"),
        ),
        ReportSpec(
            "package_liability_by_store",
            ("snapshot_date", "storecode"),
            ("snapshot_date", "storecode", "store_name", "open_packages", "sessions_remaining", "liability"),
            sums=("open_packages", "sessions_remaining", "liability"),
        ),
        ReportSpec(
            "gift_certificate_liability_by_store",
            ("snapshot_date", "storecode"),
            ("snapshot_date", "storecode", "store_name", "sold", "redeemed", "outstanding"),
            sums=("sold", "redeemed", "outstanding"),
        ),
        ReportSpec(
            "package_liability_roll_forward",
            ("snapshot_date", "storecode"),
            (
                "snapshot_date",
                "storecode",
                "store_name",
                "opening_liability",
                "sold",
                "redeemed",
                "expired",
                "closing_liability",
            ),
            sums=("opening_liability", "sold", "redeemed", "expired", "closing_liability"),
        ),
        ReportSpec(
            "eft_draw_forecast",
            ("snapshot_date", "storecode", "draw_day"),
            ("snapshot_date", "storecode", "draw_day", "active_eft_memberships", "monthly_dues_total"),
            sums=("active_eft_memberships", "monthly_dues_total"),
        ),
        ReportSpec(
            "revenue_by_store_day",
            ("storecode", "business_date", "type"),
            ("storecode", "business_date", "type", "transactions", "quantity", "amount", "tax"),
            per_night=False,
        ),
        ReportSpec(
            "membership_status_daily",
            ("snapshot_date", "storecode", "status"),
            ("snapshot_date", "storecode", "status", "memberships"),
        ),
        ReportSpec(
            "top_debtors",
            ("snapshot_date", "storecode", "client_number"),
            (
                "snapshot_date",
                "storecode",
                "client_number",
                "client_name",
                "balance",
                "active_memberships",
                "eft_on_file",
                "last_payment_date",
            ),
        ),
    )
}
REPORT_NAMES: tuple[str, ...] = tuple(SPECS)


# --- classification ------------------------------------------------------------------------------


def status_bucket(status: str | None) -> str:
    """A membership status compared case-insensitively with the contract's list; else ``other``."""
    if status is None:
        return "other"
    return _CONTRACT_STATUSES.get(_word(status), "other")


def _word(value: str) -> str:
    """An enumeration's value as one lower-case word: case, spaces, underscores, dashes aside."""
    return "".join(ch for ch in value.lower() if ch not in " _-")


def line_type(raw: str) -> str:
    kind = raw.strip(" ").upper()
    return kind if kind in _LINE_TYPES else "other"


def is_voided(status: str) -> bool:
    return status.strip(" ").lower() == "voided"


def frozen_rate(active: int, frozen: int) -> Decimal | None:
    if active + frozen == 0:
        return None
    return (Decimal(frozen) / Decimal(active + frozen)).quantize(RATE_PLACES, rounding=ROUND_HALF_UP)


def client_name(first: str | None, last: str | None) -> str:
    # DuckDB: trim(concat_ws(' ', first, last)) -- nulls skipped, spaces trimmed
    return " ".join(p for p in (first, last) if p is not None).strip(" ")


# --- the truth -----------------------------------------------------------------------------------


def compute_truth(service: Service, night: dt.date, forgotten: Mapping[str, str] | None = None) -> Reports:
    """Every report of ``night`` from the service's state. Call it on the sandbox's loop thread
    (:func:`truth_of`) so no request changes the state half-way. ``forgotten``: client number ->
    surrogate key of the clients forgotten (the erasure register's): the top-debtors list shows
    them as "forgotten client" with their key in place of the number, after every client still
    known at equal balances."""
    materialize = getattr(service, "materialize_all", None)
    if materialize is not None:  # a lazy sandbox fills clients' holdings on first use
        materialize()
    return {
        "outstanding_balances_by_store": outstanding_balances(service, night),
        "frozen_memberships_by_store": frozen_memberships(service, night),
        "points_liability_by_store": points_liability(service, night),
        "package_liability_by_store": package_liability(service, night),
        "gift_certificate_liability_by_store": gift_certificate_liability(service, night),
        "eft_draw_forecast": eft_draw_forecast(service, night),
        "revenue_by_store_day": revenue_by_store_day(service, night),
        "membership_status_daily": membership_status_daily(service, night),
        "top_debtors": top_debtors(service, night, forgotten or {}),
    }


def truth_of(sandbox: Any, night: dt.date, forgotten: Mapping[str, str] | None = None) -> Reports:
    """:func:`compute_truth` run on a ``RunningSandbox``'s loop thread (a consistent read)."""
    return sandbox.call(lambda service: compute_truth(service, night, forgotten))  # type: ignore[no-any-return]


def outstanding_balances(service: Service, night: dt.date) -> list[Row]:
    rows = []
    for code, store in service.stores.items():
        balances = [c.ledger[code] for c in service.clients.values() if code in c.ledger]
        owing = [b for b in balances if b > 0]
        credit = [b for b in balances if b < 0]
        rows.append(
            {
                "snapshot_date": night,
                "storecode": code,
                "store_name": store.name,
                "clients_owing": len(owing),
                "amount_owed": sum(owing, ZERO),
                "clients_in_credit": len(credit),
                "credit_amount": -sum(credit, ZERO),
                "net_balance": sum(balances, ZERO),
            }
        )
    return rows


def _status_counts(service: Service) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {code: dict.fromkeys(STATUS_BUCKETS, 0) for code in service.stores}
    for ms in service.memberships.values():
        if ms.storecode in counts:  # counted at the membership's own storecode
            counts[ms.storecode][status_bucket(ms.status)] += 1
    return counts


def frozen_memberships(service: Service, night: dt.date) -> list[Row]:
    counts = _status_counts(service)
    rows = []
    for code, store in service.stores.items():
        c = counts[code]
        rows.append(
            {
                "snapshot_date": night,
                "storecode": code,
                "store_name": store.name,
                **c,
                "frozen_rate": frozen_rate(c["active"], c["frozen"]),
            }
        )
    return rows


def membership_status_daily(service: Service, night: dt.date) -> list[Row]:
    counts = _status_counts(service)
    return [
        {"snapshot_date": night, "storecode": code, "status": status, "memberships": counts[code][status]}
        for code in service.stores
        for status in STATUS_BUCKETS
    ]


def open_packages(service: Service, night: dt.date) -> list[m.ClientPackage]:
    """Every client package open on ``night``: sessions remain and it has not expired."""
    return [
        p
        for c in service.clients.values()
        for p in c.packages
        if p.sessions_remaining > 0 and (p.expiration_date is None or p.expiration_date >= night)
    ]


def package_owed(service: Service, package: m.ClientPackage) -> Decimal:
    """An open package's liability at the current list price per session, half-up to the cent."""
    listed = service.package_types.get(package.package_id)
    if listed is None or listed.sessions <= 0:
        return ZERO
    return (package.sessions_remaining * listed.price / listed.sessions).quantize(CENT, ROUND_HALF_UP)


@dataclass(frozen=True)
class PackageOwed:
    storecode: str
    liability: Decimal
    expiration_date: dt.date | None


def packages_owed(service: Service, night: dt.date) -> dict[str, PackageOwed]:
    """client package id -> where and how much it is owed on ``night`` (open packages only)."""
    return {
        p.client_package_id: PackageOwed(p.storecode, package_owed(service, p), p.expiration_date)
        for p in open_packages(service, night)
    }


def package_liability(service: Service, night: dt.date) -> list[Row]:
    rows = []
    packages = open_packages(service, night)
    for code, store in service.stores.items():
        here = [p for p in packages if p.storecode == code]
        rows.append(
            {
                "snapshot_date": night,
                "storecode": code,
                "store_name": store.name,
                "open_packages": len(here),
                "sessions_remaining": sum(p.sessions_remaining for p in here),
                "liability": sum((package_owed(service, p) for p in here), ZERO),
            }
        )
    return rows


def package_roll_forward(
    night: dt.date,
    stores: Mapping[str, str],
    before: Mapping[str, PackageOwed] | None,
    now: Mapping[str, PackageOwed],
) -> list[Row]:
    """How the package liability moved from the night before (``before``: None on the first
    night, the baseline) to ``night``; ``stores``: the night's store list, code -> name. A package
    owed before and not now whose expiration date has passed expired; any other fall is redeemed;
    a rise (a new package) is sold."""
    before = now if before is None else before
    moves: dict[str, dict[str, Decimal]] = defaultdict(lambda: defaultdict(lambda: ZERO))
    for pid in before.keys() | now.keys():
        was, left = before.get(pid), now.get(pid)
        for p, opening, closing in _package_moves(was, left):
            row = moves[p.storecode]
            row["opening_liability"] += opening
            row["closing_liability"] += closing
            if (
                left is None
                and was is not None
                and was.expiration_date is not None
                and was.expiration_date < night
            ):
                row["expired"] += opening
            elif closing > opening:
                row["sold"] += closing - opening
            else:
                row["redeemed"] += opening - closing
    columns = ("opening_liability", "sold", "redeemed", "expired", "closing_liability")
    return [
        {
            "snapshot_date": night,
            "storecode": code,
            "store_name": stores.get(code),
            **{c: moves[code][c] if code in moves else ZERO for c in columns},
        }
        for code in sorted(stores.keys() | moves.keys())
    ]


def package_roll_forward_of(
    service: Service, night: dt.date, before: Mapping[str, PackageOwed] | None
) -> list[Row]:
    """:func:`package_roll_forward` of the service's state on ``night`` (``before``: the
    :func:`packages_owed` of the night before; None on the warehouse's first night)."""
    stores = {code: store.name for code, store in service.stores.items()}
    return package_roll_forward(night, stores, before, packages_owed(service, night))


def monthly_roll_forward(daily: Iterable[Row], opening: str, sums: Sequence[str], closing: str) -> list[Row]:
    """A daily roll-forward's rows by calendar month and store: the opening of the month's first
    night, the sums of its nights, the closing (and store name) of its last night."""
    by_month: dict[tuple[dt.date, str], list[Row]] = defaultdict(list)
    for row in sorted(daily, key=lambda r: r["snapshot_date"]):
        by_month[(row["snapshot_date"].replace(day=1), row["storecode"])].append(row)
    return [
        {
            "month": month,
            "storecode": code,
            "snapshot_date": rows[-1]["snapshot_date"],
            "store_name": rows[-1]["store_name"],
            "first_night": rows[0]["snapshot_date"],
            "nights": len(rows),
            opening: rows[0][opening],
            **{column: sum((r[column] for r in rows), ZERO) for column in sums},
            closing: rows[-1][closing],
        }
        for (month, code), rows in sorted(by_month.items())
    ]


def _package_moves(
    was: PackageOwed | None, left: PackageOwed | None
) -> list[tuple[PackageOwed, Decimal, Decimal]]:
    """(package at its store, opening, closing): a package that changed store leaves one and
    arrives at the other."""
    if was is not None and left is not None and was.storecode != left.storecode:
        return [(was, was.liability, ZERO), (left, ZERO, left.liability)]
    shown = left if left is not None else was
    assert shown is not None
    return [(shown, was.liability if was else ZERO, left.liability if left else ZERO)]


def gift_certificate_liability(service: Service, night: dt.date) -> list[Row]:
    sold: dict[str, Decimal] = defaultdict(lambda: ZERO)
    redeemed: dict[str, Decimal] = defaultdict(lambda: ZERO)
    for t in service.transactions.values():
        if is_voided(t.status):
            continue
        if t.local_datetime.date() <= night:
            sold[t.storecode] += sum((line.amount for line in t.lines if line.type == "G"), ZERO)
        kinds = {p.code: p.kind for p in service.store_payment_types.get(t.storecode, ())}
        for payment in t.payments:
            if kinds.get(payment.payment_type) == "GIFT" and payment.local_datetime.date() <= night:
                redeemed[t.storecode] += payment.amount
    return [
        {
            "snapshot_date": night,
            "storecode": code,
            "store_name": store.name,
            "sold": sold[code],
            "redeemed": redeemed[code],
            "outstanding": sold[code] - redeemed[code],
        }
        for code, store in service.stores.items()
    ]


def dues_due_tonight(service: Service, night: dt.date) -> dict[str, Decimal]:
    """storecode -> monthly dues of the EFT memberships active on ``night`` whose draw day it is."""
    due: dict[str, Decimal] = defaultdict(lambda: ZERO)
    for ms in service.memberships.values():
        if ms.is_eft and status_bucket(ms.status) == "active" and ms.draw_day == night.day:
            due[ms.storecode] += ms.monthly_dues or ZERO
    return dict(due)


def dues_billing(
    service: Service,
    store_months: Mapping[dt.date, Mapping[str, str]],
    expected: Mapping[tuple[dt.date, str], Decimal],
) -> list[Row]:
    """``dues_billing_by_store_month`` from the nights held: ``store_months`` (month -> the stores
    listed on its nights, code -> name on its newest night) and ``expected`` ((month, store) -> the
    sum of :func:`dues_due_tonight` over its nights); billed from the service's sales now."""
    billed: dict[tuple[dt.date, str], Decimal] = defaultdict(lambda: ZERO)
    for t in service.transactions.values():
        if not is_voided(t.status):
            month = t.local_datetime.date().replace(day=1)
            billed[(month, t.storecode)] += sum((line.amount for line in t.lines if line.type == "1"), ZERO)
    rows = []
    for month, stores in store_months.items():
        for code, name in stores.items():
            want, got = expected.get((month, code), ZERO), billed.get((month, code), ZERO)
            rows.append(
                {
                    "month": month,
                    "storecode": code,
                    "store_name": name,
                    "expected_dues": want,
                    "billed_dues": got,
                    "gap": want - got,
                }
            )
    return rows


def members_tonight(service: Service) -> set[str]:
    """The clients holding a membership active or frozen now (a night of ``cohort_retention``)."""
    return {
        ms.client_number
        for ms in service.memberships.values()
        if status_bucket(ms.status) in ("active", "frozen")
    }


def _month_end(month: dt.date) -> dt.date:
    following = (month + dt.timedelta(days=32)).replace(day=1)
    return following - dt.timedelta(days=1)


def _months_between(first: dt.date, last: dt.date) -> list[dt.date]:
    months, month = [], first
    while month <= last:
        months.append(month)
        month = (month + dt.timedelta(days=32)).replace(day=1)
    return months


def _in_effect(ms: m.Membership, day: dt.date) -> bool:
    return (
        ms.start_date <= day
        and (ms.cancel_date is None or ms.cancel_date > day)
        and (ms.end_date is None or ms.end_date > day)
    )


def cohort_retention(service: Service, members_on: Mapping[dt.date, set[str]]) -> list[Row]:
    """``cohort_retention`` from the nights held: ``members_on``, each night -> the
    :func:`members_tonight` of that night; memberships' dates and sales from the service now."""
    newest = max(members_on)
    first: dict[str, m.Membership] = {}
    for ms in sorted(service.memberships.values(), key=lambda ms: (ms.start_date, ms.membership_id)):
        first.setdefault(ms.client_number, ms)
    cohorts: dict[tuple[dt.date, str], list[str]] = defaultdict(list)
    for number, ms in first.items():
        cohorts[(ms.start_date.replace(day=1), ms.storecode)].append(number)
    spent = _spending_by_month(service, newest)
    dated: dict[dt.date, set[str]] = {}  # day -> members by the dates
    rows = []
    for (cohort_month, code), clients in sorted(cohorts.items()):
        revenue = sum((v for (c, mo), v in spent.items() if c in clients and mo < cohort_month), ZERO)
        for k, month in enumerate(_months_between(cohort_month, newest.replace(day=1))):
            as_of = min(_month_end(month), newest)
            still = _still_members(service, clients, as_of, members_on, dated)
            revenue += sum((spent.get((c, month), ZERO) for c in clients), ZERO)
            rows.append(
                {
                    "cohort_month": cohort_month,
                    "storecode": code,
                    "store_name": service.stores[code].name if code in service.stores else None,
                    "months_since_join": k,
                    "month": month,
                    "as_of_date": as_of,
                    "cohort_size": len(clients),
                    "still_members": still,
                    "retention_rate": (Decimal(still) / len(clients)).quantize(RATE_PLACES, ROUND_HALF_UP),
                    "revenue_to_date": revenue,
                    "lifetime_value": (revenue / len(clients)).quantize(CENT, ROUND_HALF_UP),
                }
            )
    return rows


def _spending_by_month(service: Service, newest: dt.date) -> dict[tuple[str, dt.date], Decimal]:
    """(client, month) -> the client's lines of non-voided sales dated up to ``newest``, G aside."""
    spent: dict[tuple[str, dt.date], Decimal] = defaultdict(lambda: ZERO)
    for t in service.transactions.values():
        day = t.local_datetime.date()
        if not is_voided(t.status) and day <= newest:
            spent[(t.client_number, day.replace(day=1))] += sum(
                (line.amount for line in t.lines if line.type != "G"), ZERO
            )
    return spent


def _still_members(
    service: Service,
    clients: list[str],
    as_of: dt.date,
    members_on: Mapping[dt.date, set[str]],
    dated: dict[dt.date, set[str]],
) -> int:
    held = [night for night in members_on if night <= as_of]
    if held:
        members = members_on[max(held)]
        return sum(1 for c in clients if c in members)
    if as_of not in dated:  # every cohort of the month asks: found once
        dated[as_of] = {ms.client_number for ms in service.memberships.values() if _in_effect(ms, as_of)}
    return sum(1 for c in clients if c in dated[as_of])


def points_liability(service: Service, night: dt.date) -> list[Row]:
    rows = []
    for code, store in service.stores.items():
        positive = [c.points[code] for c in service.clients.values() if c.points.get(code, 0) > 0]
        rows.append(
            {
                "snapshot_date": night,
                "storecode": code,
                "store_name": store.name,
                "clients_with_points": len(positive),
                "points_outstanding": sum(positive),
            }
        )
    return rows


def eft_draw_forecast(service: Service, night: dt.date) -> list[Row]:
    active_eft = [
        ms for ms in service.memberships.values() if ms.is_eft and status_bucket(ms.status) == "active"
    ]
    days = set(service.draw_days) | {ms.draw_day or 0 for ms in active_eft}
    count: dict[tuple[str, int], int] = defaultdict(int)
    dues: dict[tuple[str, int], Decimal] = defaultdict(lambda: ZERO)
    for ms in active_eft:
        key = (ms.storecode, ms.draw_day or 0)
        count[key] += 1
        if ms.monthly_dues is not None:
            dues[key] += ms.monthly_dues
    return [
        {
            "snapshot_date": night,
            "storecode": code,
            "draw_day": day,
            "active_eft_memberships": count.get((code, day), 0),
            "monthly_dues_total": dues.get((code, day), ZERO),
        }
        for code in service.stores
        for day in sorted(days)
    ]


def revenue_by_store_day(service: Service, night: dt.date) -> list[Row]:
    receipts: dict[tuple[str, dt.date, str], set[str]] = defaultdict(set)
    quantity: dict[tuple[str, dt.date, str], int] = defaultdict(int)
    amount: dict[tuple[str, dt.date, str], Decimal] = defaultdict(lambda: ZERO)
    tax: dict[tuple[str, dt.date, str], Decimal] = defaultdict(lambda: ZERO)
    for txn in service.transactions.values():
        day = txn.local_datetime.date()
        if is_voided(txn.status) or day > night:
            continue
        for line in txn.lines:
            key = (txn.storecode, day, line_type(line.type))
            receipts[key].add(txn.receipt_number)
            quantity[key] += line.quantity
            amount[key] += line.amount
            tax[key] += line.tax
    return [
        {
            "storecode": key[0],
            "business_date": key[1],
            "type": key[2],
            "transactions": len(receipts[key]),
            "quantity": quantity[key],
            "amount": amount[key],
            "tax": tax[key],
        }
        for key in sorted(receipts, key=lambda k: (k[0].encode(), k[1], k[2]))
    ]


FORGOTTEN_CLIENT = "forgotten client"


def top_debtors(service: Service, night: dt.date, forgotten: Mapping[str, str]) -> list[Row]:
    rows = []
    for code in service.stores:
        owing = [c for c in service.clients.values() if c.ledger.get(code, ZERO) > 0]
        # ties: by client number; a forgotten client has none any more (after the others, by key)
        owing.sort(
            key=lambda c: (
                -c.ledger[code],
                c.client_number in forgotten,
                forgotten.get(c.client_number, c.client_number),
            )
        )
        for client in owing[:TOP_DEBTORS_PER_STORE]:
            payments = [
                p.local_datetime.date()
                for txn in client.transactions
                if txn.storecode == code and not is_voided(txn.status)
                for p in txn.payments
                if p.local_datetime.date() <= night
            ]
            rows.append(
                {
                    "snapshot_date": night,
                    "storecode": code,
                    "client_number": forgotten.get(client.client_number, client.client_number),
                    "client_name": FORGOTTEN_CLIENT
                    if client.client_number in forgotten
                    else client_name(client.first_name, client.last_name),
                    "balance": client.ledger[code],
                    "active_memberships": sum(
                        1 for ms in client.memberships if status_bucket(ms.status) == "active"
                    ),
                    "eft_on_file": bool(client.billing_accounts),
                    "last_payment_date": max(payments, default=None),
                }
            )
    return rows


# --- what we produced ------------------------------------------------------------------------------


def warehouse_reports(data_dir: DataDir, night: dt.date, names: Iterable[str] = REPORT_NAMES) -> Reports:
    """The report rows of ``night`` as the warehouse holds them (opened read-only): the reports
    managers get, so the identified tier's (top debtors with client numbers and names)."""
    import duckdb
    from membersync.warehouse.exports.export import REPORTS

    out: Reports = {}
    with contextlib.closing(duckdb.connect(str(data_dir.identified_db), read_only=True)) as con:
        for name in names:
            where = "snapshot_date = ?" if SPECS[name].per_night else "business_date <= ?"
            cursor = con.execute(f"SELECT * FROM {REPORTS[name].source} WHERE {where}", [night])
            header = [d[0] for d in cursor.description or []]
            out[name] = [dict(zip(header, r, strict=True)) for r in cursor.fetchall()]
    return out


def csv_path(data_dir: DataDir, night: dt.date, name: str) -> Path:
    return data_dir.reports / night.isoformat() / f"{name}_{night.isoformat()}.csv"


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """A report CSV (UTF-8 with BOM, CRLF): header and rows of text, formula guards removed."""
    text = path.read_bytes().decode("utf-8-sig")
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader)
    rows = [dict(zip(header, (_unguard(v) for v in r), strict=True)) for r in reader]
    return header, rows


def _unguard(cell: str) -> str:
    if cell.startswith("'") and cell[1:2] in ("=", "+", "-", "@", "\t", "\r"):
        return cell[1:]
    return cell


# --- comparison ---------------------------------------------------------------------------------------


def cell_text(value: Any) -> str:
    """A value as the CSV writes it : exact decimals, ISO dates and times (a
    space between), true/false, empty for null. A copy of the rule, kept apart from the export on
    purpose (the truth never calls the code it checks); ``test_declared_once`` fails if they drift."""
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


def _money_text(column: str, value: Any) -> str:
    """Truth values as the CSV must show them: money with 2 decimals, the rate with 4."""
    if isinstance(value, Decimal):
        return format(value.quantize(RATE_PLACES if column == "frozen_rate" else CENT), "f")
    return cell_text(value)


def expected_csv_rows(name: str, rows: Sequence[Row], night: dt.date) -> list[dict[str, str]]:
    """The truth as the CSV's text rows, with the TOTAL row of a store report."""
    spec = SPECS[name]
    out = [{c: _money_text(c, r[c]) for c in spec.columns} for r in rows]
    if spec.sums:
        total: dict[str, Any] = {c: None for c in spec.columns}
        total["snapshot_date"] = night
        total["storecode"] = "TOTAL"
        for c in spec.sums:
            values = [r[c] for r in rows]
            total[c] = sum(values, ZERO if any(isinstance(v, Decimal) for v in values) else 0)
        if name == "frozen_memberships_by_store":
            total["frozen_rate"] = frozen_rate(total["active"], total["frozen"])
        out.append({c: _money_text(c, total[c]) for c in spec.columns})
    return out


class ReportMismatch(AssertionError):
    pass


def diff_rows(
    name: str,
    actual: Sequence[Mapping[str, Any]],
    expected: Sequence[Mapping[str, Any]],
    key: Sequence[str],
    same: Callable[[Any, Any], bool] = lambda a, b: bool(a == b),
    limit: int = 25,
) -> list[str]:
    """Readable differences between two row sets matched by ``key`` (empty list = equal)."""
    problems: list[str] = []

    def index(rows: Sequence[Mapping[str, Any]], side: str) -> dict[tuple[Any, ...], Mapping[str, Any]]:
        out: dict[tuple[Any, ...], Mapping[str, Any]] = {}
        for r in rows:
            k = tuple(r.get(c) for c in key)
            if k in out:
                problems.append(f"{name}: duplicate key {_show(k)} in {side}")
            out[k] = r
        return out

    got, want = index(actual, "actual"), index(expected, "truth")
    for k in sorted(set(want) - set(got), key=repr):
        problems.append(f"{name}: missing row {_show(k)}: truth {_show_row(want[k])}")
    for k in sorted(set(got) - set(want), key=repr):
        problems.append(f"{name}: extra row {_show(k)}: got {_show_row(got[k])}")
    for k in sorted(set(got) & set(want), key=repr):
        g, w = got[k], want[k]
        for column in w:
            if column not in g:
                problems.append(f"{name}: column {column!r} missing")
                continue
            if not same(g[column], w[column]):
                problems.append(f"{name} {_show(k)}: {column} = {g[column]!r}, truth {w[column]!r}")
    if len(problems) > limit:
        problems = [*problems[:limit], f"... and {len(problems) - limit} more"]
    return problems


def _show(key: tuple[Any, ...]) -> str:
    return "(" + ", ".join(repr(cell_text(v)) for v in key) + ")"


def _show_row(row: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}={cell_text(v)!r}" for k, v in row.items()) + "}"


def _same_typed(a: Any, b: Any) -> bool:
    """Exact equality; a Decimal equals to the last digit (no float ever counts as equal)."""
    if isinstance(b, Decimal) or isinstance(a, Decimal):
        return isinstance(a, Decimal) and isinstance(b, Decimal) and a == b
    if isinstance(b, bool) or isinstance(a, bool):
        return a is b
    return bool(a == b) and type(a) is type(b)


def report_differences(actual: Reports, truth: Reports) -> list[str]:
    problems = []
    for name, rows in truth.items():
        if name not in actual:
            problems.append(f"{name}: not in the warehouse")
            continue
        problems += diff_rows(name, actual[name], rows, SPECS[name].key, _same_typed)
    return problems


def assert_reports_equal(actual: Reports, truth: Reports) -> None:
    """Every report row equals the truth, to the cent (warehouse rows, typed)."""
    problems = report_differences(actual, truth)
    if problems:
        raise ReportMismatch("reports differ from the sandbox's truth:\n  " + "\n  ".join(problems))


def csv_differences(data_dir: DataDir, night: dt.date, truth: Reports) -> list[str]:
    problems = []
    for name, rows in truth.items():
        path = csv_path(data_dir, night, name)
        if not path.is_file():
            problems.append(f"{name}: no CSV at {path}")
            continue
        header, got = read_csv(path)
        spec = SPECS[name]
        if tuple(header) != spec.columns:
            problems.append(f"{name}: CSV header {header}, expected {list(spec.columns)}")
            continue
        problems += diff_rows(name + ".csv", got, expected_csv_rows(name, rows, night), spec.key)
    return problems


def assert_csvs_equal(data_dir: DataDir, night: dt.date, truth: Reports) -> None:
    """Every CSV of the night equals the truth, cell for cell (TOTAL rows included)."""
    problems = csv_differences(data_dir, night, truth)
    if problems:
        raise ReportMismatch("CSVs differ from the sandbox's truth:\n  " + "\n  ".join(problems))


def read_csvs(
    data_dir: DataDir, night: dt.date, names: Iterable[str] = REPORT_NAMES
) -> dict[str, list[dict[str, str]]]:
    """The night's report CSVs as text rows (a missing file reads as no rows)."""
    out = {}
    for name in names:
        path = csv_path(data_dir, night, name)
        out[name] = read_csv(path)[1] if path.is_file() else []
    return out


def case_differences(
    name: str,
    actual: Sequence[Row],
    csv_rows: Sequence[Mapping[str, str]],
    truth_rows: Sequence[Row],
    night: dt.date,
    where: Callable[[Row], bool],
) -> list[str]:
    """Differences on the rows of one report that an edge case touches (``where`` on typed rows):
    the warehouse's rows (typed, exact) and the CSV's rows (text) against the truth's. A CSV row
    is compared when its key is that of a selected warehouse or truth row."""
    key = SPECS[name].key
    want = [r for r in truth_rows if where(r)]
    got = [r for r in actual if where(r)]
    problems = diff_rows(name, got, want, key, _same_typed)
    texts = {tuple(cell_text(r[c]) for c in key) for r in [*got, *want]}

    def selected(rows: Iterable[Mapping[str, str]]) -> list[Mapping[str, str]]:
        return [r for r in rows if tuple(r[c] for c in key) in texts]

    expected = expected_csv_rows(name, want, night)
    problems += diff_rows(name + ".csv", selected(csv_rows), selected(expected), key)
    return problems


def assert_night_exact(
    sandbox: Any, data_dir: DataDir, night: dt.date, forgotten: Mapping[str, str] | None = None
) -> Reports:
    """The warehouse and the CSVs of ``night`` both equal the sandbox's truth; returns the truth."""
    truth = truth_of(sandbox, night, forgotten)
    problems = report_differences(warehouse_reports(data_dir, night), truth)
    problems += csv_differences(data_dir, night, truth)
    if problems:
        raise ReportMismatch("night differs from the sandbox's truth:\n  " + "\n  ".join(problems))
    return truth
