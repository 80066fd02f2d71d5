"""Issues 4 and 9: the seven reports equal the sandbox's own truth, to the cent, after a full night
and after incremental nights, on every report edge case the sandbox generates.

One sandbox (200 clients, the default 5 stores: enough for more than 50 debtors at a store) serves
three nights (the module fixture ``nights``):

1. a full night;
2. an incremental night after writes through HTTP with a plain client (freezes, an unfreeze, a
   cancel, an activation, an upgrade, sales of every type, payments, a ledger payment, points, a new
   client with a membership, a billing account and a sale), and the late corrections a vendor makes
   without an endpoint (straight on the sandbox's state, bumping ``lastModified`` as the contract's
   change tracking says): a void of a sale older than any window, a back-dated points adjustment,
   a store closed (inactive in the store list from this night on); plus a payment on an old sale of
   a client with no other activity (HTTP);
3. an incremental night after a ledger payment that brings one more debtor into the tie at the 50th
   place, and a void of an old sale at the store that closed mid-history.

Each edge case is a test of its own (``test_case_*``): the case is present in the sandbox's state
on every night, and the report rows it touches, in the warehouse and in the CSVs, equal the truth
(``tests/support/truth.py``: plain Python and Decimal over the sandbox's state).

Issue 9's must-show (``test_incremental_night_after_a_void_and_a_payment_on_old_sales``) runs on a
sandbox of its own where nothing else happens, once with the default (whole histories) and once
with ``MEMBERSYNC_WHOLE_HISTORY=off``, where the window must miss both corrections: the same
assertions cannot pass by coincidence.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import duckdb
import httpx
import pytest
import truth
from membersync.extract.sandbox import model as m
from membersync.extract.sandbox.running import RunningSandbox, start_in_thread
from membersync.extract.sandbox.server import SandboxConfig
from membersync.extract.sandbox.state import Service
from nights import TONIGHT as ANCHOR
from reliability import Workspace

NIGHTS = (
    ANCHOR - dt.timedelta(days=1),
    ANCHOR,
    ANCHOR + dt.timedelta(days=1),
)  # tomorrow: the latest allowed
OLD = dt.timedelta(days=30)  # a sale older than this before the first night is older than any window
TOP = truth.TOP_DEBTORS_PER_STORE
CONTRACT_STATUSES = {"active", "frozen", "onhold", "canceled", "expired"}
SNAPSHOT_REPORTS = (
    "outstanding_balances_by_store",
    "frozen_memberships_by_store",
    "points_liability_by_store",
    "package_liability_by_store",
    "eft_draw_forecast",
    "membership_status_daily",
)
STORE_REPORTS = (*SNAPSHOT_REPORTS, "top_debtors")
Reports = truth.Reports
LABELS = {"snapshot_date", "storecode", "store_name", "draw_day", "status"}  # columns that are no count


# --- the sandbox's state, read independently of the generator ----------------------------------------


def ranked_debtors(service: Service, code: str) -> list[tuple[str, Decimal]]:
    """(client, balance) of every client owing at ``code``, largest first, ties by client number."""
    owing = [(c.client_number, c.ledger[code]) for c in service.clients.values() if c.ledger.get(code, 0) > 0]
    return sorted(owing, key=lambda x: (-x[1], x[0]))


def busiest_store(service: Service) -> str:
    return max(service.stores, key=lambda code: len(ranked_debtors(service, code)))


def is_dst_change_day(zone: ZoneInfo, day: dt.date) -> bool:
    start = dt.datetime.combine(day, dt.time(), zone).utcoffset()
    end = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), zone).utcoffset()
    return start != end


def dst_sales(service: Service) -> list[m.Transaction]:
    """Sales on a day the store's clocks change, at night (00:00-03:59) or late (after 22:00)."""
    return [
        t
        for t in service.transactions.values()
        if t.storecode in service.stores
        and is_dst_change_day(service.zone(t.storecode), t.local_datetime.date())
        and (t.local_datetime.hour < 4 or t.local_datetime.hour >= 22)
    ]


def late_paid_sales(service: Service, days: int = 60) -> list[m.Transaction]:
    """Sales with a payment made more than ``days`` after the sale."""
    return [
        t
        for t in service.transactions.values()
        if any((p.local_datetime.date() - t.local_datetime.date()).days > days for p in t.payments)
    ]


def store_activity(service: Service, code: str) -> int:
    """Everything that references a store: home clients, balances, memberships, sales, points."""
    return (
        sum(c.home_store == code for c in service.clients.values())
        + sum(code in c.ledger for c in service.clients.values())
        + sum(code in c.points for c in service.clients.values())
        + sum(ms.storecode == code for ms in service.memberships.values())
        + sum(t.storecode == code for t in service.transactions.values())
    )


def edge_clients(service: Service) -> set[str]:
    """Clients an edge case depends on: the writes of the ordinary scenario leave them alone."""
    first = busiest_store(service)
    numbers = {number for number, _ in ranked_debtors(service, first)[: TOP + 10]}
    numbers |= {
        c.client_number for c in service.clients.values() if any(k not in service.stores for k in c.ledger)
    }
    numbers |= {
        ms.client_number
        for ms in service.memberships.values()
        if ms.storecode not in service.stores or ms.status.lower() not in CONTRACT_STATUSES
    }
    numbers |= {t.client_number for t in [*dst_sales(service), *late_paid_sales(service)]}
    return numbers


def newest_payment(client: m.Client, code: str, night: dt.date) -> tuple[dt.date | None, list[str]]:
    """The client's newest payment date at ``code`` on non-voided sales, and the receipts carrying it."""
    dates = {
        t.receipt_number: max(p.local_datetime.date() for p in t.payments)
        for t in client.transactions
        if t.storecode == code and not truth.is_voided(t.status) and t.payments
    }
    dates = {r: d for r, d in dates.items() if d <= night}
    newest = max(dates.values(), default=None)
    return newest, [r for r, d in dates.items() if d == newest]


# --- writes: HTTP with a plain client, and the vendor's own corrections -----------------------------


class Writer:
    """Writes through the sandbox's HTTP interface with a plain httpx client (not ours)."""

    def __init__(self, sandbox: RunningSandbox) -> None:
        self.http = httpx.Client(base_url=sandbox.url + "/svcapi/", auth=("sandbox", "sandbox"), timeout=30)
        self.sandbox = sandbox
        self.done: list[str] = []
        self.clients: set[str] = set()  # every client a write changed

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self.http.post(path, json=body)
        assert response.status_code == 200, f"{path} {body} -> {response.status_code} {response.text}"
        self.done.append(path)
        answer: dict[str, Any] = response.json()
        receipt = body.get("receiptNumber")
        owner = self.sandbox.call(lambda s: s.transactions[receipt].client_number) if receipt else None
        changed = body.get("clientNumber") or answer.get("clientNumber") or owner
        assert isinstance(changed, str), (path, body)
        self.clients.add(changed)
        return answer

    def employee(self, storecode: str) -> str:
        return self.sandbox.call(lambda s: next(e.emp_no for e in s.store_employees[storecode] if e.active))

    def product(self, storecode: str) -> tuple[str, Decimal]:
        first = self.sandbox.call(lambda s: s.store_products[storecode][0])
        return first.product_number, first.price

    def pay_type(self, storecode: str) -> str:
        return self.sandbox.call(lambda s: s.store_payment_types[storecode][0].code)

    def store_of(self, receipt: str) -> str:
        return self.sandbox.call(lambda s: s.transactions[receipt].storecode)

    def pay(self, receipt: str, amount: str) -> None:
        self.post(
            "clients/insertpayment",
            {
                "receiptNumber": receipt,
                "paymentType": self.pay_type(self.store_of(receipt)),
                "amount": amount,
            },
        )


def void_at_till(service: Service, receipt: str) -> None:
    """A void made at the till (the interface has no void endpoint): the sale's status changes and
    so does its client's ``lastModified``. The contract says nothing of a void's effect on the
    ledger; the balance stays, so the case isolates the history correction."""
    txn = service.transactions[receipt]
    txn.status = "Voided"
    service.touch(service.clients[txn.client_number])


def back_dated_points(service: Service, number: str, code: str, day: dt.date, points: int) -> str:
    """A points adjustment entered today in the back office, dated ``day`` (no endpoint does that)."""
    client = service.client(number)
    adjustment = m.PointsTransaction(
        service.next_id("points", "PT{:07d}"),
        number,
        dt.datetime.combine(day, dt.time(9, 15)),
        code,
        points,
        "Adjustment",
        None,
    )
    client.points_transactions.append(adjustment)
    client.points[code] = client.points.get(code, 0) + points
    service.touch(client)
    return adjustment.points_transaction_id


def redeem_at_till(service: Service, number: str, client_package_id: str) -> None:
    """A session used at the front desk (the interface has no endpoint for it): one session fewer,
    and the client's ``lastModified`` moves."""
    client = service.client(number)
    package = next(p for p in client.packages if p.client_package_id == client_package_id)
    package.sessions_remaining -= 1
    service.touch(client)


def quiet_open_package(service: Service, night: dt.date, exclude: set[str]) -> tuple[str, str, str]:
    """(client, client package, store) of a package of its own, open on ``night`` with sessions
    to spare, bought at a listed store by a client no other case or write touches."""
    return next(
        (c.client_number, p.client_package_id, p.storecode)
        for c in service.iter_clients()
        if c.client_number not in exclude
        for p in c.packages
        if p.membership_id is None
        and p.storecode in service.stores
        and p.sessions_remaining >= 2
        and (p.expiration_date is None or p.expiration_date > night)
    )


@dataclass(frozen=True)
class OldSale:
    receipt: str
    client: str
    storecode: str
    sold: dt.date


def old_gift_certificate_sale(service: Service, night: dt.date, exclude: set[str]) -> OldSale:
    """A saved sale with a gift-certificate line, older than any window, of a client left alone."""
    return next(
        OldSale(t.receipt_number, t.client_number, t.storecode, t.local_datetime.date())
        for _, t in sorted(service.transactions.items())
        if t.client_number not in exclude
        and t.storecode in service.stores
        and not truth.is_voided(t.status)
        and t.local_datetime.date() < night - OLD
        and any(line.type == "G" for line in t.lines)
    )


def old_sale_carrying_the_last_payment(
    service: Service, night: dt.date, rows: list[truth.Row], exclude: set[str]
) -> OldSale:
    """A top debtor's old sale that alone carries its newest payment at the store (a void of it
    moves ``last_payment_date``)."""
    for row in sorted(rows, key=lambda r: (r["storecode"], r["client_number"])):
        number, code = row["client_number"], row["storecode"]
        if number in exclude or row["last_payment_date"] is None or row["last_payment_date"] >= night - OLD:
            continue
        _, receipts = newest_payment(service.client(number), code, night)
        if len(receipts) == 1:
            sold = service.transactions[receipts[0]].local_datetime.date()
            if sold < night - OLD:
                return OldSale(receipts[0], number, code, sold)
    raise AssertionError("no top debtor's newest payment is on an old sale")


def old_unpaid_sale_of_a_debtor(
    service: Service, night: dt.date, rows: list[truth.Row], exclude: set[str]
) -> OldSale:
    """A saved sale older than any window of a top debtor (ranked well inside the top 50, owing
    more than 5.00), whose newest payment at the store is older than the sale we will pay."""
    by_store: dict[str, list[truth.Row]] = {}
    for row in rows:
        by_store.setdefault(row["storecode"], []).append(row)
    for code in sorted(by_store):
        for row in by_store[code][: TOP - 10]:
            number = row["client_number"]
            if number in exclude or row["balance"] <= Decimal("5.00"):
                continue
            for txn in sorted(service.client(number).transactions, key=lambda t: t.receipt_number):
                sold = txn.local_datetime.date()
                if txn.storecode == code and txn.status == "Saved" and sold < night - OLD:
                    return OldSale(txn.receipt_number, number, code, sold)
    raise AssertionError("no top debtor has an old saved sale")


# --- the scenario: three nights -----------------------------------------------------------------------


@dataclass
class Night:
    date: dt.date
    mode: str | None
    truth: Reports
    actual: Reports
    csv: dict[str, list[dict[str, str]]]
    facts: dict[str, Any]
    stores_active: dict[str, bool]  # marts.current_stores right after the night
    warehouse_sales: dict[
        str, dt.datetime
    ]  # marts.transactions: receipt -> transaction_date (watched receipts)
    warehouse_points: dict[str, list[tuple[str, dt.date, int]]]  # marts.points_transactions (watched clients)


@dataclass
class Scenario:
    """What the writes between the nights chose (the tests find the cases in it)."""

    first_store: str = ""
    voided: OldSale | None = None
    paid: OldSale | None = None
    paid_on: dt.date | None = None
    adjusted: tuple[str, str, str, dt.date] | None = None  # client, storecode, points id, dated
    closed_now: str = ""  # a store closed between nights 1 and 2
    tie_joiner: str = ""
    closed_store_void: OldSale | None = None
    drawn: list[tuple[str, str, dt.date]] = field(default_factory=list)  # membership, store, its draw night
    gift_voided: OldSale | None = None  # a gift-certificate sale voided late (before night 2)
    expiring: tuple[str, str, str] = ("", "", "")  # client, client package, store: expires after night 1
    redeemed: tuple[str, str, str] = ("", "", "")  # a session used before night 2
    month_end_leaver: tuple[str, dt.date] = (
        "",
        dt.date.min,
    )  # a client's only membership ends on a month's last day
    watched_receipts: set[str] = field(default_factory=set)
    watched_clients: set[str] = field(default_factory=set)
    keep_out: set[str] = field(default_factory=set)  # clients the ordinary writes leave alone
    written: list[str] = field(default_factory=list)  # the ordinary writes' paths
    written_clients: set[str] = field(default_factory=set)  # the clients they changed


def facts_of(service: Service, scenario: Scenario) -> dict[str, Any]:
    """The edge cases as the sandbox's state shows them at a night (read on its loop thread)."""
    service.materialize_all()
    first = scenario.first_store
    unlisted_ms = [ms for ms in service.memberships.values() if ms.storecode not in service.stores]
    return {
        "ranked": ranked_debtors(service, first),
        "store_active": {code: s.active for code, s in service.stores.items()},
        "activity": {code: store_activity(service, code) for code in service.stores},
        "unlisted_ledgers": {
            (c.client_number, k): b
            for c in service.clients.values()
            for k, b in c.ledger.items()
            if k not in service.stores
        },
        "unlisted_memberships": [(ms.client_number, ms.storecode, ms.status) for ms in unlisted_ms],
        "other_statuses": sorted(
            (ms.storecode, ms.status)
            for ms in service.memberships.values()
            if truth.status_bucket(ms.status) == "other" and ms.storecode in service.stores
        ),
        "dst_sales": sorted(
            (
                t.receipt_number,
                t.client_number,
                t.storecode,
                t.local_datetime,
                t.local_datetime.fold,
                t.wire_style,
            )
            for t in dst_sales(service)
        ),
        "late_paid": sorted(
            (
                t.receipt_number,
                t.client_number,
                t.storecode,
                t.local_datetime.date(),
                max(p.local_datetime.date() for p in t.payments),
            )
            for t in late_paid_sales(service)
        ),
        "sales": {
            code: sorted(
                {t.local_datetime.date() for t in service.transactions.values() if t.storecode == code}
            )
            for code in service.stores
        },
        "status": {r: service.transactions[r].status for r in scenario.watched_receipts},
        "packages": {
            p.client_package_id: (p.sessions_remaining, p.expiration_date)
            for c in service.clients.values()
            for p in c.packages
        },
        "points": {
            n: sorted(
                (p.points_transaction_id, p.local_datetime.date(), p.points)
                for p in service.client(n).points_transactions
            )
            for n in scenario.watched_clients
        },
    }


def read_night(
    ws: Workspace, sandbox: RunningSandbox, night: dt.date, mode: str | None, scenario: Scenario
) -> Night:
    reports_truth = truth.truth_of(sandbox, night)
    facts = sandbox.call(lambda s: facts_of(s, scenario))
    db = str(ws.data_dir.identified_db)
    with contextlib.closing(duckdb.connect(db, read_only=True)) as con:
        stores_active = dict(con.execute("SELECT storecode, active FROM marts.current_stores").fetchall())
        receipts = sorted(scenario.watched_receipts)
        sales = dict(
            con.execute(
                "SELECT receipt_number, transaction_date FROM marts.transactions "
                "WHERE list_contains(?, receipt_number)",
                [receipts],
            ).fetchall()
        )
        points: dict[str, list[tuple[str, dt.date, int]]] = {}
        for number, pid, day, amount in con.execute(
            "SELECT client_number, points_transaction_id, CAST(date AS DATE), points "
            "FROM marts.points_transactions JOIN identity.clients USING (client_key) "
            "WHERE list_contains(?, client_number) "
            "ORDER BY points_transaction_id",
            [sorted(scenario.watched_clients)],
        ).fetchall():
            points.setdefault(number, []).append((pid, day, amount))
    return Night(
        night,
        mode,
        reports_truth,
        truth.warehouse_reports(ws.data_dir, night),
        truth.read_csvs(ws.data_dir, night),
        facts,
        stores_active,
        sales,
        points,
    )


def ordinary_writes(sandbox: RunningSandbox, w: Writer, keep_out: set[str]) -> None:
    """Every kind of write the reports depend on, through HTTP, on clients no edge case needs."""
    ms = sandbox.call(lambda s: sorted(s.memberships.values(), key=lambda m: m.membership_id))
    ms = [m for m in ms if m.client_number not in keep_out]
    active_eft = [m for m in ms if m.is_eft and m.status == "Active"]
    frozen = [m for m in ms if m.is_eft and m.status == "Frozen"]
    on_hold = [m for m in ms if m.status == "OnHold"]
    assert len(active_eft) >= 6 and frozen and on_hold, "the sandbox should hold memberships in every status"
    today = dt.datetime.now(dt.UTC).date().isoformat()
    for one in active_eft[:3]:
        w.post(
            "clients/freezemembership",
            {"clientNumber": one.client_number, "membershipId": one.membership_id, "freezeStartDate": today},
        )
    w.post(
        "clients/unfreezemembership",
        {"clientNumber": frozen[0].client_number, "membershipId": frozen[0].membership_id},
    )
    w.post(
        "clients/cancelmembership",
        {"clientNumber": active_eft[3].client_number, "membershipId": active_eft[3].membership_id},
    )
    w.post(
        "clients/activatemembership",
        {"clientNumber": on_hold[0].client_number, "membershipId": on_hold[0].membership_id},
    )
    dearer = sandbox.call(lambda s: max(s.eft_types.values(), key=lambda t: t.monthly_dues))
    target = next(
        m
        for m in active_eft[4:]
        if m.monthly_dues < dearer.monthly_dues and dearer.storecode in (None, m.storecode)
    )
    w.post(
        "clients/upgrademembership",
        {
            "clientNumber": target.client_number,
            "membershipId": target.membership_id,
            "newMembershipTypeId": dearer.membership_type_id,
        },
    )

    # sales of every type, with payments (one partial), at the client's home store
    open_stores = sandbox.call(lambda s: {code for code, store in s.stores.items() if store.active})
    clients = [
        c
        for c in sandbox.call(lambda s: list(s.iter_clients()))
        if c.client_number not in keep_out and c.home_store in open_stores  # a closed store sells nothing
    ]
    packages = sandbox.call(lambda s: [p for p in s.package_types.values() if p.storecode is None])
    receipts = []
    for i, client in enumerate(clients[:4]):
        store = client.home_store
        product, price = w.product(store)
        lines: list[dict[str, Any]] = [
            {"type": "R", "productNumber": product, "quantity": 2, "pricePerUnit": str(price), "tax": "1.23"},
            {
                "type": "P",
                "packageId": packages[i % len(packages)].package_id,
                "quantity": 1,
                "pricePerUnit": "99.95",
                "tax": "0.00",
            },
            {"type": "G", "giftCertNo": f"GC-TRUTH-{i}", "quantity": 1, "pricePerUnit": "25.00"},
        ]
        own = [m for m in ms if m.client_number == client.client_number]
        if own:
            lines.append(
                {
                    "type": "1",
                    "membershipId": own[0].membership_id,
                    "quantity": 1,
                    "pricePerUnit": "10.01",
                    "tax": "0.01",
                }
            )
        answer = w.post(
            "clients/inserttransaction",
            {
                "clientNumber": client.client_number,
                "storecode": store,
                "empNo": w.employee(store),
                "lines": lines,
            },
        )
        receipts.append(answer["receiptNumber"])
    w.pay(receipts[0], "50.00")
    w.post(
        "clients/insertpayment",
        {"receiptNumber": receipts[1], "paymentType": w.pay_type(w.store_of(receipts[1])), "amount": 12.34},
    )

    # a ledger payment, points earned and redeemed
    debtor, store = sandbox.call(
        lambda s: max(
            (
                (c, code)
                for c in s.clients.values()
                if c.client_number not in keep_out
                for code in c.ledger
                if code in s.stores
            ),
            key=lambda x: x[0].ledger[x[1]],
        )
    )
    w.post(
        "clients/postaccountledgerpayment",
        {
            "clientNumber": debtor.client_number,
            "storecode": store,
            "amount": "20.05",
            "paymentType": w.pay_type(store),
        },
    )
    holder, pstore = sandbox.call(
        lambda s: next(
            (c, code)
            for c in s.iter_clients()
            if c.client_number not in keep_out
            for code, p in c.points.items()
            if p >= 10
        )
    )
    w.post(
        "clients/insertpoints",
        {"clientNumber": holder.client_number, "storecode": pstore, "points": -10, "reason": "redeemed"},
    )
    w.post(
        "clients/insertpoints",
        {
            "clientNumber": clients[5].client_number,
            "storecode": clients[5].home_store,
            "points": 250,
            "reason": "promo",
        },
    )

    # a new client with an EFT membership, a billing account and a sale
    store = clients[0].home_store
    emp = w.employee(store)
    new = w.post(
        "clients/insert", {"storecode": store, "empNo": emp, "firstName": "Zoë", "lastName": "Truth"}
    )
    number = new["clientNumber"]
    eft_type = sandbox.call(lambda s: next(t for t in s.eft_types.values() if t.storecode is None))
    membership = w.post(
        "clients/insertMembership",
        {
            "clientNumber": number,
            "storecode": store,
            "empNo": emp,
            "membershipTypeId": eft_type.membership_type_id,
            "isEft": True,
            "drawDay": 15,
        },
    )
    w.post(
        "clients/updatebillinginfo",
        {
            "clientNumber": number,
            "membershipId": membership["membershipId"],
            "type": "CARD",
            "deductType": "MON",
            "lastFour": "4242",
            "expMonth": 12,
            "expYear": 2030,
            "tokenId": "tok-truth-1",
        },
    )
    w.post(
        "clients/inserttransaction",
        {
            "clientNumber": number,
            "storecode": store,
            "empNo": emp,
            "lines": [
                {
                    "type": "M",
                    "membershipId": membership["membershipId"],
                    "quantity": 1,
                    "pricePerUnit": "49.00",
                    "tax": "3.06",
                }
            ],
        },
    )


def end_on_a_month_end(service: Service, night: dt.date, exclude: set[str]) -> tuple[str, dt.date]:
    """A client whose only membership expired months before ``night``: it now ends on its month's
    last day (a cohort counts the client out on that day, not in)."""
    service.materialize_all()
    owned: dict[str, list[m.Membership]] = defaultdict(list)
    for ms in service.memberships.values():
        owned[ms.client_number].append(ms)
    ms = next(
        ms
        for number, (ms,) in sorted((n, tuple(o)) for n, o in owned.items() if len(o) == 1)
        if number not in exclude
        and ms.status == "Expired"
        and ms.end_date is not None
        and ms.start_date.replace(day=1) < ms.end_date.replace(day=1) < night.replace(day=1)
    )
    assert ms.end_date is not None
    ms.end_date = (ms.end_date.replace(day=1) + dt.timedelta(days=32)).replace(day=1) - dt.timedelta(days=1)
    return ms.client_number, ms.end_date


def choose_targets(sandbox: RunningSandbox, scenario: Scenario) -> None:
    """Before the first night: the clients of the late corrections (each touched by nothing else)
    and the edge cases' clients, which the ordinary writes leave alone."""
    facts = sandbox.call(lambda s: facts_of(s, scenario))
    scenario.watched_receipts = {r for r, *_ in facts["dst_sales"]} | {r for r, *_ in facts["late_paid"]}
    keep_out = sandbox.call(edge_clients)
    night = NIGHTS[0]
    rows = truth.truth_of(sandbox, night)["top_debtors"]
    voided = sandbox.call(lambda s: old_sale_carrying_the_last_payment(s, night, rows, keep_out))
    keep_out.add(voided.client)
    paid = sandbox.call(lambda s: old_unpaid_sale_of_a_debtor(s, night, rows, keep_out))
    keep_out.add(paid.client)
    # the back-dated points: a client with points at its home store
    number, code = sandbox.call(
        lambda s: next(
            (c.client_number, c.home_store)
            for c in s.iter_clients()
            if c.client_number not in keep_out and c.points.get(c.home_store, 0) > 0
        )
    )
    keep_out.add(number)
    # a package that expires after the first night (a date passing: nothing changes on the service)
    # and one of which a session is used before the second
    scenario.expiring = sandbox.call(lambda s: quiet_open_package(s, night, keep_out))
    keep_out.add(scenario.expiring[0])
    scenario.redeemed = sandbox.call(lambda s: quiet_open_package(s, night, keep_out))
    keep_out.add(scenario.redeemed[0])
    number_expiring, package_expiring, _ = scenario.expiring
    sandbox.call(
        lambda s: setattr(
            next(p for p in s.client(number_expiring).packages if p.client_package_id == package_expiring),
            "expiration_date",
            night,
        )
    )
    # two active EFT memberships drawn on the second and third nights: dues due on nights held
    drawn = sandbox.call(
        lambda s: [
            ms
            for ms in sorted(s.memberships.values(), key=lambda ms: ms.membership_id)
            if ms.is_eft
            and ms.status == "Active"
            and ms.storecode in s.stores
            and ms.client_number not in keep_out
        ][:2]
    )
    for ms, day in zip(drawn, NIGHTS[1:], strict=True):
        sandbox.call(lambda s, ms=ms, day=day: setattr(s.memberships[ms.membership_id], "draw_day", day.day))
        keep_out.add(ms.client_number)
    scenario.drawn = [
        (ms.membership_id, ms.storecode, day) for ms, day in zip(drawn, NIGHTS[1:], strict=True)
    ]
    scenario.gift_voided = sandbox.call(lambda s: old_gift_certificate_sale(s, night, keep_out))
    keep_out.add(scenario.gift_voided.client)
    scenario.month_end_leaver = sandbox.call(lambda s: end_on_a_month_end(s, night, keep_out))
    keep_out.add(scenario.month_end_leaver[0])
    scenario.watched_receipts.add(scenario.gift_voided.receipt)
    scenario.voided, scenario.paid, scenario.keep_out = voided, paid, keep_out
    scenario.adjusted = (number, code, "", night - dt.timedelta(days=45))
    scenario.watched_receipts |= {voided.receipt, paid.receipt}
    scenario.watched_clients.add(number)


def before_night_2(sandbox: RunningSandbox, scenario: Scenario) -> None:
    ordinary = Writer(sandbox)
    ordinary_writes(sandbox, ordinary, scenario.keep_out)
    scenario.written, scenario.written_clients = ordinary.done, ordinary.clients
    w = Writer(sandbox)
    voided, paid = scenario.voided, scenario.paid
    assert voided is not None and paid is not None and scenario.adjusted is not None
    sandbox.call(lambda s: void_at_till(s, voided.receipt))
    sandbox.call(lambda s: redeem_at_till(s, *scenario.redeemed[:2]))
    gift_voided = scenario.gift_voided
    assert gift_voided is not None
    sandbox.call(lambda s: void_at_till(s, gift_voided.receipt))
    w.pay(paid.receipt, "1.00")
    # Dated the day after the first night, in store time, at whatever hour the test runs: the first
    # night's report, read again once the payment has landed, must not count it.
    noon = dt.datetime.combine(NIGHTS[1], dt.time(12))
    sandbox.call(lambda s: setattr(s.transactions[paid.receipt].payments[-1], "local_datetime", noon))
    scenario.paid_on = NIGHTS[1]
    number, code, _, dated = scenario.adjusted
    points_id = sandbox.call(lambda s: back_dated_points(s, number, code, dated, 75))
    scenario.adjusted = (number, code, points_id, dated)
    # a store closes (the back office's store list): the second store, busy until now
    scenario.closed_now = sandbox.call(lambda s: list(s.stores)[1])
    sandbox.call(lambda s: setattr(s.stores[scenario.closed_now], "active", False))


def before_night_3(sandbox: RunningSandbox, scenario: Scenario, second: Night) -> None:
    w = Writer(sandbox)
    first = scenario.first_store
    ranked = second.facts["ranked"]
    tie = ranked[TOP - 1][1]
    above = [(n, b) for n, b in ranked[: TOP - 1] if b > tie]
    joiner, balance = above[-1]  # the smallest balance above the tie
    w.post(
        "clients/postaccountledgerpayment",
        {
            "clientNumber": joiner,
            "storecode": first,
            "amount": str(balance - tie),
            "paymentType": w.pay_type(first),
        },
    )
    scenario.tie_joiner = joiner
    closed = next(
        code
        for code, active in second.facts["store_active"].items()
        if not active and code != scenario.closed_now
    )
    sale = sandbox.call(
        lambda s: next(
            OldSale(t.receipt_number, t.client_number, t.storecode, t.local_datetime.date())
            for _, t in sorted(s.transactions.items())
            if t.storecode == closed and t.status == "Saved"
        )
    )
    sandbox.call(lambda s: void_at_till(s, sale.receipt))
    scenario.closed_store_void = sale
    scenario.watched_receipts.add(sale.receipt)


@dataclass
class Run:
    sandbox: RunningSandbox
    scenario: Scenario
    nights: list[Night]
    data_dir: Any  # DataDir of the nights' warehouse
    dues_expected: dict[tuple[dt.date, str], Decimal]  # (month, store) -> dues due on the nights held
    store_months: dict[dt.date, dict[str, str]]  # month -> stores listed on its nights
    members_on: dict[dt.date, set[str]]  # night -> clients with a membership active or frozen


@pytest.fixture(scope="module")
def run() -> Iterator[Run]:
    sandbox = start_in_thread(SandboxConfig(clients=200, seed=4, anchor_date=NIGHTS[0]))
    try:
        with tempfile.TemporaryDirectory(prefix="reports-truth-") as tmp:
            ws = Workspace(Path(tmp), sandbox.url, NIGHTS[0], batch_size=50)
            scenario = Scenario(first_store=sandbox.call(busiest_store))
            choose_targets(sandbox, scenario)
            nights: list[Night] = []
            owed_before: dict[str, truth.PackageOwed] | None = None
            dues: dict[tuple[dt.date, str], Decimal] = defaultdict(lambda: Decimal("0.00"))
            store_months: dict[dt.date, dict[str, str]] = defaultdict(dict)
            members_on: dict[dt.date, set[str]] = {}
            for k, night in enumerate(NIGHTS):
                if k == 1:
                    before_night_2(sandbox, scenario)
                if k == 2:
                    before_night_3(sandbox, scenario, nights[1])
                outcome = ws.sync(ws.argv(night))
                assert outcome.ok, outcome.describe()
                nights.append(read_night(ws, sandbox, night, outcome.summary_value("mode"), scenario))
                # the roll-forward's truth needs the night before: kept from night to night
                nights[-1].truth["package_liability_roll_forward"] = sandbox.call(
                    lambda s, night=night, before=owed_before: truth.package_roll_forward_of(s, night, before)
                )
                owed_before = sandbox.call(lambda s, night=night: truth.packages_owed(s, night))
                month = night.replace(day=1)
                for code, amount in sandbox.call(
                    lambda s, night=night: truth.dues_due_tonight(s, night)
                ).items():
                    dues[(month, code)] += amount
                store_months[month].update(sandbox.call(lambda s: {c: st.name for c, st in s.stores.items()}))
                members_on[night] = sandbox.call(truth.members_tonight)
            yield Run(sandbox, scenario, nights, ws.data_dir, dict(dues), dict(store_months), members_on)
    finally:
        sandbox.stop()


def assert_case(
    night: Night, name: str, where: Callable[[truth.Row], bool], *, rows: bool | None = True
) -> list[truth.Row]:
    """The report rows an edge case touches equal the truth (warehouse and CSV); returns the truth's.
    ``rows``: True, the truth has such rows; False, it has none (and so must the warehouse); None,
    either."""
    problems = truth.case_differences(
        name, night.actual[name], night.csv[name], night.truth[name], night.date, where
    )
    assert not problems, f"night {night.date}:\n  " + "\n  ".join(problems)
    selected = [r for r in night.truth[name] if where(r)]
    assert rows is None or bool(selected) == rows, (name, night.date, selected[:3])
    return selected


def at_store(code: str) -> Callable[[truth.Row], bool]:
    return matching(storecode=code)


def matching(**want: Any) -> Callable[[truth.Row], bool]:
    """Rows whose columns equal the given values."""
    return lambda r: all(r[column] == value for column, value in want.items())


def among(column: str, values: set[Any]) -> Callable[[truth.Row], bool]:
    return lambda r: r[column] in values


# --- the whole reports ------------------------------------------------------------------------------------


def test_every_report_equals_the_truth_after_a_full_night_and_two_incremental_ones(run: Run) -> None:
    assert [n.mode for n in run.nights] == ["full", "incremental", "incremental"]
    assert len(run.scenario.written) >= 20 and len(run.scenario.written_clients) >= 10
    for night in run.nights:
        problems = truth.report_differences(night.actual, night.truth)
        problems += [p for name, rows in night.truth.items() for p in _csv_problems(night, name, rows)]
        assert not problems, f"night {night.date}:\n  " + "\n  ".join(problems)
        assert sum(len(rows) for rows in night.truth.values()) > 100  # the truth is not trivially empty
    assert run.nights[1].truth != run.nights[0].truth  # the writes moved the numbers


def _csv_problems(night: Night, name: str, rows: list[truth.Row]) -> list[str]:
    spec = truth.SPECS[name]
    return truth.diff_rows(
        name + ".csv", night.csv[name], truth.expected_csv_rows(name, rows, night.date), spec.key
    )


def test_night_1_snapshot_reports_are_history(run: Run) -> None:
    """Later nights do not rewrite an earlier night's snapshot reports."""
    first = run.nights[0]
    again = truth.warehouse_reports(run.data_dir, first.date, SNAPSHOT_REPORTS)
    assert truth.report_differences(again, {n: first.truth[n] for n in SNAPSHOT_REPORTS}) == []


# --- the edge cases, one test each --------------------------------------------------------------------------


def test_case_more_than_50_debtors_at_one_store(run: Run) -> None:
    first = run.scenario.first_store
    for night in run.nights:
        assert len(night.facts["ranked"]) > TOP, night.date
        rows = assert_case(night, "top_debtors", at_store(first))
        assert len(rows) == TOP
        assert [r["client_number"] for r in rows] == [n for n, _ in night.facts["ranked"][:TOP]]


def test_case_tie_at_the_50th_place(run: Run) -> None:
    """Equal balances straddle rank 50: the tie-break by client number decides who is in."""
    first = run.scenario.first_store
    for night in run.nights:
        ranked = night.facts["ranked"]
        tie = ranked[TOP - 1][1]
        tied = [n for n, b in ranked if b == tie]
        inside = [n for n, _ in ranked[:TOP] if n in tied]
        assert ranked[TOP][1] == tie, (night.date, ranked[TOP - 3 : TOP + 3])  # ranks 50 and 51 tie
        assert inside == sorted(tied)[: len(inside)]  # the lower client numbers are in
        rows = assert_case(night, "top_debtors", matching(storecode=first, balance=tie))
        assert [r["client_number"] for r in rows] == inside
        in_warehouse = {r["client_number"] for r in night.actual["top_debtors"] if r["storecode"] == first}
        assert in_warehouse.isdisjoint(set(tied) - set(inside))  # the tied clients past rank 50 are out
    # night 3: a ledger payment brought one more debtor into the tie (an incremental night's write)
    joiner = run.scenario.tie_joiner
    tie3 = run.nights[2].facts["ranked"][TOP - 1][1]
    assert dict(run.nights[2].facts["ranked"])[joiner] == tie3 != dict(run.nights[1].facts["ranked"])[joiner]


def test_case_balances_and_memberships_at_a_storecode_outside_the_store_list(run: Run) -> None:
    for night in run.nights:
        balances = night.facts["unlisted_ledgers"]
        assert any(b > 0 for b in balances.values()) and any(b < 0 for b in balances.values()), balances
        memberships = night.facts["unlisted_memberships"]
        assert any(status == "Active" for _, _, status in memberships), memberships
        unlisted = {code for _, code in balances} | {code for _, code, _ in memberships}
        for name in STORE_REPORTS:  # counted nowhere: no row, and every store's row equals the truth
            assert not [r for r in night.actual[name] if r["storecode"] in unlisted], name
            assert not [r for r in night.csv[name] if r["storecode"] in unlisted], name
            assert_case(night, name, lambda r: True)
        # the member's active memberships count across all stores, the unlisted one too
        members = {number for number, _, status in memberships if status == "Active"}
        rows = assert_case(night, "top_debtors", among("client_number", members))
        assert any(r["active_memberships"] >= 1 for r in rows)


def test_case_membership_statuses_outside_the_contracts_five_count_as_other(run: Run) -> None:
    for night in run.nights:
        odd = night.facts["other_statuses"]
        assert odd, night.date
        for code in {code for code, _ in odd}:
            rows = assert_case(night, "frozen_memberships_by_store", at_store(code))
            assert rows[0]["other"] >= sum(1 for c, _ in odd if c == code)
            counted = assert_case(night, "membership_status_daily", at_store(code))
            assert any(r["status"] == "other" and r["memberships"] > 0 for r in counted)


def test_case_a_store_with_no_activity(run: Run) -> None:
    for night in run.nights:
        idle = [code for code, count in night.facts["activity"].items() if count == 0]
        assert idle, night.facts["activity"]
        for code in idle:
            for name in SNAPSHOT_REPORTS:  # one row per store of the list, all zeros
                rows = assert_case(night, name, at_store(code))
                counts = [v for r in rows for k, v in r.items() if k not in LABELS]
                assert counts and all(v in (0, None) for v in counts), (name, rows)
            assert_case(night, "revenue_by_store_day", at_store(code), rows=False)
            assert_case(night, "top_debtors", at_store(code), rows=False)


def test_case_a_store_closed_mid_history(run: Run) -> None:
    scenario = run.scenario
    anchor = NIGHTS[0]
    for night in run.nights:
        closed = [code for code, active in night.facts["store_active"].items() if not active]
        assert night.stores_active == night.facts["store_active"]  # the warehouse's store list of the night
        # the store that had closed before the first night: sales until its closing, none since
        long_closed = [c for c in closed if c != scenario.closed_now]
        assert long_closed, night.date
        for code in long_closed:
            sales = night.facts["sales"][code]
            assert sales and max(sales) < anchor - dt.timedelta(days=60), (code, sales[-3:])
            assert_case(night, "revenue_by_store_day", at_store(code))
            for name in STORE_REPORTS:
                assert_case(night, name, at_store(code), rows=None if name == "top_debtors" else True)
        # the store closed between nights 1 and 2 keeps its rows in every report
        assert (scenario.closed_now in closed) == (night is not run.nights[0])
        for name in STORE_REPORTS:
            assert_case(
                night, name, at_store(scenario.closed_now), rows=None if name == "top_debtors" else True
            )
    # a void of an old sale at the closed store (before night 3): its revenue day moved
    void = scenario.closed_store_void
    assert void is not None and run.nights[2].facts["status"][void.receipt] == "Voided"
    day = matching(storecode=void.storecode, business_date=void.sold)
    before = assert_case(run.nights[1], "revenue_by_store_day", day)
    after = assert_case(run.nights[2], "revenue_by_store_day", day, rows=None)
    assert before != after


def test_case_local_times_on_dst_changes(run: Run) -> None:
    """Sales at 01:30 twice on a fall-back day, just before and after the spring-forward jump, and
    at 23:30 written as UTC (the next day in UTC): each counts on its local day."""
    for night in run.nights:
        sales = night.facts["dst_sales"]
        stamps = {(when.time(), fold) for _, _, _, when, fold, _ in sales}
        assert {
            (dt.time(1, 30), 0),
            (dt.time(1, 30), 1),
            (dt.time(1, 59, 59), 0),
            (dt.time(3, 0), 0),
        } <= stamps
        assert {style for *_, style in sales} == {"local", "offset", "utc"}
        for receipt, number, code, when, _, _ in sales:
            # the warehouse holds the store's local time, whatever the wire's style
            assert night.warehouse_sales[receipt] == when, (receipt, when)
            rows = assert_case(
                night,
                "revenue_by_store_day",
                matching(storecode=code, business_date=when.date()),
            )
            assert rows
            debtor = assert_case(
                night,
                "top_debtors",
                matching(storecode=code, client_number=number),
            )
            # the newest payment is the 23:30 one on the later DST day (the next day in UTC)
            newest = max(w for _, n, c, w, _, _ in sales if (n, c) == (number, code))
            assert debtor[0]["last_payment_date"] == newest.date()


def test_case_void_on_a_sale_older_than_any_window(run: Run) -> None:
    voided = run.scenario.voided
    assert voided is not None and voided.sold < NIGHTS[0] - OLD
    assert voided.client not in run.scenario.written_clients  # nothing else changed the client
    first, second, third = run.nights
    assert first.facts["status"][voided.receipt] == "Saved"
    assert second.facts["status"][voided.receipt] == third.facts["status"][voided.receipt] == "Voided"
    its_day = matching(storecode=voided.storecode, business_date=voided.sold)
    its_row = matching(storecode=voided.storecode, client_number=voided.client)
    counted = assert_case(first, "revenue_by_store_day", its_day)
    for night in (second, third):
        gone = assert_case(night, "revenue_by_store_day", its_day, rows=None)
        assert gone != counted  # the sale's revenue left its (old) day
        row = assert_case(night, "top_debtors", its_row)
        # its newest payment was on the voided sale: the warehouse moved back with the truth
        assert (
            row[0]["last_payment_date"] != assert_case(first, "top_debtors", its_row)[0]["last_payment_date"]
        )


def test_case_payment_on_a_sale_older_than_any_window(run: Run) -> None:
    """The client paid on its old sale and did nothing else: the warehouse itself (not only the
    truth) shows the payment as its last; before, it showed an older one. The generated late
    payment (a sale paid months later) counts too."""
    paid, paid_on = run.scenario.paid, run.scenario.paid_on
    assert paid is not None and paid_on is not None and paid.sold < NIGHTS[0] - OLD
    assert paid.client not in run.scenario.written_clients  # its only write is the payment
    its_row = matching(storecode=paid.storecode, client_number=paid.client)
    first, second, third = run.nights
    before = [r for r in first.actual["top_debtors"] if its_row(r)]
    assert before and (before[0]["last_payment_date"] or dt.date.min) < paid_on  # older, or none
    # The report is a view over the newest payments: read again after the later nights, the first
    # night still ends with that night (the payment is of the day after it).
    again = truth.warehouse_reports(run.data_dir, first.date, ("top_debtors",))["top_debtors"]
    assert [r["last_payment_date"] for r in again if its_row(r)] == [before[0]["last_payment_date"]]
    for night in (second, third):
        assert_case(night, "top_debtors", its_row)
        got = [r for r in night.actual["top_debtors"] if its_row(r)]
        assert got and got[0]["last_payment_date"] == paid_on
    for night in run.nights:  # the generated sale paid months later
        late = [x for x in night.facts["late_paid"] if x[2] in night.facts["store_active"]]
        assert late
        for _, number, code, sold, paid_day in late:
            row = assert_case(
                night,
                "top_debtors",
                matching(storecode=code, client_number=number),
            )
            assert row[0]["last_payment_date"] == paid_day and (paid_day - sold).days > 60


def test_case_a_package_expires_as_a_date_passes(run: Run) -> None:
    """Open on the first night, expired on the second, with no change on the service between: the
    incremental night does not sync its client, and the store's liability drops all the same."""
    number, package, code = run.scenario.expiring
    first, second, _ = run.nights
    assert number not in run.scenario.written_clients
    assert first.facts["packages"][package] == second.facts["packages"][package]  # nothing changed
    sessions, expires = first.facts["packages"][package]
    assert sessions > 0 and expires == first.date < second.date
    for night in (first, second):
        assert_case(night, "package_liability_by_store", at_store(code))
    (moved,) = assert_case(second, "package_liability_roll_forward", at_store(code))
    assert moved["expired"] > 0  # the package's liability the night before, as breakage


def test_case_a_session_redeemed_between_nights(run: Run) -> None:
    number, package, code = run.scenario.redeemed
    first, second, _ = run.nights
    assert number not in run.scenario.written_clients
    assert second.facts["packages"][package][0] == first.facts["packages"][package][0] - 1
    for night in (first, second):
        assert_case(night, "package_liability_by_store", at_store(code))
    (moved,) = assert_case(second, "package_liability_roll_forward", at_store(code))
    assert moved["redeemed"] > 0


def test_case_the_package_roll_forward_adds_up_and_chains(run: Run) -> None:
    """opening + sold - redeemed - expired = closing on every row (the warehouse's), each night's
    opening is the previous night's closing, and the first night is the baseline."""
    name = "package_liability_roll_forward"
    for night in run.nights:
        for r in night.actual[name]:
            moved = r["opening_liability"] + r["sold"] - r["redeemed"] - r["expired"]
            assert moved == r["closing_liability"], r
    closing = {r["storecode"]: r["closing_liability"] for r in run.nights[0].actual[name]}
    assert all(r["sold"] == r["redeemed"] == r["expired"] == 0 for r in run.nights[0].actual[name])
    for night in run.nights[1:]:
        opening = {r["storecode"]: r["opening_liability"] for r in night.actual[name]}
        assert {k: v for k, v in opening.items() if v} == {k: v for k, v in closing.items() if v}
        closing = {r["storecode"]: r["closing_liability"] for r in night.actual[name]}
    assert sum(r["sold"] for r in run.nights[1].actual[name]) > 0  # the packages sold between nights
    again = truth.warehouse_reports(run.data_dir, run.nights[0].date, [name])  # history, read later
    assert truth.report_differences(again, {name: run.nights[0].truth[name]}) == []


def test_case_the_monthly_package_roll_forward_sums_the_nights_of_its_month(run: Run) -> None:
    """The monthly twin: each month's opening is its first night's, its movements the sums of its
    nights (the expiry and the redemption between nights among them), its closing its last
    night's; read from the stored month to date, the same in the view and the CSV of the last night."""
    name = "package_liability_roll_forward_monthly"
    daily = [r for night in run.nights for r in night.truth["package_liability_roll_forward"]]
    want = truth.monthly_roll_forward(
        daily, "opening_liability", ("sold", "redeemed", "expired"), "closing_liability"
    )
    with contextlib.closing(duckdb.connect(str(run.data_dir.warehouse_db), read_only=True)) as con:
        cursor = con.execute(f"SELECT * FROM reports.{name}")
        header = [d[0] for d in cursor.description or []]
        actual = [dict(zip(header, r, strict=True)) for r in cursor.fetchall()]
    assert truth.diff_rows(name, actual, want, ("month", "storecode")) == []
    for row in actual:
        moved = row["opening_liability"] + row["sold"] - row["redeemed"] - row["expired"]
        assert moved == row["closing_liability"], row
    assert sum(r["expired"] for r in want) > 0 and sum(r["redeemed"] for r in want) > 0
    last = run.nights[-1].date
    _, csv_rows = truth.read_csv(truth.csv_path(run.data_dir, last, name))
    assert [(r["month"], r["closing_liability"]) for r in csv_rows] == [
        (r["month"].isoformat(), str(r["closing_liability"]))
        for r in sorted(want, key=lambda r: (r["month"], r["storecode"].encode()))
    ]


def test_case_packages_sold_between_nights(run: Run) -> None:
    sold = set(run.nights[1].facts["packages"]) - set(run.nights[0].facts["packages"])
    assert len(sold) >= 4  # the ordinary writes' package sales
    assert_case(run.nights[1], "package_liability_by_store", lambda _row: True)


def test_case_a_late_void_of_a_gift_certificate_sale(run: Run) -> None:
    """A certificate sold long ago, voided before the second night: sold and outstanding drop at
    its store on the second night; certificates redeemed (GIFT payments) count on both."""
    sale = run.scenario.gift_voided
    first, second, _ = run.nights
    assert sale is not None and sale.client not in run.scenario.written_clients
    assert first.facts["status"][sale.receipt] == "Saved"
    assert second.facts["status"][sale.receipt] == "Voided"
    for night in (first, second):
        assert_case(night, "gift_certificate_liability_by_store", at_store(sale.storecode))
    assert any(r["redeemed"] > 0 for r in first.truth["gift_certificate_liability_by_store"])


def drawn_charts(run: Run, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[dict[str, Any]]]:
    """The last night's morning-report charts as drawn: each chart's value field -> its points."""
    from membersync.warehouse.exports import export, morning, morning_charts

    specs: dict[str, list[dict[str, Any]]] = {}

    def capture(chart: Any) -> str:
        spec = chart.to_dict(validate=False)
        specs[spec["encoding"]["y"]["field"]] = spec["data"]["values"]
        return "<svg></svg>"

    monkeypatch.setattr(morning_charts, "_render", capture)
    with export.open_at_night(run.data_dir, run.nights[-1].date) as (con, night):
        morning.read_charts(con, night)
    return specs


def test_case_the_morning_report_plots_what_is_owed_to_clients(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The morning report's charts of package liability and gift certificates outstanding plot,
    for every night and store, the report's rows: the last night's equal to the truth."""
    from membersync.warehouse.exports import export

    specs = drawn_charts(run, monkeypatch)
    last = run.nights[-1]
    with export.open_at_night(run.data_dir, last.date) as (con, _):
        for report, value in (
            ("package_liability_by_store", "liability"),
            ("gift_certificate_liability_by_store", "outstanding"),
        ):
            rows = con.execute(f"SELECT snapshot_date, store_name, {value} FROM reports.{report}").fetchall()
            plotted = {
                (p["night"], p["store"]): Decimal(str(p[value])).quantize(truth.CENT) for p in specs[value]
            }
            assert plotted == {(d.isoformat(), name): amount for d, name, amount in rows}, report
            tonight = {(last.date.isoformat(), r["store_name"]): r[value] for r in last.truth[report]}
            assert {k: v for k, v in plotted.items() if k[0] == last.date.isoformat()} == tonight, report
            assert any(tonight.values()), report  # the sandbox owes its clients something


def test_case_dues_due_on_the_nights_held_beside_the_dues_billed(run: Run) -> None:
    """Two active EFT memberships drawn on the second and third nights count in the expected dues
    of their month and store; billed dues are the type-1 lines of the month's sales (the ordinary
    writes sell some). Every row of the view equals the truth; a month before the first night has
    no row (not guessed)."""
    with contextlib.closing(duckdb.connect(str(run.data_dir.identified_db), read_only=True)) as con:
        cursor = con.execute("SELECT * FROM reports.dues_billing_by_store_month")
        header = [d[0] for d in cursor.description or []]
        actual = [dict(zip(header, r, strict=True)) for r in cursor.fetchall()]
    want = run.sandbox.call(lambda s: truth.dues_billing(s, run.store_months, run.dues_expected))
    assert truth.diff_rows("dues_billing_by_store_month", actual, want, ("month", "storecode")) == []
    for membership_id, code, night in run.scenario.drawn:
        row = next(r for r in want if r["month"] == night.replace(day=1) and r["storecode"] == code)
        assert row["expected_dues"] > 0, (membership_id, row)
    assert any(r["billed_dues"] > 0 for r in want)
    assert min(r["month"] for r in actual) == NIGHTS[0].replace(day=1)


def test_case_member_cohorts_from_the_membership_dates_and_the_nights_held(run: Run) -> None:
    """Every row of the cohort view equals the truth: the months before the first night read from
    the membership dates, the months held from the nights (a membership canceled and a client
    who joined between nights move the current month), revenue to date per client beside them."""
    with contextlib.closing(duckdb.connect(str(run.data_dir.warehouse_db), read_only=True)) as con:
        cursor = con.execute("SELECT * FROM reports.cohort_retention")
        header = [d[0] for d in cursor.description or []]
        actual = [dict(zip(header, r, strict=True)) for r in cursor.fetchall()]
    want = run.sandbox.call(lambda s: truth.cohort_retention(s, run.members_on))
    key = ("cohort_month", "storecode", "months_since_join")
    assert truth.diff_rows("cohort_retention", actual, want, key) == []
    first_month = NIGHTS[0].replace(day=1)
    assert any(r["month"] < first_month and 0 < r["still_members"] < r["cohort_size"] for r in want)
    assert any(r["cohort_month"] >= first_month and r["months_since_join"] == 0 for r in want)  # joined now
    assert any(r["lifetime_value"] > 0 for r in want)
    number, last_day = run.scenario.month_end_leaver
    (only,) = run.sandbox.call(lambda s: [ms for ms in s.memberships.values() if ms.client_number == number])
    (leaving,) = [
        r
        for r in want
        if (r["cohort_month"], r["storecode"]) == (only.start_date.replace(day=1), only.storecode)
        and r["month"] == last_day.replace(day=1)
    ]
    assert leaving["as_of_date"] == last_day and leaving["month"] < first_month  # out on its end date
    cohorts = {(r["cohort_month"], r["storecode"]) for r in want}
    assert len(cohorts) > 20 and len(actual) == len(want)


def test_case_the_morning_report_plots_the_recent_cohorts(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    """The morning report's cohort chart plots, for each cohort joined in the last six months, the
    chain's still members over its size, month by month: the truth's figures, summed over stores."""
    specs = drawn_charts(run, monkeypatch)
    last = run.nights[-1].date
    plotted = {(p["cohort"], p["months"]): p["retention"] for p in specs["retention"]}
    sums: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    months = last.year * 12 + last.month - 1 - 5  # the sixth month back, counting the night's
    oldest = dt.date(months // 12, months % 12 + 1, 1)
    for r in run.sandbox.call(lambda s: truth.cohort_retention(s, run.members_on)):
        if r["cohort_month"] >= oldest:
            pair = sums[(r["cohort_month"].strftime("%Y-%m"), r["months_since_join"])]
            pair[0] += r["still_members"]
            pair[1] += r["cohort_size"]
    assert plotted == {k: still / size for k, (still, size) in sums.items()}
    assert len({cohort for cohort, _ in plotted}) == 6


def test_case_the_morning_report_plots_dues_and_package_moves_by_month(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The month charts plot, for each month held up to the night's, the chain's dues expected and
    billed and its package liability sold, redeemed and expired: the truth's, summed over stores."""
    specs = drawn_charts(run, monkeypatch)
    dues = run.sandbox.call(lambda s: truth.dues_billing(s, run.store_months, run.dues_expected))
    daily = [r for night in run.nights for r in night.truth["package_liability_roll_forward"]]
    moves = truth.monthly_roll_forward(
        daily, "opening_liability", ("sold", "redeemed", "expired"), "closing_liability"
    )
    for value, rows, columns in (
        ("dues", dues, ("expected_dues", "billed_dues")),
        ("moved", moves, ("sold", "redeemed", "expired")),
    ):
        want: dict[tuple[str, str], Decimal] = defaultdict(lambda: Decimal("0.00"))
        for r in rows:
            for c in columns:
                want[(r["month"].strftime("%Y-%m"), c.replace("_", " "))] += r[c]
        plotted = {
            (p["month"], p["figure"]): Decimal(str(p[value])).quantize(truth.CENT) for p in specs[value]
        }
        assert plotted == dict(want), value
        assert any(plotted.values()), value


def test_case_points_adjustment_back_dated(run: Run) -> None:
    adjusted = run.scenario.adjusted
    assert adjusted is not None
    number, code, points_id, dated = adjusted
    assert dated < NIGHTS[0] - OLD
    first, second, third = run.nights
    assert points_id not in {p for p, _, _ in first.facts["points"][number]}
    for night in (second, third):
        assert (points_id, dated, 75) in night.facts["points"][number]
        # the client's whole points history, the back-dated adjustment too, is in the warehouse
        assert night.warehouse_points[number] == night.facts["points"][number]
        assert_case(night, "points_liability_by_store", at_store(code))
    assert second.truth["points_liability_by_store"] != first.truth["points_liability_by_store"]


# --- issue 9's must-show: late corrections on a quiet sandbox -------------------------------------------


@pytest.fixture
def workspace() -> Iterator[Callable[[RunningSandbox, dict[str, str]], Workspace]]:
    with tempfile.TemporaryDirectory(prefix="reports-truth-") as tmp:
        yield lambda sandbox, env: Workspace(Path(tmp), sandbox.url, NIGHTS[1], batch_size=50, extra_env=env)


@pytest.mark.parametrize("whole_history", ["default", "off"])
def test_incremental_night_after_a_void_and_a_payment_on_old_sales(
    fresh_sandbox: Callable[..., RunningSandbox],
    workspace: Callable[[RunningSandbox, dict[str, str]], Workspace],
    whole_history: str,
) -> None:
    """An incremental night after a void and a payment on sales older than 30 days, with no other
    activity for those clients (nor anyone): ``revenue_by_store_day`` and
    ``top_debtors.last_payment_date`` in the warehouse and the CSVs equal the truth. With
    ``MEMBERSYNC_WHOLE_HISTORY=off`` the window misses both: the warehouse differs from the truth."""
    sandbox = fresh_sandbox(clients=60, seed=9, anchor_date=NIGHTS[1])
    env = {} if whole_history == "default" else {"MEMBERSYNC_WHOLE_HISTORY": "off"}
    ws = workspace(sandbox, env)
    night1, night2 = NIGHTS[1], NIGHTS[2]
    first = ws.sync(ws.argv(night1))
    assert first.ok, first.describe()
    truth1 = truth.assert_night_exact(sandbox, ws.data_dir, night1)

    rows = truth1["top_debtors"]
    voided = sandbox.call(lambda s: old_sale_carrying_the_last_payment(s, night1, rows, set()))
    paid = sandbox.call(lambda s: old_unpaid_sale_of_a_debtor(s, night1, rows, {voided.client}))
    sandbox.call(lambda s: void_at_till(s, voided.receipt))
    Writer(sandbox).pay(paid.receipt, "1.00")

    second = ws.sync(ws.argv(night2))
    assert second.ok, second.describe()
    assert second.summary_value("mode") == "incremental", second.stdout
    truth2 = truth.truth_of(sandbox, night2)
    actual = truth.warehouse_reports(ws.data_dir, night2, ("revenue_by_store_day", "top_debtors"))
    csvs = truth.read_csvs(ws.data_dir, night2, ("revenue_by_store_day", "top_debtors"))

    void_day = matching(storecode=voided.storecode, business_date=voided.sold)
    debtors = {(voided.storecode, voided.client), (paid.storecode, paid.client)}

    def their_rows(row: truth.Row) -> bool:
        return (row["storecode"], row["client_number"]) in debtors

    cases = (("revenue_by_store_day", void_day), ("top_debtors", their_rows))
    # the corrections moved the truth: a test that passed before them would prove nothing
    for name, where in cases:
        assert [r for r in truth1[name] if where(r)] != [r for r in truth2[name] if where(r)], name
    problems = [
        p
        for name, where in cases
        for p in truth.case_differences(name, actual[name], csvs[name], truth2[name], night2, where)
    ]
    if whole_history == "default":
        assert problems == []
        truth.assert_night_exact(sandbox, ws.data_dir, night2)  # and every other row of every report
    else:
        # the window refetched neither old sale: the warehouse still counts the void's revenue and
        # shows both clients' older payments
        assert any(p.startswith("revenue_by_store_day") for p in problems), problems
        assert any(
            "top_debtors " in p and voided.client in p and "last_payment_date" in p for p in problems
        ), problems
        assert any("top_debtors " in p and paid.client in p and "last_payment_date" in p for p in problems), (
            problems
        )
