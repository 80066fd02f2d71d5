"""Issue 4's must-show: the seven reports equal the sandbox's own truth, to the cent.

A first (full) night, then writes made through the sandbox **over HTTP** with a plain client
(freezes, an unfreeze, a cancel, an activation, an upgrade, sales of every type, payments
including one on a sale older than the incremental window, a ledger payment, points earned and
redeemed, a new client with a membership and a sale, a new billing account), then a second
(incremental) night: the warehouse and the CSVs of each night equal what the sandbox says.
"""

from __future__ import annotations

import datetime as dt
import tempfile
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
import truth
from membersync.extract.sandbox.server import RunningSandbox
from reliability import Workspace

ANCHOR = dt.datetime.now(dt.UTC).date()
SNAPSHOT_REPORTS = (
    "outstanding_balances_by_store",
    "frozen_memberships_by_store",
    "points_liability_by_store",
    "eft_draw_forecast",
    "membership_status_daily",
)


@pytest.fixture
def workspace() -> Iterator[Callable[[RunningSandbox], Workspace]]:
    with tempfile.TemporaryDirectory(prefix="reports-truth-") as tmp:
        yield lambda sandbox: Workspace(Path(tmp), sandbox.url, ANCHOR, batch_size=25)


class Writer:
    """Writes through the sandbox's HTTP interface with a plain httpx client (not ours)."""

    def __init__(self, sandbox: RunningSandbox) -> None:
        self.http = httpx.Client(base_url=sandbox.url + "/svcapi/", auth=("sandbox", "sandbox"), timeout=30)
        self.sandbox = sandbox
        self.done: list[str] = []

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self.http.post(path, json=body)
        assert response.status_code == 200, f"{path} {body} -> {response.status_code} {response.text}"
        self.done.append(path)
        return response.json()  # type: ignore[no-any-return]

    def employee(self, storecode: str) -> str:
        return self.sandbox.call(lambda s: next(e.emp_no for e in s.store_employees[storecode] if e.active))

    def product(self, storecode: str) -> tuple[str, Decimal]:
        first = self.sandbox.call(lambda s: s.store_products[storecode][0])
        return first.product_number, first.price

    def pay_type(self, storecode: str) -> str:
        return self.sandbox.call(lambda s: s.store_payment_types[storecode][0].code)

    def store_of(self, receipt: str) -> str:
        return self.sandbox.call(lambda s: s.transactions[receipt].storecode)


def _pick(sandbox: RunningSandbox, fn: Callable[[Any], Any]) -> Any:
    return sandbox.call(fn)


def make_changes(sandbox: RunningSandbox, last_night: dt.date) -> tuple[list[str], Any]:
    """Every kind of write the reports depend on, through HTTP; returns the paths written and
    the old transaction paid today."""
    w = Writer(sandbox)
    ms = _pick(sandbox, lambda s: sorted(s.memberships.values(), key=lambda m: m.membership_id))
    active_eft = [m for m in ms if m.is_eft and m.status == "Active"]
    frozen = [m for m in ms if m.is_eft and m.status == "Frozen"]
    on_hold = [m for m in ms if m.status == "OnHold"]
    assert len(active_eft) >= 6 and frozen and on_hold, "the sandbox should hold memberships in every status"
    today = dt.datetime.now(dt.UTC).date().isoformat()
    for m in active_eft[:3]:
        w.post(
            "clients/freezemembership",
            {"clientNumber": m.client_number, "membershipId": m.membership_id, "freezeStartDate": today},
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
    dearer = _pick(sandbox, lambda s: max(s.eft_types.values(), key=lambda t: t.monthly_dues))
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
    clients = _pick(sandbox, lambda s: [c for c in s.iter_clients()])
    packages = _pick(sandbox, lambda s: [p for p in s.package_types.values() if p.storecode is None])
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
    w.post(
        "clients/insertpayment",
        {"receiptNumber": receipts[0], "paymentType": w.pay_type(w.store_of(receipts[0])), "amount": "50.00"},
    )
    w.post(
        "clients/insertpayment",
        {"receiptNumber": receipts[1], "paymentType": w.pay_type(w.store_of(receipts[1])), "amount": 12.34},
    )

    # a payment on a sale older than the incremental window (last night - lookback days)
    cutoff = last_night - dt.timedelta(days=30)
    old = _pick(
        sandbox,
        lambda s: next(
            t
            for t in sorted(s.transactions.values(), key=lambda t: t.receipt_number)
            if t.status == "Saved"
            and t.local_datetime.date() < cutoff
            and s.clients[t.client_number].ledger.get(t.storecode, 0) > 100  # among the top debtors
        ),
    )
    w.post(
        "clients/insertpayment",
        {"receiptNumber": old.receipt_number, "paymentType": w.pay_type(old.storecode), "amount": "1.00"},
    )

    # a ledger payment by the largest debtor, points earned and redeemed
    debtor, store = _pick(
        sandbox,
        lambda s: max(
            ((c, code) for c in s.clients.values() for code in c.ledger if code in s.stores),
            key=lambda x: x[0].ledger[x[1]],
        ),
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
    holder, pstore = _pick(
        sandbox,
        lambda s: next((c, code) for c in s.iter_clients() for code, p in c.points.items() if p >= 10),
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
    eft_type = _pick(sandbox, lambda s: next(t for t in s.eft_types.values() if t.storecode is None))
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
    return w.done, old


def test_reports_equal_truth_after_a_full_night_and_an_incremental_one(
    fresh_sandbox: Callable[..., RunningSandbox], workspace: Callable[[RunningSandbox], Workspace]
) -> None:
    sandbox = fresh_sandbox(clients=150, stores=7, seed=4, anchor_date=ANCHOR)  # incl. a closed store
    ws = workspace(sandbox)
    night1, night2 = ANCHOR, ANCHOR + dt.timedelta(days=1)

    first = ws.sync(ws.argv(night1))
    assert first.ok, first.describe()
    truth1 = truth.assert_night_exact(sandbox, ws.data_dir, night1)
    assert sum(len(rows) for rows in truth1.values()) > 100  # the truth is not trivially empty
    assert any(r["amount_owed"] > 0 for r in truth1["outstanding_balances_by_store"])

    written, old = make_changes(sandbox, night1)
    assert len(written) >= 20

    second = ws.sync(ws.argv(night2))
    assert second.ok, second.describe()
    assert second.summary_value("mode") == "incremental", second.stdout
    truth2 = truth.assert_night_exact(sandbox, ws.data_dir, night2)
    assert truth2 != truth1  # the writes moved the numbers
    # The payment on a sale older than the incremental window counts as the client's last payment.
    paid_today = sandbox.call(lambda s: s.transactions[old.receipt_number].payments[-1].local_datetime.date())
    row = [
        r
        for r in truth2["top_debtors"]
        if (r["storecode"], r["client_number"]) == (old.storecode, old.client_number)
    ]
    assert row and row[0]["last_payment_date"] == paid_today, row

    # Night 1's snapshot reports are history: unchanged by night 2.
    again = truth.warehouse_reports(ws.data_dir, night1, SNAPSHOT_REPORTS)
    assert truth.report_differences(again, {n: truth1[n] for n in SNAPSHOT_REPORTS}) == []
