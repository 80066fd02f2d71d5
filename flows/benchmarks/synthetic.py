"""A synthetic history for benchmarks of the warehouse build (no HTTP, no sandbox).

``N`` clients, ``M`` nights, a daily change rate: night 1 lands every client (a full night);
each later night lands the clients that changed that day (``rate`` of them, drawn at random),
each with its whole current state and its **whole** transaction and points history (what a
sync does by default), so the landed volume per night is what production lands. Changes are
what a business sees: a new sale with a payment, a balance that moves, a membership that
freezes, cancels or comes back, points earned, and now and then a late correction (a void of
an old sale). Everything is written through the real landing zone (:func:`write_night`), so
the build reads what a sync lands.

    python -m membersync.flows.benchmarks.synthetic DATA_DIR --clients 5000 --nights 90 --rate 0.05

Deterministic: the same arguments give the same landing zone (rows, not file names).

:func:`write_night` lands any rows as one committed night, typed by the tables' Arrow schemas
(``membersync.models.tables``); the warehouse's tests land their hand-written nights with it:

    write_night(data_dir, date(2026, 1, 1), {
        "stores": [{"storecode": "DOWNTOWN  ", "name": "Downtown"}],
        "synced_clients": [{"client_number": "000417"}],
        "ledger_balances": [{"client_number": "000417", "storecode": "DOWNTOWN  ",
                             "balance": Decimal("12.50")}],
    })

Rows are dicts of Python values (``Decimal`` for money, ``date``/``datetime`` for dates); a
column a row does not give is null.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
from membersync.models.tables import TABLES, TYPED_QUARANTINE_SCHEMA
from membersync.models.tables import table as typed_table
from membersync.warehouse.landing.manifest import Manifest
from membersync.warehouse.landing.paths import DataDir

STORES = ("DOWNTOWN  ", "UPTOWN    ", "AIRPORT   ", "MALL      ", "SUBURB    ")
STATUSES = ("Active", "Active", "Active", "Frozen", "OnHold", "Canceled", "Expired")
LINE_TYPES = ("R", "P", "M", "1", "G")
FIRST_NIGHT = dt.date(2026, 1, 1)
BATCH = 250  # clients per batch, as a night's default (MEMBERSYNC_BATCH_SIZE)
CENT = Decimal("0.01")


@dataclass
class Sale:
    receipt: str
    when: dt.datetime
    storecode: str
    status: str
    lines: list[tuple[str, int, Decimal]]  # (type, quantity, price per unit)


# The package list: (package id, price, sessions). 100.00 / 3 is 33.33... a session: the
# liability rounds per package.
PACKAGE_LIST = (("PK1", Decimal("425.00"), 5), ("PK2", Decimal("100.00"), 3), ("PK3", Decimal("650.00"), 10))
PACKAGE_DAYS = 365  # a package expires this many days after it was bought


@dataclass
class Package:
    client_package_id: str
    package_id: str
    bought: dt.date
    sessions_total: int
    sessions_remaining: int


@dataclass
class Client:
    number: str
    store: str
    is_eft: bool
    status: str
    balance: Decimal
    points: int
    sales: list[Sale] = field(default_factory=list)
    points_events: list[tuple[str, dt.datetime, int]] = field(default_factory=list)
    packages: list[Package] = field(default_factory=list)
    last_modified: dt.datetime = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


class History:
    """The service's state, changed night by night; :meth:`night_rows` is what a night lands."""

    def __init__(self, clients: int, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        # packages draw from a stream of their own: the other tables' rows stay as they were
        self.package_rng = random.Random(seed + 1)
        self.receipts = 0
        self.clients = [self._new_client(i) for i in range(1, clients + 1)]

    def _new_client(self, i: int) -> Client:
        rng = self.rng
        client = Client(
            number=f"{i:06d}",
            store=STORES[i % len(STORES)],
            is_eft=rng.random() < 0.7,
            status=rng.choice(STATUSES),
            balance=Decimal(rng.randint(-5000, 20000)) * CENT,
            points=rng.randint(-50, 900),
        )
        for _ in range(rng.randint(0, 4)):  # some history before the first night
            self._sell(client, FIRST_NIGHT - dt.timedelta(days=rng.randint(1, 365)))
        if self.package_rng.random() < 0.4:
            self._buy_package(client, FIRST_NIGHT - dt.timedelta(days=self.package_rng.randint(1, 300)))
        return client

    def _buy_package(self, client: Client, day: dt.date) -> None:
        package_id, _, sessions = self.package_rng.choice(PACKAGE_LIST)
        number = f"CP{client.number}-{len(client.packages) + 1}"
        used = self.package_rng.randint(0, sessions - 1) if day < FIRST_NIGHT else 0
        client.packages.append(Package(number, package_id, day, sessions, sessions - used))

    def _use_packages(self, client: Client, night: dt.date) -> None:
        """Now and then a session used, or a package bought: packages also expire, a date passing."""
        prng = self.package_rng
        roll = prng.random()
        usable = [
            p
            for p in client.packages
            if p.sessions_remaining and night - p.bought <= dt.timedelta(PACKAGE_DAYS)
        ]
        if roll < 0.3 and usable:
            prng.choice(usable).sessions_remaining -= 1
        elif roll < 0.4:
            self._buy_package(client, night)

    def _sell(self, client: Client, day: dt.date) -> None:
        rng = self.rng
        self.receipts += 1
        when = dt.datetime.combine(day, dt.time(rng.randint(8, 20), rng.randint(0, 59)))
        lines = [
            (rng.choice(LINE_TYPES), rng.randint(1, 3), Decimal(rng.randint(100, 15000)) * CENT)
            for _ in range(rng.randint(1, 3))
        ]
        client.sales.append(Sale(f"R{self.receipts:09d}", when, client.store, "Saved", lines))
        client.points_events.append((f"P{self.receipts:09d}", when, rng.randint(1, 50)))

    def change(self, client: Client, night: dt.date) -> None:
        """One day's change of a client (it is then synced that night)."""
        rng = self.rng
        roll = rng.random()
        if roll < 0.6:
            self._sell(client, night)
        elif roll < 0.7 and client.sales:
            rng.choice(client.sales).status = "Voided"  # a late correction of an old sale
        elif roll < 0.85:
            client.status = rng.choice(STATUSES)
        client.balance += Decimal(rng.randint(-3000, 3000)) * CENT
        client.points += rng.randint(-20, 40)
        self._use_packages(client, night)
        client.last_modified = dt.datetime.combine(night, dt.time(1, 0), tzinfo=dt.UTC)

    def night_rows(self, night: dt.date, synced: list[Client]) -> dict[str, list[dict[str, Any]]]:
        rows: dict[str, list[dict[str, Any]]] = {
            "stores": [
                {"storecode": s, "name": s.strip().title(), "timezone": "America/New_York", "active": True}
                for s in STORES
            ],
            "eft_draw_days": [{"day": d, "description": f"day {d}"} for d in (1, 15)],
            "sellable_packages": [
                {"package_id": pid, "name": f"Package {pid}", "price": price, "sessions": sessions}
                for pid, price, sessions in PACKAGE_LIST
            ],
        }
        for client in synced:
            for table, table_rows in _client_rows(client).items():
                rows.setdefault(table, []).extend(table_rows)
        return rows


def _client_rows(c: Client) -> dict[str, list[dict[str, Any]]]:
    """Every row a sync lands for one client, by table: its current state, then its **whole**
    sales and points history (the key order is the tables' order in a night)."""
    return {**_state_rows(c), **_sale_rows(c), "points_transactions": _points_rows(c)}


def _state_rows(c: Client) -> dict[str, list[dict[str, Any]]]:
    """The client's current state: identity, balances, membership, billing, preferences."""
    n = c.number
    i = int(n)
    return {
        "synced_clients": [{"client_number": n, "home_store": c.store, "last_modified": c.last_modified}],
        "clients": [
            {
                "client_number": n,
                "first_name": f"First{i}",
                "last_name": f"Last{i}",
                "home_store": c.store,
                "last_modified": c.last_modified,
            }
        ],
        "ledger_balances": [{"client_number": n, "storecode": c.store, "balance": c.balance}],
        "memberships": [_membership_row(c)],
        "points_balances": [{"client_number": n, "storecode": c.store, "points": c.points}],
        "billing_accounts": (
            [{"client_number": n, "billing_account_id": f"B{n}", "membership_id": f"M{n}", "type": "CARD"}]
            if c.is_eft
            else []
        ),
        "comm_prefs": [{"client_number": n, "email": True, "sms": i % 2 == 0}],
        "client_packages": [
            {
                "client_number": n,
                "client_package_id": p.client_package_id,
                "package_id": p.package_id,
                "name": f"Package {p.package_id}",
                "storecode": c.store,
                "purchase_date": p.bought,
                "expiration_date": p.bought + dt.timedelta(days=PACKAGE_DAYS),
                "sessions_total": p.sessions_total,
                "sessions_remaining": p.sessions_remaining,
            }
            for p in c.packages
        ],
    }


def _membership_row(c: Client) -> dict[str, Any]:
    """The client's one membership: billed monthly (EFT, on day 1 or 15) or paid in full."""
    n = c.number
    return {
        "client_number": n,
        "membership_id": f"M{n}",
        "membership_type_id": "EFT1" if c.is_eft else "PIF",
        "name": "Gold",
        "is_eft": c.is_eft,
        "status": c.status,
        "storecode": c.store,
        # joined over the three years before the history (no draw from the random stream)
        "start_date": dt.date(2023, 1, 1) + dt.timedelta(days=int(n) * 37 % 1095),
        "draw_day": (1, 15)[int(n) % 2] if c.is_eft else None,
        "monthly_dues": Decimal("39.99") if c.is_eft else None,
        "price": None if c.is_eft else Decimal("499.00"),
    }


def _sale_rows(c: Client) -> dict[str, list[dict[str, Any]]]:
    """Every sale of the client: its transaction, its lines (8 % tax) and one payment of the total."""
    n = c.number
    return {
        "transactions": [
            {
                "client_number": n,
                "receipt_number": s.receipt,
                "transaction_date": s.when,
                "storecode": s.storecode,
                "emp_no": "E1",
                "status": s.status,
            }
            for s in c.sales
        ],
        "transaction_lines": [
            {
                "client_number": n,
                "receipt_number": s.receipt,
                "line_no": k,
                "type": t,
                "quantity": q,
                "price_per_unit": p,
                "amount": p * q,
                "tax": (p * q * Decimal("0.08")).quantize(CENT),
            }
            for s in c.sales
            for k, (t, q, p) in enumerate(s.lines, start=1)
        ],
        "transaction_payments": [
            {
                "client_number": n,
                "receipt_number": s.receipt,
                "payment_id": f"Y{s.receipt}",
                "payment_type": "VISA",
                "amount": sum((p * q for _, q, p in s.lines), start=Decimal("0.00")),
                "date": s.when,
            }
            for s in c.sales
        ],
    }


def _points_rows(c: Client) -> list[dict[str, Any]]:
    return [
        {
            "client_number": c.number,
            "points_transaction_id": pid,
            "date": when,
            "storecode": c.store,
            "points": points,
            "reason": "sale",
        }
        for pid, when, points in c.points_events
    ]


def generate(
    data_dir: DataDir,
    clients: int,
    nights: int,
    rate: float = 0.05,
    *,
    seed: int = 7,
    first_night: dt.date = FIRST_NIGHT,
    start: int = 0,
    history: History | None = None,
    land: bool = True,
) -> History:
    """Land nights ``start`` .. ``nights - 1`` (night 0 = ``first_night``, full); return the history
    so that a caller can land more nights later (``start=nights``, ``history=...``). ``land=False``
    replays the nights without writing (the history of a data dir landed earlier, same seed)."""
    history = history or History(clients, seed)
    for index in range(start, nights):
        night = first_night + dt.timedelta(days=index)
        if index == 0:
            synced = history.clients
        else:
            synced = history.rng.sample(history.clients, max(1, round(rate * clients)))
            for client in synced:
                history.change(client, night)
        if land:
            land_night(data_dir, history, night, synced, full=index == 0)
    return history


def land_night(
    data_dir: DataDir, history: History, night: dt.date, synced: list[Client], *, full: bool
) -> None:
    """Land one night: ``synced`` clients with their whole state, through the real landing zone,
    in batches of :data:`BATCH` clients as a sync lands them (one file per table and batch)."""
    write_night(
        data_dir,
        night,
        history.night_rows(night, sorted(synced, key=lambda c: c.number)),
        mode="full" if full else "incremental",
        watermark=f"{night.isoformat()}T01:00:00Z",
        parts=-(-len(synced) // BATCH),
    )


# --- landing any rows as a committed night ---------------------------------------------------------


def write_night(
    data_dir: DataDir,
    night: dt.date,
    rows: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    mode: str = "full",
    parts: int = 1,
    watermark: str | None = None,
    quarantine: Sequence[Mapping[str, Any]] = (),
) -> Manifest:
    """Land ``rows`` (table name -> rows) as the committed night ``night``; return its manifest.

    Written by the real landing zone (:class:`~membersync.warehouse.landing.zone.LandingZone`):
    ``parts`` batches, each table's rows split over them in order, then the commit. Every
    declared table is in the manifest (empty ones with no file and 0 rows). ``quarantine`` rows
    follow ``TYPED_QUARANTINE_SCHEMA`` (table_name, client_number, reason, raw). Unknown tables or
    columns are an error.
    """
    from membersync.warehouse.landing.zone import LandingZone

    unknown = set(rows) - {t.name for t in TABLES}
    if unknown:
        raise KeyError(f"unknown landed table(s) {sorted(unknown)}")
    parts = max(1, parts)
    chunks = {t.name: _split(list(rows.get(t.name, ())), parts) for t in TABLES}
    zone = LandingZone(data_dir)
    with zone.lock():
        open_night = zone.open_night(night, mode)
        open_night.expect_clients(r["client_number"] for r in rows.get("synced_clients", ()))
        for index in range(parts):
            tables = {name: _arrow_rows(name, chunk[index]) for name, chunk in chunks.items()}
            bad = (
                pa.Table.from_pylist([dict(r) for r in quarantine], schema=TYPED_QUARANTINE_SCHEMA)
                if index == 0
                else None
            )
            open_night.write_batch(f"b{index:05d}", tables, bad)
        return open_night.commit(watermark, len(rows.get("synced_clients", ())), {"synthetic": True})


def _arrow_rows(table_name: str, rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Rows as an Arrow table of the typed table's schema (unknown keys are an error); the
    landing zone lands them (keys for client numbers, identity apart)."""
    schema = typed_table(table_name).schema
    for row in rows:
        unknown = set(row) - set(schema.names)
        if unknown:
            raise KeyError(f"{table_name}: unknown column(s) {sorted(unknown)}")
    return pa.Table.from_pylist([dict(row) for row in rows], schema=schema)


def _split(rows: list[Mapping[str, Any]], parts: int) -> list[list[Mapping[str, Any]]]:
    """``parts`` consecutive chunks (some maybe empty), in order."""
    size = -(-len(rows) // parts) if rows else 0
    return [rows[i * size : (i + 1) * size] for i in range(parts)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--clients", type=int, default=5000)
    parser.add_argument("--nights", type=int, default=30)
    parser.add_argument("--rate", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    generate(DataDir(args.data_dir.resolve()), args.clients, args.nights, args.rate, seed=args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
