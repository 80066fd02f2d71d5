"""Silent changes: the service changes a client without bumping its ``lastModified``.

A real vendor does this (an EFT draw posted by a batch job, a back-office correction), so a
night that discovers clients by ``modifiedSince`` never sees it; the nightly self-audit
(:mod:`membersync.flows.night.audit`) is what finds it. :func:`change_silently` makes such changes
in the sandbox so the audit can be tested end to end. Each kind changes what exactly one of the
audit's compared tables holds, so the audit finds it in that table and no other (its ``ident``
names the row the audit reports, or the field's name for a table keyed by the client alone):

================  ========================  ===============================================================
kind              table it shows in         what changes (``last_modified`` and the search cache do not)
================  ========================  ===============================================================
``ledger``        ``ledger_balances``       a ledger balance moves by an EFT draw's amount (a store it
                                            owes at, or its home store)
``membership``    ``memberships``           a membership's status is corrected (Active <-> OnHold,
                                            anything else -> Active)
``transaction``   ``transactions``          a saved sale is voided, or a voided one restored
``points``        ``points_balances``       a points balance is corrected by a few points
``client``        ``clients``               the skin type on file is corrected (a field of the client
                                            record that is not personal)
``identity``      ``client_identity``       the phone number is corrected (a personal field: it lands,
                                            and is compared, as the identity's digest only)
``package``       ``client_packages``       an owned package's sessions remaining are corrected (never
                                            one shared through a membership: its sharees would see it)
``comm_prefs``    ``comm_prefs``            a communication preference is flipped
``billing``       ``billing_accounts``      a card's expiry moves on (an account updater), else the
                                            account's deduct type changes (never a secret field)
``line``          ``transaction_lines``     a sale line's description is corrected
``payment``       ``transaction_payments``  a card payment's brand is corrected (VISA <-> MC, AMEX -> VISA)
``points_event``  ``points_transactions``   an earned points transaction's reason is reclassified
================  ========================  ===============================================================

Each chosen client gets exactly one change, of the kind used least so far that it can take
(ties in :data:`KINDS` order), so ``n >= len(KINDS)`` clients usually see every kind and every
client named in the answer really differs from what a sync saw before. No kind
touches a secret (billing tokens, account numbers) or the search summary's fields.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from decimal import Decimal

from membersync.extract.sandbox import model as m
from membersync.extract.sandbox.data import DEDUCT_CODES, POINT_REASONS, SKIN_CODES
from membersync.extract.sandbox.state import Service

KINDS = (
    "ledger",
    "membership",
    "transaction",
    "points",
    "client",
    "identity",
    "package",
    "comm_prefs",
    "billing",
    "line",
    "payment",
    "points_event",
)
_DRAW = Decimal("39.99")  # a typical EFT dues amount, posted by the "batch job"
_BRANDS = {"VISA": "MC", "MC": "VISA", "AMEX": "VISA"}  # card payment types every store takes
_CORRECTED = " (corrected)"


@dataclass(frozen=True)
class SilentChange:
    """What changed: the kind, and what it touched: the storecode, membership id, receipt
    number, package, billing account, ``receipt/line``, payment or points transaction id, or
    (for a table keyed by the client alone) the field's name."""

    kind: str
    ident: str


def change_silently(service: Service, n: int, seed: int) -> dict[str, SilentChange]:
    """Change ``n`` clients (seeded choice) without touching ``lastModified``; client -> change.

    Call it on the sandbox's loop thread (``running.call(lambda s: change_silently(s, 30, 7))``)
    so no request sees a half-made change.
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    numbers = sorted(service.clients)
    if n > len(numbers):
        raise ValueError(f"cannot change {n} clients: the sandbox has {len(numbers)}")
    rng = random.Random(seed)
    changed: dict[str, SilentChange] = {}
    used = dict.fromkeys(KINDS, 0)
    for number in sorted(rng.sample(numbers, n)):
        client = service.client(number)  # holdings filled in: the change must not be lost to a lazy fill
        change = _change_one(client, sorted(KINDS, key=lambda k: (used[k], KINDS.index(k))), rng)
        used[change.kind] += 1
        changed[number] = change
    return changed


def _change_one(client: m.Client, kinds: list[str], rng: random.Random) -> SilentChange:
    """Apply the first of ``kinds`` the client can take."""
    for kind in kinds:
        ident = _CHANGES[kind](client, rng)
        if ident is not None:
            return SilentChange(kind, ident)
    raise AssertionError("a ledger change always applies")  # pragma: no cover


# Each change returns what it touched, or None when the client has nothing of that kind.


def _ledger(client: m.Client, rng: random.Random) -> str | None:
    # An EFT draw posted at a store the client already has a ledger at (else its home store).
    stores = sorted(client.ledger) or [client.home_store]
    store = rng.choice(stores)
    client.ledger[store] = client.ledger.get(store, m.ZERO) + _DRAW
    return store


def _membership(client: m.Client, rng: random.Random) -> str | None:
    if not client.memberships:
        return None
    ms = rng.choice(client.memberships)
    ms.status = {"Active": "OnHold", "OnHold": "Active"}.get(ms.status, "Active")
    return ms.membership_id


def _transaction(client: m.Client, rng: random.Random) -> str | None:
    if not client.transactions:
        return None
    txn = rng.choice(client.transactions)
    txn.status = "Saved" if txn.voided else "Voided"
    return txn.receipt_number


def _points(client: m.Client, rng: random.Random) -> str | None:
    if not client.points:
        return None
    store = rng.choice(sorted(client.points))
    client.points[store] += rng.randint(1, 50)
    return store


def _client(client: m.Client, rng: random.Random) -> str | None:
    client.skin_type = rng.choice([code for code in SKIN_CODES if code != client.skin_type])
    return "skinType"


def _identity(client: m.Client, rng: random.Random) -> str | None:
    # A new line at the same exchange: the last four digits move on (never to the same four).
    last4 = client.phone[-4:]
    moved = (int(last4) if last4.isdigit() else 0) + rng.randint(1, 9_999)
    client.phone = (client.phone[:-4] if last4.isdigit() else client.phone + "-") + f"{moved % 10_000:04d}"
    return "phone"


def _package(client: m.Client, rng: random.Random) -> str | None:
    owned = [p for p in client.packages if p.membership_id is None]  # not shared with anyone
    if not owned:
        return None
    package = rng.choice(owned)
    package.sessions_remaining += -1 if package.sessions_remaining > 0 else 1
    return package.client_package_id


def _comm_prefs(client: m.Client, rng: random.Random) -> str | None:
    if not client.comm_prefs:
        return None
    name = rng.choice(sorted(client.comm_prefs))
    client.comm_prefs[name] = not client.comm_prefs[name]
    return name


def _billing(client: m.Client, rng: random.Random) -> str | None:
    if not client.billing_accounts:
        return None
    account = rng.choice(client.billing_accounts)
    if account.exp_year is not None:
        account.exp_year += rng.randint(1, 3)
    else:
        account.deduct_type = rng.choice([c for c in DEDUCT_CODES if c != account.deduct_type])
    return account.billing_account_id


def _line(client: m.Client, rng: random.Random) -> str | None:
    lines = [(t, line) for t in client.transactions for line in t.lines]
    if not lines:
        return None
    txn, line = rng.choice(lines)
    text = line.description
    line.description = text.removesuffix(_CORRECTED) if text.endswith(_CORRECTED) else text + _CORRECTED
    return f"{txn.receipt_number}/{line.line_no}"


def _payment(client: m.Client, rng: random.Random) -> str | None:
    payments = [p for t in client.transactions for p in t.payments if p.payment_type in _BRANDS]
    if not payments:
        return None
    payment = rng.choice(payments)
    payment.payment_type = _BRANDS[payment.payment_type]
    return payment.payment_id


def _points_event(client: m.Client, rng: random.Random) -> str | None:
    earned = [t for t in client.points_transactions if t.points > 0]
    if not earned:
        return None
    txn = rng.choice(earned)
    txn.reason = rng.choice([r for r in POINT_REASONS if r != txn.reason])
    return txn.points_transaction_id


_CHANGES = {
    "ledger": _ledger,
    "membership": _membership,
    "transaction": _transaction,
    "points": _points,
    "client": _client,
    "identity": _identity,
    "package": _package,
    "comm_prefs": _comm_prefs,
    "billing": _billing,
    "line": _line,
    "payment": _payment,
    "points_event": _points_event,
}
