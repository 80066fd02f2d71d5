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
"""

from __future__ import annotations

import bisect
import datetime as dt
import itertools
import math
import random
import zlib
from collections.abc import Callable
from decimal import ROUND_HALF_UP, Decimal

from membersync.extract import catalogue
from membersync.extract.sandbox import model as m
from membersync.extract.sandbox.state import Service, add_months

HISTORY_DAYS = 730

# storecode base, name, city, state, IANA timezone, tax rate (storecodes are padded to 10)
STORES = (
    ("DOWNTOWN", "Downtown Day Spa", "Boston", "MA", "America/New_York", "0.0625"),
    ("LAKESIDE", "Lakeside Wellness", "Chicago", "IL", "America/Chicago", "0.1025"),
    ("DESERT SKY", "Desert Sky Studio", "Phoenix", "AZ", "America/Phoenix", "0.0860"),
    ("HARBOR", "Harbor Spa & Fitness", "San Diego", "CA", "America/Los_Angeles", "0.0775"),
    ("MTNVIEW01", "Mountain View Fitness", "Denver", "CO", "America/Denver", "0.0881"),
    ("ISLAND", "Island Retreat", "Honolulu", "HI", "Pacific/Honolulu", "0.0450"),
    ("NORTHSTAR", "Northstar Athletic", "Anchorage", "AK", "America/Anchorage", "0.0000"),
    ("WESTGATE01", "Westgate Club", "Seattle", "WA", "America/Los_Angeles", "0.1010"),
    ("MIDTOWN", "Midtown Athletic", "New York", "NY", "America/New_York", "0.08875"),
)
INACTIVE_STORE_INDEX = 5  # the 6th store (when there is one) has closed

FIRST = [
    "Ava",
    "Liam",
    "Olivia",
    "Noah",
    "Emma",
    "Oliver",
    "Sophia",
    "Elijah",
    "Isabella",
    "James",
    "Mia",
    "Lucas",
    "Amelia",
    "Mason",
    "Harper",
    "Ethan",
    "Evelyn",
    "Logan",
    "Abigail",
    "Aiden",
    "Emily",
    "Jackson",
    "Ella",
    "Sebastian",
    "Scarlett",
    "Mateo",
    "Grace",
    "Jack",
    "Chloe",
    "Owen",
    "Victoria",
    "Daniel",
    "Riley",
    "Henry",
    "Aria",
    "Wyatt",
    "Lily",
    "Leo",
    "Zoey",
    "Julian",
    "Nora",
    "Levi",
    "Hannah",
    "Isaac",
    "Layla",
    "Gabriel",
    "Zoe",
    "Anthony",
    "Penelope",
    "Dylan",
    "Luna",
    "Caleb",
    "Stella",
    "Ryan",
    "Hazel",
    "Nathan",
    "Aurora",
    "Miles",
    "Ellie",
    "Ezra",
    "Maya",
    "José",
    "Zoë",
    "Siobhán",
    "Renée",
]
LAST = [
    "Smith",
    "Johnson",
    "Williams",
    "Brown",
    "Jones",
    "Garcia",
    "Miller",
    "Davis",
    "Rodriguez",
    "Martinez",
    "Hernandez",
    "Lopez",
    "Gonzalez",
    "Wilson",
    "Anderson",
    "Thomas",
    "Taylor",
    "Moore",
    "Jackson",
    "Martin",
    "Lee",
    "Perez",
    "Thompson",
    "White",
    "Harris",
    "Sanchez",
    "Clark",
    "Ramirez",
    "Lewis",
    "Robinson",
    "Walker",
    "Young",
    "Allen",
    "King",
    "Wright",
    "Scott",
    "Torres",
    "Nguyen",
    "Hill",
    "Flores",
    "Green",
    "Adams",
    "Nelson",
    "Baker",
    "Hall",
    "Rivera",
    "Campbell",
    "Mitchell",
    "Carter",
    "Roberts",
    "O'Brien",
    "D'Angelo",
    "Müller",
    "Van-Dyke",
]
STREETS = [
    "Main St",
    "Oak Ave",
    "Pine Rd",
    "Maple Dr",
    "Cedar Ln",
    "Elm St",
    "Harbor Blvd",
    "Lake Shore Dr",
    "Sunset Ave",
    "1st St",
]

PACKAGES = (  # name, price, sessions, affiliated, store index (None = every store)
    ("Massage 5-pack", "425.00", 5, False, None),
    ("Facial 3-pack", "249.00", 3, False, None),
    ("Personal Training 10", "650.00", 10, False, None),
    ("Couples Massage 4", "780.00", 4, True, None),
    ("Family Swim 20", "199.99", 20, True, None),
    ("Sauna Circle 10", "120.00", 10, True, None),
    ("Yoga Drop-in 12", "144.00", 12, False, None),
    ("Body Wrap 2-pack", "190.50", 2, False, 0),
    ("Pilates Intro 3", "75.00", 3, False, 1),
)
EFT_TYPES = (  # name, monthly dues, enrollment fee, store index
    ("Basic Monthly", "29.99", "49.00", None),
    ("Silver Monthly", "49.99", "49.00", None),
    ("Gold Monthly", "79.99", "99.00", None),
    ("Platinum Monthly", "119.00", "0.00", None),
    ("Family Monthly", "139.50", "149.00", None),
    ("Spa Club Monthly", "89.00", "25.00", 0),
)
NONEFT_TYPES = (  # name, price, term months, store index
    ("Annual Paid in Full", "499.00", 12, None),
    ("6-Month Pass", "279.00", 6, None),
    ("3-Month Pass", "149.00", 3, None),
    ("Summer Pass", "99.00", 3, 1),
)
DEDUCT_TYPES = {
    "MON": "Monthly draft",
    "SEMI": "Semi-monthly draft",
    "QTR": "Quarterly draft",
    "ANN": "Annual draft",
}
DRAW_DAYS = (1, 5, 10, 15, 20, 25)
SKIN_TYPES = {
    "NORMAL": "Normal",
    "DRY": "Dry",
    "OILY": "Oily",
    "COMBINATION": "Combination",
    "SENSITIVE": "Sensitive",
}
WEBDOCS = {
    "W01": "Liability waiver",
    "W02": "Membership agreement",
    "W03": "Health questionnaire",
    "W04": "Freeze request form",
}
PAYMENT_TYPES = (  # code, description, kind
    ("CASH", "Cash", "CASH"),
    ("VISA", "Visa", "CARD"),
    ("MC", "Mastercard", "CARD"),
    ("AMEX", "American Express", "CARD"),
    ("CHECK", "Check", "CHECK"),
    ("GIFT", "Gift certificate", "GIFT"),
    ("ACCT", "On account", "ACCOUNT"),
    ("VOUCH", "Partner voucher", "OTHER"),
)
ROLES = ("Manager", "FrontDesk", "Therapist", "Therapist", "Trainer", "Esthetician", "Therapist")
PRODUCTS = (  # name, price, category
    ("Lavender Body Oil", "24.00", "SKINCARE"),
    ("Hydrating Serum", "58.50", "SKINCARE"),
    ("Yoga Mat", "39.99", "EQUIPMENT"),
    ("Protein Bar", "3.25", "FOOD"),
    ("Water Bottle", "12.00", "ACCESSORY"),
    ("Sunscreen SPF 50", "18.75", "SKINCARE"),
    ("Gift Box", "45.00", "ACCESSORY"),
    ("Massage Candle", "22.00", "HOME"),
    ("Club T-Shirt", "25.00", "APPAREL"),
    ("Resistance Bands", "15.99", "EQUIPMENT"),
)
QUESTIONS: tuple[tuple[str, str, str, list[str]], ...] = (
    ("Q1", "Do you have any allergies?", "TEXT", []),
    ("Q2", "Preferred massage pressure", "CHOICE", ["Light", "Medium", "Firm"]),
    ("Q3", "Are you pregnant?", "YESNO", []),
    ("Q4", "Main skin concern", "CHOICE", ["Acne", "Dryness", "Aging", "None"]),
    ("Q5", "How did you hear about us?", "TEXT", []),
)
EFT_STATUSES = (("Active", 55), ("Frozen", 12), ("OnHold", 6), ("Canceled", 15), ("Expired", 12))
NONEFT_STATUSES = (("Active", 55), ("OnHold", 10), ("Canceled", 10), ("Expired", 25))
POINT_REASONS = ("Purchase", "Bonus", "Referral", "Birthday")
SKIN_CODES = tuple(SKIN_TYPES)
DEDUCT_CODES = tuple(DEDUCT_TYPES)
GIFT_AMOUNTS = tuple(Decimal(a).quantize(m.CENT) for a in ("25", "50", "100", "150"))
MEAN_AGE_SECONDS = 120 * 86400  # mean age of a generated last_modified (most clients changed lately)


def generate(seed: int, clients: int, stores: int, anchor: dt.date, *, max_page_size: int = 500) -> Service:
    """A service with ``clients`` clients at ``stores`` stores, history up to ``anchor``."""
    service = Service(anchor, max_page_size=max_page_size)
    rng = random.Random(seed)
    _configuration(service, rng, stores)
    _Clients(service, rng, seed, clients).generate()
    return service


def _d(text: str) -> Decimal:
    return Decimal(text).quantize(m.CENT)


def _storecode(base: str, index: int) -> str:
    return (base if index < len(STORES) else f"STORE{index + 1:03d}").ljust(10)[:10]


def _configuration(service: Service, rng: random.Random, count: int) -> None:
    for i in range(max(1, count)):
        base, name, city, state, tz, tax = STORES[i % len(STORES)]
        code = _storecode(base, i)
        if i >= len(STORES):
            name = f"{name} {i + 1}"
        service.add_store(m.Store(code, name, city, state, tz, i != INACTIVE_STORE_INDEX, Decimal(tax)))
    codes = list(service.stores)

    def store_of(index: int | None) -> str | None:
        return codes[index] if index is not None and index < len(codes) else None

    for k, (name, price, sessions, affiliated, where) in enumerate(PACKAGES):
        pid = f"PK{101 + k}"
        service.package_types[pid] = m.PackageType(
            pid, name, _d(price), sessions, affiliated, store_of(where)
        )
    for k, (name, dues, fee, where) in enumerate(EFT_TYPES):
        tid = f"E{k + 1:02d}"
        service.eft_types[tid] = m.EftMembershipType(tid, name, _d(dues), _d(fee), store_of(where))
    for k, (name, price, term, where) in enumerate(NONEFT_TYPES):
        tid = f"N{k + 1:02d}"
        service.noneft_types[tid] = m.NonEftMembershipType(tid, name, _d(price), term, store_of(where))
    service.deduct_types.update(DEDUCT_TYPES)
    service.draw_days.update({day: f"Draw on day {day} of the month" for day in DRAW_DAYS})
    service.skin_type_codes.update(SKIN_TYPES)
    service.webdoc_names.update(WEBDOCS)
    for q, text, kind, choices in QUESTIONS:
        service.questions[q] = m.ProfileQuestion(q, text, kind, list(choices))
    for s, code in enumerate(codes):
        types = [m.PaymentType(*p) for p in PAYMENT_TYPES if not (p[0] == "AMEX" and s % 2 == 1)]
        service.store_payment_types[code] = types
        service.store_employees[code] = [
            m.Employee(
                f"{(s + 1) * 100 + k:04d}",
                rng.choice(FIRST),
                rng.choice(LAST),
                code,
                role,
                active=k != len(ROLES) - 1,  # one former employee per store (seen in history only)
            )
            for k, role in enumerate(ROLES)
        ]
        service.store_products[code] = [
            m.Product(f"{s + 1:02d}{k + 1:03d}", name, _d(price), category, code)
            for k, (name, price, category) in enumerate(PRODUCTS)
        ]
        processors = [("POS", "Heartland"), ("EFT", "Authorize.Net")]
        if s % 2 == 0:
            processors.append(("EFT", "Paya"))
        for kind, processor in processors:
            slug = code.strip().lower().replace(" ", "")
            service.credentials.append(
                m.ProcessorCredentials(
                    code,
                    kind,
                    processor,
                    f"{processor[:2].upper()}-{rng.randrange(10**7, 10**8)}",
                    username=f"{kind.lower()}_{slug}_{rng.getrandbits(24):06x}",
                    password=f"pw-{rng.getrandbits(64):016x}",
                    api_key=f"sk_live_{rng.getrandbits(96):024x}",
                )
            )


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
        weights = [max(1, 10 - 2 * i) for i in range(len(self.codes))]  # first stores are busier
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
                other = self.codes[int(rnd() * len(self.codes))]
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
            code = client.home_store if k == 0 or rng.random() < 0.8 else rng.choice(self.codes)
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
        rng, anchor, s, until = draw.rng, self.anchor, self.s, draw.until
        begin = draw.day(draw.start, min(until - dt.timedelta(days=30), begin_by or until))
        end = freeze_start = freeze_end = cancel = None
        draw_day = dues = price = None
        if is_eft:
            eft = s.eft_types[
                rng.choice([t for t in self.eft_ids if s.eft_types[t].storecode in (None, code)])
            ]
            type_id, name, dues = eft.membership_type_id, eft.name, eft.monthly_dues
            draw_day = rng.choice(DRAW_DAYS)
            if status == "Frozen":
                freeze_start = draw.day(max(begin, until - dt.timedelta(days=90)), until)
                if rng.random() >= 0.3:
                    freeze_end = freeze_start + dt.timedelta(days=rng.randrange(30, 120))
            elif status in ("Canceled", "Expired"):
                end = draw.day(begin, until)
                cancel = end if status == "Canceled" else None
        else:
            non = s.noneft_types[
                rng.choice([t for t in self.noneft_ids if s.noneft_types[t].storecode in (None, code)])
            ]
            type_id, name, price = non.membership_type_id, non.name, non.price
            term = non.term_months * 31
            if status in ("Active", "OnHold") and until >= anchor - dt.timedelta(days=term - 10):
                begin = draw.day(max(draw.start, anchor - dt.timedelta(days=term - 10)), until)
            elif status in ("Active", "OnHold"):
                status = "Expired"  # the client's history ends too long ago for a running pass
            if status == "Expired":
                latest = min(until, anchor - dt.timedelta(days=1))
                begin = add_months(latest, -non.term_months) - dt.timedelta(days=rng.randrange(0, 200))
            end = add_months(begin, non.term_months)
            if status == "Canceled":
                cancel = end = draw.day(begin, min(end, until))
        changed = max(begin, freeze_start or begin, cancel or begin, min(end or begin, until))
        return m.Membership(
            membership_id,
            client.client_number,
            type_id,
            name,
            is_eft,
            status,
            code,
            begin,
            end,
            draw_day,
            dues,
            price,
            freeze_start,
            freeze_end,
            cancel,
            self.to_utc(draw.moment(changed), code),
        )

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
            code = client.home_store if rng.random() < 0.85 else rng.choice(self.codes)
            when = draw.moment(draw.day(draw.start, draw.until))
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
                "Voided" if salt % 14 == 3 else "Saved",
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
        client.points[code] = balance

    def to_utc(self, local: dt.datetime, storecode: str) -> dt.datetime:
        return local.replace(tzinfo=self.s.zone(storecode)).astimezone(dt.UTC)


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
