"""The sandbox's vocabulary and configuration: names, stores, catalogue, statuses and the
stores' shape (the idle store, the closed store, the DST days), from which
:mod:`.population` generates the clients and :mod:`.edge_cases` the reports' edge cases.

:func:`configure` lays the stores, their catalogue and their staff out from these tables; the
tables are data, so changing a name changes the service the sandbox serves, not how it is made.
"""

from __future__ import annotations

import datetime as dt
import random
from decimal import Decimal
from zoneinfo import ZoneInfo

from membersync.extract.sandbox import model as m
from membersync.extract.sandbox.state import Service

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
UNLISTED_STORECODE = "EASTSIDE  "  # a store removed from the store list; balances and memberships remain
ODD_STATUSES = ("Suspended", "Pending")  # membership statuses outside the contract's five
# OnHold as a vendor may spell it: with a space, upper case and an underscore. Both sides read it
# as OnHold (tests/support/truth.py states the interpretation; the staging SQL implements it), and the
# sandbox serves it so that a reading differing between them shows.
SPELLED_STATUSES = ("On Hold", "ON_HOLD")
# A voided sale as a vendor may spell it (enumerations compare case-insensitively): a reading
# that takes only "Voided" for a void counts the others as revenue.
VOIDED_SPELLINGS = ("Voided", "VOIDED", "voided")
# A few clients' points are overdrawn (a redemption of points whose earning sale was refunded):
# a liability counts the positive balances only, and a negative one must not offset it.
OVERDRAWN_POINTS_EVERY = 12
CLOSED_DAYS_AGO = 120  # the closed store's sales end this many days before the anchor
TOP_DEBTORS = 50  # the top_debtors report's cap per store
EDGE_DEBTORS = 56  # debtors at the first store (when there are clients enough): more than the cap
BIG_DEBT = Decimal("4000.00")  # edge-case clients owe at least this at the first store: a top debtor

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
    ("Facial 3-pack", "250.00", 3, False, None),  # 83.33... a session: liability rounds per package
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


def idle_store_index(count: int) -> int | None:
    """The store with no activity at all (a store just opened): the last one, from 3 stores on."""
    return count - 1 if count >= 3 else None


def closed_store_index(count: int) -> int | None:
    """The store closed mid-history (inactive, no sale after :func:`closed_on`): the one before
    the idle store, from 3 stores on."""
    return count - 2 if count >= 3 else None


def closed_on(anchor: dt.date) -> dt.date:
    """The closed store's last business day."""
    return anchor - dt.timedelta(days=CLOSED_DAYS_AGO)


def dst_days(zone: ZoneInfo, on_or_before: dt.date) -> tuple[dt.date | None, dt.date | None]:
    """The latest fall-back and spring-forward days of ``zone`` on or before ``on_or_before``
    (within about a year; ``None`` for a zone without daylight saving time)."""
    fall = spring = None
    day = on_or_before
    for _ in range(400):
        before = dt.datetime.combine(day, dt.time(), zone).utcoffset()
        after = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), zone).utcoffset()
        if before is not None and after is not None:
            if after < before and fall is None:
                fall = day
            elif after > before and spring is None:
                spring = day
        if fall and spring:
            break
        day -= dt.timedelta(days=1)
    return fall, spring


def _d(text: str) -> Decimal:
    return Decimal(text).quantize(m.CENT)


def _storecode(base: str, index: int) -> str:
    return (base if index < len(STORES) else f"STORE{index + 1:03d}").ljust(10)[:10]


def configure(service: Service, rng: random.Random, count: int) -> None:
    _add_stores(service, count)
    codes = list(service.stores)
    _add_catalogue(service, codes)
    # One store after the other, each drawing from ``rng`` in the same order: the same seed
    # gives the same employees and credentials.
    for s, code in enumerate(codes):
        _add_store_setup(service, rng, s, code)


def _add_stores(service: Service, count: int) -> None:
    """``count`` stores (at least one): the named ones first, then numbered copies of them."""
    for i in range(max(1, count)):
        base, name, city, state, tz, tax = STORES[i % len(STORES)]
        code = _storecode(base, i)
        if i >= len(STORES):
            name = f"{name} {i + 1}"
        active = i != closed_store_index(count)
        service.add_store(m.Store(code, name, city, state, tz, active, Decimal(tax)))


def _add_catalogue(service: Service, codes: list[str]) -> None:
    """What the business sells and asks (packages, membership types, lookups, questions); an
    item of one store only names it by index, and is chain-wide where that store does not exist."""

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


def _add_store_setup(service: Service, rng: random.Random, s: int, code: str) -> None:
    """Store ``s``'s payment types (no AMEX at every other store), staff, products and
    payment-processor credentials."""
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
    service.credentials.extend(_processor_credentials(rng, s, code))


def _processor_credentials(rng: random.Random, s: int, code: str) -> list[m.ProcessorCredentials]:
    """A store's payment-processor accounts (a second EFT processor at every other store); their
    username, password and API key are the secrets the client must redact."""
    processors = [("POS", "Heartland"), ("EFT", "Authorize.Net")]
    if s % 2 == 0:
        processors.append(("EFT", "Paya"))
    slug = code.strip().lower().replace(" ", "")
    return [
        m.ProcessorCredentials(
            code,
            kind,
            processor,
            f"{processor[:2].upper()}-{rng.randrange(10**7, 10**8)}",
            username=f"{kind.lower()}_{slug}_{rng.getrandbits(24):06x}",
            password=f"pw-{rng.getrandbits(64):016x}",
            api_key=f"sk_live_{rng.getrandbits(96):024x}",
        )
        for kind, processor in processors
    ]
