"""A business day in the sandbox: what a chain's stores do between two nights.

:func:`run_day` sets the service's clock to the day and makes, through the service's own write
methods (the same ones its HTTP endpoints call, so every rule of the contract holds): sales at
the open stores with their payments (some left owing), ledger payments by debtors, points
earned, freezes and cancellations of EFT memberships, frozen ones coming back, and now and then
a late void at the till of an old sale (no endpoint does that: status and ``lastModified``, as
the contract's change tracking says). Each change is stamped with a time of that day (the same
local date at every store), so a night synced after it sees the day as its business day.

Deterministic: the same service, day and seed give the same writes. Used by ``membersync demo``
(a history of nights) and ``membersync sandbox --days N`` (data that reaches the night served).
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from membersync.extract.sandbox import model as m

# UTC hours the day's writes are spread over: daytime of the same local date in every zone of the
# sandbox's stores (UTC-4 to UTC-10: 09:00-13:00 in Honolulu, 15:00-19:00 in New York)
OPENING_HOURS = (19, 23)
UTC = dt.UTC


@dataclass(frozen=True)
class DayPlan:
    """How busy a day is, per 100 clients (a small chain's ordinary day)."""

    sales: float = 6.0
    ledger_payments: float = 1.5
    points: float = 2.0
    freezes: float = 0.4
    unfreezes: float = 0.3
    cancels: float = 0.25
    late_void_every: int = 7  # a void of an old sale one day in this many


def _count(rng: random.Random, per_100: float, clients: int) -> int:
    expected = per_100 * clients / 100
    whole = int(expected)
    return whole + (1 if rng.random() < expected - whole else 0)


class _Day:
    """One day's writes on one service; the clock moves forward through the day."""

    def __init__(self, service: Any, day: dt.date, rng: random.Random, writes: int) -> None:
        self.s, self.day, self.rng = service, day, rng
        start = dt.datetime.combine(day, dt.time(OPENING_HOURS[0]), UTC)
        self.step = dt.timedelta(hours=OPENING_HOURS[1] - OPENING_HOURS[0]) / max(writes, 1)
        self.at = start
        self.open = sorted(code for code, store in service.stores.items() if store.active)

    def tick(self) -> None:
        self.at += self.step
        moment = self.at
        self.s.clock = lambda: moment

    def clients_at_open_stores(self) -> list[m.Client]:
        return [c for c in self.s.iter_clients() if c.home_store in self.open]

    def employee(self, code: str) -> str:
        return next(e.emp_no for e in self.s.store_employees[code] if e.active)

    def pay_type(self, code: str) -> str:
        return next(p.code for p in self.s.store_payment_types[code] if p.kind in ("CARD", "CASH"))

    def sale(self, client: m.Client) -> None:
        code = client.home_store
        product = self.rng.choice(self.s.store_products[code])
        quantity = 1 + int(self.rng.random() < 0.3)
        line = {"type": "R", "productNumber": product.product_number, "quantity": quantity}
        line |= {
            "pricePerUnit": str(product.price),
            "tax": str((product.price * Decimal("0.05")).quantize(m.CENT)),
        }
        body = {"clientNumber": client.client_number, "storecode": code, "empNo": self.employee(code)}
        receipt = self.s.insert_transaction({**body, "lines": [line]})["receiptNumber"]
        if self.rng.random() < 0.85:  # most sales are paid at the till; the rest go on the ledger
            total = product.price * quantity
            self.s.insert_payment(
                {"receiptNumber": receipt, "paymentType": self.pay_type(code), "amount": str(total)}
            )

    def ledger_payment(self) -> None:
        owing = [
            (c, code)
            for c in self.s.iter_clients()
            for code, b in c.ledger.items()
            if b > 0 and code in self.open
        ]
        if owing:
            client, code = self.rng.choice(owing)
            amount = min(client.ledger[code], m.cents(1000 + self.rng.randrange(9000)))
            body = {"clientNumber": client.client_number, "storecode": code, "amount": str(amount)}
            self.s.post_account_ledger_payment({**body, "paymentType": self.pay_type(code)})

    def points(self, client: m.Client) -> None:
        body = {"clientNumber": client.client_number, "storecode": client.home_store}
        self.s.insert_points({**body, "points": 10 * (1 + self.rng.randrange(10)), "reason": "visit"})

    def memberships(self, status: str) -> list[m.Membership]:
        return sorted(
            (ms for ms in self.s.memberships.values() if ms.is_eft and ms.status == status),
            key=lambda ms: ms.membership_id,
        )

    def change(self, method: str, ms: m.Membership, **extra: str) -> None:
        getattr(self.s, method)({"clientNumber": ms.client_number, "membershipId": ms.membership_id, **extra})

    def late_void(self) -> None:
        """A void at the till of a sale at least a month old: its status and lastModified change."""
        old = [
            t
            for t in self.s.transactions.values()
            if t.status == "Saved" and t.local_datetime.date() < self.day - dt.timedelta(days=30)
        ]
        if old:
            txn = self.rng.choice(sorted(old, key=lambda t: t.receipt_number))
            txn.status = "Voided"
            self.s.touch(self.s.clients[txn.client_number])


def run_day(service: Any, day: dt.date, seed: int, plan: DayPlan = DayPlan()) -> int:
    """Make one business day's writes (see the module's docstring); returns how many were made."""
    rng = random.Random(f"{seed}:{day.isoformat()}")
    clients = len(service.clients)
    counts = {
        "sales": _count(rng, plan.sales, clients),
        "ledger": _count(rng, plan.ledger_payments, clients),
        "points": _count(rng, plan.points, clients),
        "freezes": _count(rng, plan.freezes, clients),
        "unfreezes": _count(rng, plan.unfreezes, clients),
        "cancels": _count(rng, plan.cancels, clients),
    }
    void = day.toordinal() % plan.late_void_every == 0
    work = _Day(service, day, rng, sum(counts.values()) + int(void))
    buyers = work.clients_at_open_stores()
    for _ in range(counts["sales"]):
        work.tick()
        work.sale(rng.choice(buyers))
    for _ in range(counts["ledger"]):
        work.tick()
        work.ledger_payment()
    for _ in range(counts["points"]):
        work.tick()
        work.points(rng.choice(buyers))
    _membership_changes(work, counts)
    if void:
        work.tick()
        work.late_void()
    return sum(counts.values()) + int(void)


def _membership_changes(work: _Day, counts: dict[str, int]) -> None:
    for ms in work.rng.sample(
        work.memberships("Active"), min(counts["freezes"], len(work.memberships("Active")))
    ):
        work.tick()
        work.change("freeze_membership", ms, freezeStartDate=work.day.isoformat())
    for ms in work.memberships("Frozen")[: counts["unfreezes"]]:
        work.tick()
        work.change("unfreeze_membership", ms)
    active = work.memberships("Active")
    for ms in work.rng.sample(active, min(counts["cancels"], len(active))):
        work.tick()
        work.change("cancel_membership", ms, cancelDate=work.day.isoformat())


def run_days(service: Any, first: dt.date, last: dt.date, seed: int) -> int:
    """:func:`run_day` for every day from ``first`` to ``last``; the clock is left at ``last``'s end."""
    made = 0
    day = first
    while day <= last:
        made += run_day(service, day, seed)
        day += dt.timedelta(days=1)
    end = dt.datetime.combine(last, dt.time(OPENING_HOURS[1], 30), UTC)
    service.clock = lambda: end
    return made


def resume_real_time(service: Any, anchor: dt.date) -> None:
    """After days run up to the day before ``anchor``: the real clock again, never before the
    anchor's start, so a change made later is newer than every day's."""
    service.floor = max(service.floor, dt.datetime.combine(anchor, dt.time(), UTC))
    service.clock = lambda: dt.datetime.now(UTC)
