"""Silent changes: the service changes a client without bumping its ``lastModified``.

A real vendor does this (an EFT draw posted by a batch job, a back-office correction), so a
night that discovers clients by ``modifiedSince`` never sees it; the nightly self-audit
(:mod:`membersync.flows.audit`) is what finds it. :func:`change_silently` makes such changes
in the sandbox so the audit can be tested end to end:

==============  ==========================================================================
kind            what changes (the client's ``last_modified`` and the search cache do not)
==============  ==========================================================================
``ledger``      a ledger balance moves by an EFT draw's amount (a store it owes at, or its
                home store)
``membership``  a membership's status is corrected (Active <-> OnHold, anything else -> Active)
``transaction`` a saved sale is voided, or a voided one restored
``points``      a points balance is corrected by a few points
==============  ==========================================================================

Each chosen client gets exactly one change of a kind it can take (rotating through the kinds),
so every client named in the answer really differs from what a sync saw before.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from decimal import Decimal

from membersync.extract.sandbox import model as m
from membersync.extract.sandbox.state import Service

KINDS = ("ledger", "membership", "transaction", "points")
_DRAW = Decimal("39.99")  # a typical EFT dues amount, posted by the "batch job"


@dataclass(frozen=True)
class SilentChange:
    """What changed: the kind, and the storecode, membership id or receipt number it touched."""

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
    for i, number in enumerate(sorted(rng.sample(numbers, n))):
        client = service.client(number)  # holdings filled in: the change must not be lost to a lazy fill
        changed[number] = _change_one(client, KINDS[i % len(KINDS)], rng)
    return changed


def _change_one(client: m.Client, preferred: str, rng: random.Random) -> SilentChange:
    """Apply the preferred kind if the client can take it, else the next one that fits."""
    start = KINDS.index(preferred)
    for kind in KINDS[start:] + KINDS[:start]:
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


_CHANGES = {"ledger": _ledger, "membership": _membership, "transaction": _transaction, "points": _points}
