"""Deterministic synthetic data: the same (seed, clients, stores, anchor) gives the same service.

History spans about two years before the anchor date; every generated ``last_modified`` is
before the anchor's start (UTC), so a change made later is always newer. The data covers
what the contract says a client must cope with: storecodes with trailing and inner spaces,
client numbers with leading zeros, memberships in every status (EFT and non-EFT), ledgers
owed / in credit / zero (some clients at several stores), points, packages shared through an
affiliated membership (owner client *i* shares with the clients right after it), transactions
of every type with taxed lines and payments (some voided, some datetimes written with an offset
or as UTC), billing accounts of both types, secrets in credentials and billing accounts.

Some coverage is forced on the first clients (client *i* < 5 gets a membership in status
``MEMBERSHIP_STATUSES[i]``; client 0 owns a shared package) so that even a tiny sandbox shows
every case. Clients' cores come from one ``random.Random(seed)`` in a fixed order; what each
client holds is filled in on first use from a stream of its own (see :class:`_Clients`), which
keeps start-up fast at 100,000 clients.

The management reports' edge cases are generated too (:class:`~.edge_cases.EdgeCases`; the end-to-end truth
tests rely on them), whenever the sandbox is big enough for the case:

- with 3 stores or more, the last store has no activity at all (no client, balance, membership,
  sale or points; :func:`~.data.idle_store_index`) and the one before it closed mid-history: inactive in
  the store list, no sale after :func:`~.data.closed_on` (:func:`~.data.closed_store_index`);
- more than 50 debtors at the first store and a tie at the 50th place (equal balances at ranks
  49 to 52, so the tie-break by client number decides), when there are clients enough;
- balances (owed and in credit) and an Active EFT membership at :data:`~.data.UNLISTED_STORECODE`, a
  storecode outside the store list;
- memberships in statuses outside the contract's five (:data:`~.data.ODD_STATUSES`);
- sales and payments at local times on the first store's latest fall-back and spring-forward days
  (:func:`~.data.dst_days`): 01:30 twice on the fall-back day (before and after the clocks go back),
  01:59:59 and 03:00:00 around the spring-forward, 23:30 on both days written as UTC (the next
  day in UTC);
- a payment made months after its sale (a sale older than any lookback window paid late).
"""

from __future__ import annotations

import bisect
import datetime as dt
import itertools
import math
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from membersync.extract import catalogue
from membersync.extract.sandbox import model as m
from membersync.extract.sandbox.data import (
    DEDUCT_CODES,
    DRAW_DAYS,
    EFT_STATUSES,
    FIRST,
    GIFT_AMOUNTS,
    HISTORY_DAYS,
    LAST,
    MEAN_AGE_SECONDS,
    NONEFT_STATUSES,
    OVERDRAWN_POINTS_EVERY,
    POINT_REASONS,
    SKIN_CODES,
    STREETS,
    VOIDED_SPELLINGS,
    closed_on,
    closed_store_index,
    configure,
    idle_store_index,
)
from membersync.extract.sandbox.edge_cases import EdgeCases
from membersync.extract.sandbox.state import Service
from membersync.extract.sandbox.validation import add_months


def generate(seed: int, clients: int, stores: int, anchor: dt.date, *, max_page_size: int = 500) -> Service:
    """A service with ``clients`` clients at ``stores`` stores, history up to ``anchor``."""
    service = Service(anchor, max_page_size=max_page_size)
    rng = random.Random(seed)
    configure(service, rng, stores)
    _Clients(service, rng, seed, clients).generate()
    return service


class _Clients:
    """Makes every client's core eagerly (fast) and fills in its holdings lazily.

    The core (demographics, ``last_modified``, communication preferences, ledger, and who
    shares a package with whom) comes from the shared stream ``rng`` in client order. The
    holdings (memberships, billing accounts, packages, transactions, points) come from a
    stream of the client's own (``seed``, client index), so filling them on first use gives
    the same data whatever the order of requests. Every holding's date is at least two days
    before the client's generated ``last_modified`` (which therefore stays the newest change).
    """

    def __init__(self, service: Service, rng: random.Random, seed: int, count: int) -> None:
        self.s = service
        self.rng = rng
        self.seed = seed
        self.count = count
        self.anchor = service.anchor
        self.anchor_ordinal = service.anchor.toordinal()
        self.codes = list(service.stores)
        idle = idle_store_index(len(self.codes))
        # random store choices never land on the idle store; home stores neither (weight 0)
        self.busy = [c for k, c in enumerate(self.codes) if k != idle]
        closed = closed_store_index(len(self.codes))
        self.closed = self.codes[closed] if closed is not None else None
        self.closed_on = closed_on(service.anchor)
        weights = [0 if k == idle else max(1, 10 - 2 * k) for k in range(len(self.codes))]  # first: busier
        self.cum_weights = list(itertools.accumulate(weights))
        width = max(6, len(str(10 + count * 7)))
        numbers, n = [], 10
        for _ in range(count):
            n += rng.randrange(1, 8)
            numbers.append(str(n).zfill(width))
        self.numbers = numbers
        self.index: dict[str, int] = {}
        self.until: dict[str, dt.date] = {}  # last day a generated holding of the client may have
        self.owners: dict[int, list[str]] = {}  # owner index -> the clients it shares a package with
        self.products = {c: service.store_products[c] for c in self.codes}
        self.pay_codes = {
            c: [p.code for p in service.store_payment_types[c] if p.kind != "ACCOUNT"] for c in self.codes
        }
        self.staff = {c: [e.emp_no for e in service.store_employees[c]] for c in self.codes}
        self.eft_ids = list(service.eft_types)
        self.noneft_ids = list(service.noneft_types)
        self.plain_packages = [p for p in service.package_types.values() if not p.affiliated]
        self.affiliated_packages = [p for p in service.package_types.values() if p.affiliated]

    # --- the cores (eager) ------------------------------------------------------------------

    def generate(self) -> None:
        rnd = self.rng.random
        for i, number in enumerate(self.numbers):
            self.core(i, number, rnd)
        # before the shares: an edge case may move a client's last_modified (and its history's end)
        self.edges = EdgeCases(self, random.Random(self.seed * 2_000_003 + 11))
        for owner, sharees in self.owners.items():
            self.plan_shares(owner, sharees)
        self.s.filler = self.fill

    def core(self, i: int, number: str, rnd: Callable[[], float]) -> None:
        s = self.s
        home = self.codes[bisect.bisect(self.cum_weights, rnd() * self.cum_weights[-1])]
        store = s.stores[home]
        first, last = FIRST[int(rnd() * len(FIRST))], LAST[int(rnd() * len(LAST))]
        days_ago = 20 + int(rnd() * (HISTORY_DAYS + 380))
        created = dt.date.fromordinal(self.anchor_ordinal - days_ago)
        # last_modified: mostly recent, never within 3 days of creation, always before the anchor.
        age = min(1 + int(-math.log(1.0 - rnd()) * MEAN_AGE_SECONDS), (days_ago - 3) * 86400)
        last_modified = s.floor - dt.timedelta(seconds=age)
        birth = None if rnd() < 0.1 else dt.date.fromordinal(self.anchor_ordinal - 6600 - int(rnd() * 22400))
        client = m.Client(
            client_number=number,
            first_name=first,
            last_name=last,
            email=f"{first}.{last}{i}@example.com".lower().replace("'", ""),
            phone=f"555-{200 + int(rnd() * 800)}-{int(rnd() * 10000):04d}",
            birth_date=birth,
            gender="F" if (g := rnd()) < 0.55 else "M" if g < 0.95 else "X",
            address1=f"{1 + int(rnd() * 9998)} {STREETS[int(rnd() * len(STREETS))]}",
            city=store.city,
            state=store.state,
            postal_code=f"{1000 + int(rnd() * 98999):05d}",
            home_store=home,
            referred_by=self.numbers[int(rnd() * i)] if i and rnd() < 0.08 else None,
            skin_type=SKIN_CODES[int(rnd() * len(SKIN_CODES))] if rnd() < 0.7 else None,
            created_date=created,
            last_modified=last_modified,
            comm_prefs={
                "email": rnd() < 0.8,
                "sms": rnd() < 0.5,
                "mail": rnd() < 0.3,
                "phone": rnd() < 0.4,
                "marketing": rnd() < 0.45,
            },
            filled=False,
        )
        if rnd() >= 0.1:  # 10% have no ledger at all
            client.ledger[home] = self.balance(rnd)
            if rnd() < 0.12 and len(self.codes) > 1:
                other = self.busy[int(rnd() * len(self.busy))]
                client.ledger.setdefault(other, self.balance(rnd))
        s.add_client(client)
        self.index[number] = i
        # the last day a holding may have: two days before last_modified (whatever the store's offset)
        until_days_ago = max(2 + (age + 86399) // 86400, 0)
        self.until[number] = max(dt.date.fromordinal(self.anchor_ordinal - until_days_ago), created)
        if i == 0 or (i >= len(catalogue.MEMBERSHIP_STATUSES) and rnd() < 0.08):
            self.owners[i] = self.numbers[i + 1 : i + 2 + int(rnd() * 3)]

    @staticmethod
    def balance(rnd: Callable[[], float]) -> Decimal:
        roll = rnd()
        if roll < 0.45:
            return m.ZERO
        if roll < 0.8:
            return m.cents(100 + int(rnd() * 49900))  # owed
        return -m.cents(100 + int(rnd() * 14900))  # credit

    def plan_shares(self, owner: int, sharees: list[str]) -> None:
        """Owner ``owner``'s first membership shares its affiliated package with ``sharees``."""
        number = self.numbers[owner]
        membership_id = f"M{number}-1"
        self.s.shares.setdefault(membership_id, {})
        start = self.history_start(self.s.clients[number])
        for sharee in sharees:
            last = min(self.until[number], self.until[sharee])
            first = max(start, self.s.clients[sharee].created_date)
            back = dt.timedelta(days=int(self.rng.random() * 60))
            if last >= first:  # both clients existed (and changed later): the share fits in their histories
                self.s.share(membership_id, sharee, max(first, last - back))

    def history_start(self, client: m.Client) -> dt.date:
        """First day of the client's generated history: the last two years, or the year before its
        last change when that is older (a client idle for years still had a history)."""
        start = max(client.created_date, self.anchor - dt.timedelta(days=HISTORY_DAYS))
        until = self.until[client.client_number]
        return start if start <= until else max(client.created_date, until - dt.timedelta(days=365))

    # --- the holdings (lazy) ------------------------------------------------------------------

    def fill(self, client: m.Client) -> None:
        number = client.client_number
        i = self.index[number]
        rng = random.Random(self.seed * 1_000_003 + i)
        start, until = self.history_start(client), self.until[number]
        draw = _Draw(rng, start, until)
        self.memberships(i, client, draw)
        self.packages(client, draw)
        if i in self.owners:
            self.affiliated_package(client, draw)
        self.transactions(client, draw)
        self.points(client, draw)
        self.edges.fill(client)

    def memberships(self, i: int, client: m.Client, draw: _Draw) -> None:
        rng = draw.rng
        forced = i < len(catalogue.MEMBERSHIP_STATUSES)
        count = 1 if forced or i in self.owners else rng.choices((0, 1, 2), (35, 50, 15))[0]
        for k in range(count):
            if forced:
                status = catalogue.MEMBERSHIP_STATUSES[i]
                is_eft = status != "Expired" or i % 2 == 0
            elif k == 0 and i in self.owners:
                status, is_eft = "Active", True
            else:
                is_eft = rng.random() < 0.65
                table = EFT_STATUSES if is_eft else NONEFT_STATUSES
                status = rng.choices([t[0] for t in table], [t[1] for t in table])[0]
            code = client.home_store if k == 0 or rng.random() < 0.8 else rng.choice(self.busy)
            membership_id = f"M{client.client_number}-{k + 1}"
            shared = self.s.shares.get(membership_id)  # an owner's membership began before its first share
            begin_by = min(shared.values()) if shared else None
            ms = self.membership(client, membership_id, code, is_eft, status, draw, begin_by)
            self.s.add_membership(ms)
            if is_eft and ms.status != "Expired":
                self.billing(client, ms, k + 1, rng)

    def membership(
        self,
        client: m.Client,
        membership_id: str,
        code: str,
        is_eft: bool,
        status: str,
        draw: _Draw,
        begin_by: dt.date | None = None,
    ) -> m.Membership:
        until = draw.until
        begin = draw.day(draw.start, min(until - dt.timedelta(days=30), begin_by or until))
        terms = (self._eft_terms if is_eft else self._noneft_terms)(code, status, begin, draw)
        # its last change: the latest of its dates, up to the end of the client's history
        changed = max(
            terms.begin,
            terms.freeze_start or terms.begin,
            terms.cancel or terms.begin,
            min(terms.end or terms.begin, until),
        )
        return m.Membership(
            membership_id,
            client.client_number,
            terms.type_id,
            terms.name,
            is_eft,
            terms.status,
            code,
            terms.begin,
            terms.end,
            terms.draw_day,
            terms.dues,
            terms.price,
            terms.freeze_start,
            terms.freeze_end,
            terms.cancel,
            self.to_utc(draw.moment(changed), code),
        )

    def _eft_terms(self, code: str, status: str, begin: dt.date, draw: _Draw) -> _Terms:
        """A monthly-billed membership: a type sold at ``code``, a draw day, and the freeze or
        end its status implies."""
        rng, s, until = draw.rng, self.s, draw.until
        eft = s.eft_types[rng.choice([t for t in self.eft_ids if s.eft_types[t].storecode in (None, code)])]
        terms = _Terms(eft.membership_type_id, eft.name, status, begin, dues=eft.monthly_dues)
        terms.draw_day = rng.choice(DRAW_DAYS)
        if status == "Frozen":
            terms.freeze_start = draw.day(max(begin, until - dt.timedelta(days=90)), until)
            if rng.random() >= 0.3:
                terms.freeze_end = terms.freeze_start + dt.timedelta(days=rng.randrange(30, 120))
        elif status in ("Canceled", "Expired"):
            terms.end = draw.day(begin, until)
            terms.cancel = terms.end if status == "Canceled" else None
        return terms

    def _noneft_terms(self, code: str, status: str, begin: dt.date, draw: _Draw) -> _Terms:
        """A paid-in-full pass of a fixed term: a running one began within its term of the anchor
        (or it has expired), an expired one ended before it."""
        rng, anchor, s, until = draw.rng, self.anchor, self.s, draw.until
        non = s.noneft_types[
            rng.choice([t for t in self.noneft_ids if s.noneft_types[t].storecode in (None, code)])
        ]
        term = non.term_months * 31
        if status in ("Active", "OnHold") and until >= anchor - dt.timedelta(days=term - 10):
            begin = draw.day(max(draw.start, anchor - dt.timedelta(days=term - 10)), until)
        elif status in ("Active", "OnHold"):
            status = "Expired"  # the client's history ends too long ago for a running pass
        if status == "Expired":
            latest = min(until, anchor - dt.timedelta(days=1))
            begin = add_months(latest, -non.term_months) - dt.timedelta(days=rng.randrange(0, 200))
        terms = _Terms(non.membership_type_id, non.name, status, begin, price=non.price)
        terms.end = add_months(begin, non.term_months)
        if status == "Canceled":
            terms.cancel = terms.end = draw.day(begin, min(terms.end, until))
        return terms

    def billing(self, client: m.Client, ms: m.Membership, k: int, rng: random.Random) -> None:
        account = m.BillingAccount(
            f"BA{client.client_number}-{k}",
            client.client_number,
            ms.membership_id,
            "CARD" if rng.random() < 0.7 else "CHECKING",
            rng.choice(DEDUCT_CODES),
        )
        if account.type == "CARD":
            account.last_four = f"{rng.randrange(10000):04d}"
            account.exp_month = rng.randrange(1, 13)
            account.exp_year = self.anchor.year + rng.randrange(0, 5)
            account.token_id = f"tok_{rng.getrandbits(64):016x}"
            account.vault_token = f"vlt_{rng.getrandbits(64):016x}" if rng.random() < 0.5 else None
        else:
            account.account_no = str(rng.randrange(10**7, 10**12))
            account.routing_no = str(rng.randrange(10**8, 10**9))
        self.s.add_billing_account(account)

    def packages(self, client: m.Client, draw: _Draw) -> None:
        rng = draw.rng
        if rng.random() >= 0.3:
            return
        ptype = rng.choice(self.plain_packages)
        bought = draw.day(draw.start, draw.until)
        client.packages.append(
            m.ClientPackage(
                f"CP{client.client_number}-1",
                client.client_number,
                ptype.package_id,
                ptype.name,
                ptype.storecode or client.home_store,
                bought,
                bought + dt.timedelta(days=365),
                ptype.sessions,
                rng.randrange(ptype.sessions + 1),
            )
        )

    def affiliated_package(self, client: m.Client, draw: _Draw) -> None:
        """The owner's package shared through its first (Active EFT) membership."""
        rng = draw.rng
        ms = client.memberships[0]
        shared = self.s.shares[ms.membership_id]
        bought = max(min([*shared.values(), ms.start_date + dt.timedelta(days=10)]), ms.start_date)
        ptype = rng.choice(self.affiliated_packages)
        package = m.ClientPackage(
            f"CP{client.client_number}-A",
            client.client_number,
            ptype.package_id,
            ptype.name,
            ms.storecode,
            bought,
            bought + dt.timedelta(days=365),
            ptype.sessions,
            rng.randrange(ptype.sessions + 1),
            membership_id=ms.membership_id,
        )
        client.packages.append(package)
        self.s.affiliated[ms.membership_id] = package

    def transactions(self, client: m.Client, draw: _Draw) -> None:
        rng, s = draw.rng, self.s
        count = rng.choice((0, 0, 1, 1, 2, 2, 3, 3, 4, 5, 6, 8))
        for k in range(1, count + 1):
            code = client.home_store if rng.random() < 0.85 else rng.choice(self.busy)
            when = draw.moment(draw.day(draw.start, draw.until))
            if code == self.closed and when.date() > self.closed_on:  # the store had closed by then
                code = client.home_store if client.home_store != self.closed else self.busy[0]
            receipt = f"{client.client_number}{k:03d}"
            lines = [
                self.line(client, code, receipt, n + 1, rng) for n in range(rng.choice((1, 1, 1, 2, 2, 3)))
            ]
            salt = zlib.crc32(receipt.encode())
            txn = m.Transaction(
                receipt,
                client.client_number,
                code,
                rng.choice(self.staff[code]),
                when,
                VOIDED_SPELLINGS[salt % 3] if salt % 14 == 3 else "Saved",
                lines,
                [],
                "offset" if salt % 10 == 4 else "utc" if salt % 20 == 9 else "local",
            )
            self.payments(txn, rng)
            s.add_transaction(txn)

    def line(
        self, client: m.Client, code: str, receipt: str, line_no: int, rng: random.Random
    ) -> m.TransactionLine:
        s = self.s
        kind = rng.choices(catalogue.TRANSACTION_TYPES, (40, 15, 15, 15, 10))[0]
        if kind in ("M", "1") and not client.memberships:
            kind = "R"
        quantity, tax_rate = 1, m.ZERO
        if kind == "R":
            product = rng.choice(self.products[code])
            ref, description, price = product.product_number, product.name, product.price
            quantity, tax_rate = rng.choice((1, 1, 1, 2, 3)), s.stores[code].tax_rate
        elif kind == "P":
            ptype = rng.choice(self.plain_packages)
            ref, description, price = ptype.package_id, ptype.name, ptype.price
        elif kind in ("M", "1"):
            ms = rng.choice(client.memberships)
            ref = ms.membership_id
            if ms.is_eft:
                eft = s.eft_types[ms.membership_type_id]
                price = eft.enrollment_fee if kind == "M" else eft.monthly_dues
            else:
                price = ms.price or m.ZERO
            description = ms.name if kind == "M" else f"{ms.name} fee"
        else:
            ref = f"GC{receipt}{line_no}"
            price = GIFT_AMOUNTS[rng.randrange(len(GIFT_AMOUNTS))]
            description = f"Gift certificate {ref}"
        amount = price * quantity
        tax = (amount * tax_rate).quantize(m.CENT, ROUND_HALF_UP)
        return m.TransactionLine(line_no, kind, ref, description, quantity, price, amount, tax)

    def payments(self, txn: m.Transaction, rng: random.Random) -> None:
        total = txn.total
        roll = rng.random()
        if roll < 0.15 or total <= 0:
            return  # charged to the account
        codes = self.pay_codes[txn.storecode]
        if roll < 0.25 and total >= Decimal("2.00"):
            first = (total / 2).quantize(m.CENT)
            parts = [first, total - first]
        else:
            parts = [total]
        for p, part in enumerate(parts, 1):
            txn.payments.append(
                m.Payment(f"PY{txn.receipt_number}{p}", rng.choice(codes), part, txn.local_datetime)
            )

    def points(self, client: m.Client, draw: _Draw) -> None:
        rng = draw.rng
        if rng.random() >= 0.4:
            return
        code = client.home_store
        moments = sorted(draw.moment(draw.day(draw.start, draw.until)) for _ in range(rng.randrange(1, 7)))
        receipts = [t.receipt_number for t in client.transactions if t.storecode == code and not t.voided]
        balance = 0
        for k, when in enumerate(moments, 1):
            if balance >= 100 and rng.random() < 0.3:
                points, reason, receipt = -rng.randrange(50, balance + 1), "Redemption", None
            else:
                points, reason = rng.randrange(10, 500), rng.choice(POINT_REASONS)
                receipt = rng.choice(receipts) if receipts and reason == "Purchase" else None
            balance += points
            client.points_transactions.append(
                m.PointsTransaction(
                    f"PT{client.client_number}{k:03d}",
                    client.client_number,
                    when,
                    code,
                    points,
                    reason,
                    receipt,
                )
            )
        if balance > 0 and zlib.crc32(client.client_number.encode()) % OVERDRAWN_POINTS_EVERY == 5:
            overdraft = -(balance + 25)
            client.points_transactions.append(
                m.PointsTransaction(
                    f"PT{client.client_number}{len(moments) + 1:03d}",
                    client.client_number,
                    moments[-1],
                    code,
                    overdraft,
                    "Redemption",
                    None,
                )
            )
            balance += overdraft
        client.points[code] = balance

    def to_utc(self, local: dt.datetime, storecode: str) -> dt.datetime:
        return local.replace(tzinfo=self.s.zone(storecode)).astimezone(dt.UTC)


@dataclass
class _Terms:
    """A membership's type, status and dates as drawn, before it becomes an ``m.Membership``."""

    type_id: str
    name: str
    status: str
    begin: dt.date
    end: dt.date | None = None
    draw_day: int | None = None  # EFT only
    dues: Decimal | None = None  # EFT only
    price: Decimal | None = None  # non-EFT only
    freeze_start: dt.date | None = None
    freeze_end: dt.date | None = None
    cancel: dt.date | None = None


class _Draw:
    """Random dates and store-local moments within one client's history window."""

    def __init__(self, rng: random.Random, start: dt.date, until: dt.date) -> None:
        self.rng, self.start, self.until = rng, start, max(start, until)

    def day(self, first: dt.date, last: dt.date) -> dt.date:
        span = (last - first).days
        return first + dt.timedelta(days=self.rng.randrange(span + 1)) if span > 0 else first

    def moment(self, day: dt.date) -> dt.datetime:
        """A store-local datetime in opening hours (8:00-20:59, never in a DST gap)."""
        r = self.rng.randrange(13 * 3600)
        return dt.datetime(day.year, day.month, day.day, 8 + r // 3600, (r // 60) % 60, r % 60)
