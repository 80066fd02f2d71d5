"""The management reports' edge cases in the sandbox's data (see :mod:`.population`'s docstring
for the list): planned when the clients' cores exist, added to a client's holdings when it is filled.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable
from decimal import ROUND_HALF_UP, Decimal
from typing import Protocol

from membersync.extract import catalogue
from membersync.extract.sandbox import model as m
from membersync.extract.sandbox.data import (
    BIG_DEBT,
    DRAW_DAYS,
    EDGE_DEBTORS,
    ODD_STATUSES,
    SPELLED_STATUSES,
    TOP_DEBTORS,
    UNLISTED_STORECODE,
    dst_days,
)
from membersync.extract.sandbox.state import Service
from membersync.extract.sandbox.validation import add_months


class Population(Protocol):
    """What the edge cases read of the clients being generated (:class:`.population._Clients`)."""

    s: Service
    anchor: dt.date
    codes: list[str]
    numbers: list[str]
    owners: dict[int, list[str]]
    until: dict[str, dt.date]
    products: dict[str, list[m.Product]]
    pay_codes: dict[str, list[str]]
    staff: dict[str, list[str]]
    eft_ids: list[str]
    noneft_ids: list[str]

    def history_start(self, client: m.Client) -> dt.date: ...


class EdgeCases:
    """The reports' edge cases (see the module docstring), planned eagerly, filled in lazily.

    The plan picks its clients in client order among those that take no part in the forced
    coverage or in a shared package, sets their ledgers (and, for the DST client, an earlier
    ``last_modified``: its history ends on the DST day, so the DST sale is its newest), then
    fills the first store up to :data:`EDGE_DEBTORS` debtors and ties ranks 49 to 52. Holdings
    (memberships, sales) are added when the client is filled, after the generated ones.
    """

    def __init__(self, gen: Population, rng: random.Random) -> None:
        self.gen, self.s, self.rng = gen, gen.s, rng
        self.first = gen.codes[0]
        self.extra: dict[str, list[Callable[[m.Client], None]]] = {}
        sharing = {gen.numbers[i] for i in gen.owners} | {n for v in gen.owners.values() for n in v}
        forced = len(catalogue.MEMBERSHIP_STATUSES)
        self.free = [n for n in gen.numbers[forced:] if n not in sharing]
        self.plan_dst()
        self.plan_unlisted()
        self.plan_odd_statuses()
        self.plan_late_payment()
        self.plan_debtors()

    def fill(self, client: m.Client) -> None:
        for add in self.extra.get(client.client_number, ()):
            add(client)

    def take(self, fits: Callable[[m.Client, dt.date, dt.date], bool]) -> m.Client | None:
        """The first free client whose history (start, until) fits, no longer free."""
        for number in self.free:
            client = self.s.clients[number]
            if fits(client, self.gen.history_start(client), self.gen.until[number]):
                self.free.remove(number)
                return client
        return None

    def later(self, client: m.Client, add: Callable[[m.Client], None]) -> None:
        self.extra.setdefault(client.client_number, []).append(add)

    # --- the plan (eager) ----------------------------------------------------------------------

    def plan_dst(self) -> None:
        fall, spring = dst_days(self.s.zone(self.first), self.gen.anchor - dt.timedelta(days=20))
        if fall is None or spring is None:
            return
        earliest, latest = min(fall, spring), max(fall, spring)
        client = self.take(lambda c, start, until: c.created_date < earliest - dt.timedelta(days=30))
        if client is None:
            return
        # the client's history ends on the later DST day: its 23:30 sale there is its newest
        self.gen.until[client.client_number] = latest
        client.last_modified = dt.datetime.combine(latest + dt.timedelta(days=3), dt.time(12), dt.UTC)
        client.ledger[self.first] = BIG_DEBT + Decimal("321.09")
        self.later(client, lambda c: self.dst_sales(c, fall, spring))

    def plan_unlisted(self) -> None:
        owing = self.take(lambda c, start, until: True)
        in_credit = self.take(lambda c, start, until: True)
        member = self.take(lambda c, start, until: (until - start).days >= 60)
        if owing is None or in_credit is None or member is None:
            return
        owing.ledger[UNLISTED_STORECODE] = Decimal("9999.99")  # would top every store if it counted
        in_credit.ledger[UNLISTED_STORECODE] = Decimal("-25.00")
        member.ledger[self.first] = BIG_DEBT + Decimal("210.50")  # a top debtor: its memberships show
        self.later(member, self.unlisted_membership)

    def plan_odd_statuses(self) -> None:
        client = self.take(lambda c, start, until: (until - start).days >= 60)
        if client is not None:
            client.ledger[self.first] = BIG_DEBT + Decimal("100.25")
            self.later(client, self.odd_memberships)

    def plan_late_payment(self) -> None:
        client = self.take(lambda c, start, until: (until - start).days >= 240)
        if client is not None:
            client.ledger[self.first] = BIG_DEBT + Decimal("55.55")
            self.later(client, self.late_payment)

    def plan_debtors(self) -> None:
        """More than 50 debtors at the first store and a tie straddling the 50th place."""
        code = self.first
        owing = [c for c in self.s.clients.values() if c.ledger.get(code, m.ZERO) > 0]
        others = [c for c in self.s.clients.values() if code not in c.ledger]
        if len(owing) + len(others) < EDGE_DEBTORS:
            return  # too few clients for the case
        self.rng.shuffle(others)
        for client in others[: max(0, EDGE_DEBTORS - len(owing))]:
            client.ledger[code] = m.cents(100 + self.rng.randrange(49900))
            owing.append(client)
        owing.sort(key=lambda c: (-c.ledger[code], c.client_number))
        tie = owing[TOP_DEBTORS - 2].ledger[code]
        for client in owing[TOP_DEBTORS - 1 : TOP_DEBTORS + 2]:  # ranks 50 to 52 join rank 49
            client.ledger[code] = tie

    # --- the holdings (lazy) -------------------------------------------------------------------

    def sale(
        self,
        client: m.Client,
        suffix: int,
        when: dt.datetime,
        style: m.WireStyle,
        paid: dt.datetime | None = None,
    ) -> m.Transaction:
        """A one-line retail sale at the first store, paid in full at ``paid`` (default: at once)."""
        code = self.first
        receipt = f"{client.client_number}{suffix:03d}"
        product = self.gen.products[code][suffix % len(self.gen.products[code])]
        tax = (product.price * self.s.stores[code].tax_rate).quantize(m.CENT, ROUND_HALF_UP)
        line = m.TransactionLine(
            1, "R", product.product_number, product.name, 1, product.price, product.price, tax
        )
        staff = self.gen.staff[code][0]
        txn = m.Transaction(receipt, client.client_number, code, staff, when, "Saved", [line], [], style)
        pay_code = self.gen.pay_codes[code][0]
        txn.payments.append(m.Payment(f"PY{receipt}1", pay_code, txn.total, paid or when))
        self.s.add_transaction(txn)
        return txn

    def dst_sales(self, client: m.Client, fall: dt.date, spring: dt.date) -> None:
        at = dt.datetime.combine
        moments: list[tuple[dt.datetime, m.WireStyle]] = [
            (at(fall, dt.time(1, 30)), "utc"),  # the first 01:30 (daylight time)
            (at(fall, dt.time(1, 30, fold=1)), "offset"),  # the second 01:30 (standard time)
            (at(fall, dt.time(23, 30)), "utc"),  # the next day in UTC
            (at(spring, dt.time(1, 59, 59)), "local"),  # the last second before the clocks jump
            (at(spring, dt.time(3, 0)), "offset"),  # the first second after
            (at(spring, dt.time(23, 30)), "utc"),
        ]
        for k, (when, style) in enumerate(moments):
            self.sale(client, 901 + k, when, style)

    def unlisted_membership(self, client: m.Client) -> None:
        start = self.gen.history_start(client)
        eft = self.s.eft_types[self.gen.eft_ids[0]]
        zone = self.s.zone(client.home_store)  # the unlisted store's zone is unknown
        changed = dt.datetime.combine(start, dt.time(10), zone).astimezone(dt.UTC)
        membership_id = f"M{client.client_number}-9"
        self.s.add_membership(
            m.Membership(
                membership_id,
                client.client_number,
                eft.membership_type_id,
                eft.name,
                True,
                "Active",
                UNLISTED_STORECODE,
                start,
                None,
                DRAW_DAYS[2],
                eft.monthly_dues,
                None,
                None,
                None,
                None,
                changed,
            )
        )

    def odd_memberships(self, client: m.Client) -> None:
        start = self.gen.history_start(client)
        zone = self.s.zone(client.home_store)
        changed = dt.datetime.combine(start, dt.time(11), zone).astimezone(dt.UTC)
        eft = self.s.eft_types[self.gen.eft_ids[1]]
        non = self.s.noneft_types[self.gen.noneft_ids[0]]
        statuses, eft_or_not = (*ODD_STATUSES, *SPELLED_STATUSES), (True, False, True, False)
        for suffix, status, is_eft in zip((7, 8, 17, 18), statuses, eft_or_not, strict=True):
            self.s.add_membership(
                m.Membership(
                    f"M{client.client_number}-{suffix}",
                    client.client_number,
                    eft.membership_type_id if is_eft else non.membership_type_id,
                    eft.name if is_eft else non.name,
                    is_eft,
                    status,
                    client.home_store,
                    start,
                    None if is_eft else add_months(start, non.term_months),
                    DRAW_DAYS[0] if is_eft else None,
                    eft.monthly_dues if is_eft else None,
                    None if is_eft else non.price,
                    None,
                    None,
                    None,
                    changed,
                )
            )

    def late_payment(self, client: m.Client) -> None:
        """A sale on the first day of the history, paid on its last day at 21:30 (after any
        generated moment, so it is the client's newest payment at the first store)."""
        start, until = self.gen.history_start(client), self.gen.until[client.client_number]
        sold = dt.datetime.combine(start, dt.time(10))
        self.sale(client, 900, sold, "local", paid=dt.datetime.combine(until, dt.time(21, 30)))
