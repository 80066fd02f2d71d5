"""A month (and some) of simulated nights for the morning reports, and their truth in plain Python.

The nights are landed through the real landing zone
(:func:`membersync.flows.benchmarks.synthetic.write_night`),
deterministically (seeded). Each night a few clients change: freezes, unfreezes, holds,
cancellations, expiries, upgrades, downgrades, new memberships, a move to another store, payments
(some to zero or credit), new debt, a ledger row that vanishes, sales, a late void; the changed
clients land their whole state (what a sync does). The truth is computed from the rows landed
(``Scenario.landed``), never from SQL: a client's state as of night N = its rows of its newest
synced night <= N.

Nights: three sparse nights months before (so debts can age past 30, 60 and 90 days), then every
day from 2026-02-01 to 2026-03-07 (a month boundary, a week and a month to compare with).
Storecodes: two busy stores, a listed store with nothing, a store listed only from 2026-02-20 whose
membership exists before (an unlisted storecode until then), and a storecode never listed.
"""

from __future__ import annotations

import calendar
import datetime as dt
import random
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from membersync.flows.benchmarks.synthetic import write_night
from membersync.warehouse.landing.paths import DataDir

D = Decimal
DOWNTOWN = "DOWNTOWN  "
UPTOWN = "UPTOWN    "
QUIET = "QUIET     "  # listed, nothing ever happens there
LATE = "LATE-OPEN "  # listed from LATE_LISTED on; a membership is there before
GHOST = "GHOST     "  # never listed; an active EFT membership is there
LATE_LISTED = dt.date(2026, 2, 20)
NAMES = {DOWNTOWN: "Downtown", UPTOWN: "Uptown", QUIET: "Quiet corner", LATE: "Late opening"}
NIGHTS: tuple[dt.date, ...] = (  # 13 months: a rolling 12 months is whole, and not 11
    dt.date(2025, 3, 17),
    dt.date(2025, 5, 19),
    dt.date(2025, 10, 20),
    dt.date(2025, 11, 24),
    dt.date(2025, 12, 29),
    *(dt.date(2026, 2, 1) + dt.timedelta(days=i) for i in range(35)),
)
RAW_STATUS = {  # normalised -> spellings the vendor uses (the truth normalises them back)
    "active": ("Active", "active", " ACTIVE "),
    "frozen": ("Frozen", "frozen"),
    "on_hold": ("OnHold", "on hold", "ON_HOLD"),
    "canceled": ("Canceled",),
    "expired": ("Expired",),
    "other": ("Suspended",),
}
DUES = (D("19.99"), D("29.99"), D("49.50"), D("79.00"), D("0.10"))
CENT = D("0.01")


@dataclass
class Membership:
    membership_id: str
    storecode: str
    status: str  # normalised
    is_eft: bool
    dues: Decimal
    start: dt.date = NIGHTS[0]


@dataclass
class Sale:
    receipt: str
    when: dt.datetime
    storecode: str
    voided: bool
    lines: list[Decimal]


@dataclass
class Client:
    number: str
    store: str
    memberships: list[Membership] = field(default_factory=list)
    ledger: dict[str, Decimal] = field(default_factory=dict)
    sales: list[Sale] = field(default_factory=list)


class Simulation:
    def __init__(self, seed: int = 14) -> None:
        self.rng = random.Random(seed)
        self.ids = 0
        self.receipts = 0
        self.clients: list[Client] = []
        for i in range(1, 31):
            self._new_client(i, NIGHTS[0])
        ghost = self.clients[0]
        ghost.memberships.append(Membership(self._id(), GHOST, "active", True, D("35.00")))
        ghost.ledger[GHOST] = D("12.34")

    def _id(self) -> str:
        self.ids += 1
        return f"M{self.ids:05d}"

    def _new_client(self, i: int, night: dt.date) -> Client:
        rng = self.rng
        client = Client(number=f"{i:06d}", store=(DOWNTOWN, UPTOWN)[i % 2])
        for _ in range(rng.choice((0, 1, 1, 2))):
            status = rng.choice(("active", "active", "active", "frozen", "on_hold", "canceled", "other"))
            client.memberships.append(
                Membership(self._id(), client.store, status, rng.random() < 0.75, rng.choice(DUES))
            )
            # joined up to 20 months before the first night (a new client: within the last 20 days)
            back = (self.ids * 53) % (600 if night == NIGHTS[0] else 20)
            client.memberships[-1].start = night - dt.timedelta(days=back)
        client.ledger[client.store] = (
            D(rng.choice((0, 0, 1, 2, 5, 40, -3))) * D(rng.randint(100, 9999)) * CENT
        )
        if rng.random() < 0.3:
            other = UPTOWN if client.store == DOWNTOWN else DOWNTOWN
            client.ledger[other] = D(rng.randint(1, 20000)) * CENT
        self.clients.append(client)
        return client

    def _sell(self, client: Client, night: dt.date) -> None:
        self.receipts += 1
        lines = [D(self.rng.randint(100, 20000)) * CENT for _ in range(self.rng.randint(1, 3))]
        when = dt.datetime.combine(night, dt.time(self.rng.randint(6, 21), self.rng.choice((0, 15, 59))))
        client.sales.append(Sale(f"R{self.receipts:06d}", when, client.store, False, lines))

    def change(self, client: Client, night: dt.date) -> None:
        """One to three of the things a business sees, on one client."""
        rng = self.rng
        for _ in range(rng.randint(1, 3)):
            event = rng.choice(
                (
                    "freeze", "unfreeze", "hold", "cancel", "expire", "upgrade", "downgrade", "new",
                    "move", "payment", "debt", "debt", "vanish", "sale", "sale", "void", "flip_eft",
                )
            )  # fmt: skip
            active = [m for m in client.memberships if m.status == "active"]
            paused = [m for m in client.memberships if m.status in ("frozen", "on_hold", "other")]
            if event == "freeze" and active:
                rng.choice(active).status = "frozen"
            elif event == "hold" and active:
                rng.choice(active).status = "on_hold"
            elif event == "unfreeze" and paused:
                rng.choice(paused).status = "active"
            elif event == "cancel" and (active or paused):
                rng.choice(active or paused).status = "canceled"
            elif event == "expire" and active:
                rng.choice(active).status = "expired"
            elif event == "upgrade" and active:
                rng.choice(active).dues += rng.choice((D("10.00"), D("0.01"), D("25.50")))
            elif event == "downgrade" and active:
                m = rng.choice(active)
                m.dues = max(D("0.01"), m.dues - rng.choice((D("5.00"), D("0.01"), D("20.00"))))
            elif event == "new":
                client.memberships.append(
                    Membership(
                        self._id(), client.store, "active", rng.random() < 0.8, rng.choice(DUES), night
                    )
                )
            elif event == "move" and [m for m in active if m.storecode in (DOWNTOWN, UPTOWN)]:
                m = rng.choice([m for m in active if m.storecode in (DOWNTOWN, UPTOWN)])
                m.storecode = UPTOWN if m.storecode == DOWNTOWN else DOWNTOWN
            elif event == "payment" and client.ledger:
                store = rng.choice(sorted(client.ledger))
                balance = client.ledger[store]
                client.ledger[store] = rng.choice(
                    (D(0), balance - D(rng.randint(1, 5000)) * CENT, D("-5.00"))
                )
            elif event == "debt":
                store = rng.choice((client.store, client.store, UPTOWN, DOWNTOWN))
                client.ledger[store] = client.ledger.get(store, D(0)) + D(rng.randint(1, 30000)) * CENT
            elif event == "vanish" and len(client.ledger) > 1:
                del client.ledger[rng.choice(sorted(client.ledger))]
            elif event == "sale":
                self._sell(client, night)
            elif event == "void" and client.sales:
                rng.choice(client.sales).voided = True
            elif event == "flip_eft" and active:
                m = rng.choice(active)
                m.is_eft = not m.is_eft

    def rows(self, night: dt.date, synced: list[Client]) -> dict[str, list[dict[str, Any]]]:
        rng = self.rng
        stores = [DOWNTOWN, UPTOWN, QUIET] + ([LATE] if night >= LATE_LISTED else [])
        out: dict[str, list[dict[str, Any]]] = defaultdict(list)
        out["stores"] = [{"storecode": s, "name": NAMES[s]} for s in stores]
        for c in synced:
            out["synced_clients"].append({"client_number": c.number, "home_store": c.store})
            out["clients"].append(
                {
                    "client_number": c.number,
                    "first_name": "Client",
                    "last_name": c.number,
                    "home_store": c.store,
                }
            )
            for store, balance in sorted(c.ledger.items()):
                out["ledger_balances"].append(
                    {"client_number": c.number, "storecode": store, "balance": balance}
                )
            for m in c.memberships:
                out["memberships"].append(
                    {
                        "client_number": c.number,
                        "membership_id": m.membership_id,
                        "name": "Monthly",
                        "is_eft": m.is_eft,
                        "status": rng.choice(RAW_STATUS[m.status]),
                        "storecode": m.storecode,
                        "start_date": m.start,
                        "monthly_dues": m.dues,
                    }
                )
            for s in c.sales:
                out["transactions"].append(
                    {
                        "client_number": c.number,
                        "receipt_number": s.receipt,
                        "transaction_date": s.when,
                        "storecode": s.storecode,
                        "status": "Voided" if s.voided else "Saved",
                    }
                )
                for n, amount in enumerate(s.lines, start=1):
                    out["transaction_lines"].append(
                        {
                            "client_number": c.number,
                            "receipt_number": s.receipt,
                            "line_no": n,
                            "type": "R",
                            "quantity": 1,
                            "price_per_unit": amount,
                            "amount": amount,
                            "tax": D("0.00"),
                        }
                    )
        return dict(out)


@dataclass
class Scenario:
    landed: dict[dt.date, dict[str, list[dict[str, Any]]]]
    quarantined: dict[dt.date, int]


def simulate(seed: int = 14) -> Scenario:
    """The rows of every night (deterministic), not yet landed."""
    sim = Simulation(seed)
    landed: dict[dt.date, dict[str, list[dict[str, Any]]]] = {}
    for index, night in enumerate(NIGHTS):
        if index == 0:
            synced = list(sim.clients)
            for c in synced:
                if sim.rng.random() < 0.5:
                    sim._sell(c, night - dt.timedelta(days=sim.rng.randint(0, 20)))
        else:
            synced = sim.rng.sample(sim.clients, sim.rng.randint(3, 7))
            for c in synced:
                sim.change(c, night)
            if index % 6 == 0:  # a new client
                synced.append(sim._new_client(len(sim.clients) + 1, night))
            if index == 10:  # a membership at the store listed later
                c = sim.clients[1]
                c.memberships.append(Membership(sim._id(), LATE, "active", True, D("55.55"), night))
                synced.append(c)
            if index in (3, 4):  # a debt settled on 2025-11-24, owed from 2025-12-29: 90 days old on 02-22
                c = sim.clients[3]
                c.ledger[c.store] = D("0.00") if index == 3 else D("90.90")
                synced.append(c)
            if index == 25:  # the never-listed store's membership is canceled
                next(m for m in sim.clients[0].memberships if m.storecode == GHOST).status = "canceled"
                synced.append(sim.clients[0])
        unique = list({c.number: c for c in synced}.values())
        landed[night] = sim.rows(night, unique)
    return Scenario(landed, {NIGHTS[-1]: 2})


def land(data_dir: DataDir, scenario: Scenario, nights: tuple[dt.date, ...] | None = None) -> None:
    for night in nights or tuple(scenario.landed):
        quarantine = [
            {"table_name": "memberships", "client_number": "000001", "reason": "bad date", "raw": "{}"}
            for _ in range(scenario.quarantined.get(night, 0))
        ]
        write_night(data_dir, night, scenario.landed[night], quarantine=quarantine)


# --------------------------------------------------------------------------------------------
# The truth, from the landed rows
# --------------------------------------------------------------------------------------------


def normalise(status: str) -> str:
    key = status.strip().lower().replace(" ", "").replace("_", "").replace("-", "")
    return {"active": "active", "frozen": "frozen", "onhold": "on_hold", "canceled": "canceled"}.get(
        key, "expired" if key == "expired" else "other"
    )


class Truth:
    def __init__(self, scenario: Scenario) -> None:
        self.landed = scenario.landed
        self.nights = sorted(self.landed)
        self._states: dict[dt.date, dict[str, dict[str, list[dict[str, Any]]]]] = {}

    def stores(self, night: dt.date) -> dict[str, str]:
        return {r["storecode"]: r["name"] for r in self.landed[night]["stores"]}

    def state(self, night: dt.date) -> dict[str, dict[str, list[dict[str, Any]]]]:
        """client -> table -> rows of the client's newest synced night <= night."""
        if night not in self._states:
            newest: dict[str, dt.date] = {}
            for n in self.nights:
                if n <= night:
                    for r in self.landed[n].get("synced_clients", []):
                        newest[r["client_number"]] = n
            state: dict[str, dict[str, list[dict[str, Any]]]] = {}
            for client, n in newest.items():
                state[client] = {
                    t: [r for r in self.landed[n].get(t, []) if r["client_number"] == client]
                    for t in ("ledger_balances", "memberships")
                }
            self._states[night] = state
        return self._states[night]

    def balances(self, night: dt.date) -> dict[tuple[str, str], Decimal]:
        return {
            (c, r["storecode"]): r["balance"]
            for c, tables in self.state(night).items()
            for r in tables["ledger_balances"]
        }

    def memberships(self, night: dt.date) -> dict[tuple[str, str], dict[str, Any]]:
        """(membership_id, storecode) -> {status (normalised), is_eft, dues}."""
        return {
            (r["membership_id"], r["storecode"]): {
                "status": normalise(r["status"]),
                "in_mrr": normalise(r["status"]) == "active" and bool(r["is_eft"]),
                "dues": r["monthly_dues"] if r["monthly_dues"] is not None else D("0.00"),
            }
            for tables in self.state(night).values()
            for r in tables["memberships"]
        }

    def previous(self, night: dt.date) -> dt.date:
        i = self.nights.index(night)
        return self.nights[i - 1] if i else night

    # --- balance_aging_by_store ------------------------------------------------------------

    def aging(self) -> dict[tuple[dt.date, str], dict[str, Any]]:
        out = {}
        for night in self.nights:
            balances = self.balances(night)
            buckets: dict[str, dict[str, Any]] = {}
            for store in self.stores(night):
                buckets[store] = {
                    "clients_owing": 0,
                    "amount_owed": D("0.00"),
                    "owed_0_29": D("0.00"),
                    "owed_30_59": D("0.00"),
                    "owed_60_89": D("0.00"),
                    "owed_90_plus": D("0.00"),
                    "clients_90_plus": 0,
                }
            for (client, store), balance in balances.items():
                if balance <= 0 or store not in buckets:
                    continue
                settled = self.nights[0] - dt.timedelta(days=1)  # before our history: a lower bound
                for earlier in reversed([n for n in self.nights if n <= night]):
                    if self.balances(earlier).get((client, store), D(0)) <= 0:
                        settled = earlier
                        break
                age = (night - settled).days
                b = buckets[store]
                b["clients_owing"] += 1
                b["amount_owed"] += balance
                column = (
                    "owed_0_29"
                    if age <= 29
                    else "owed_30_59"
                    if age <= 59
                    else "owed_60_89"
                    if age <= 89
                    else "owed_90_plus"
                )
                b[column] += balance
                b["clients_90_plus"] += age >= 90
            for store, b in buckets.items():
                out[(night, store)] = {"store_name": self.stores(night)[store], **b}
        return out

    # --- membership_roll_forward, mrr_by_store ------------------------------------------------

    def _row_stores(self, night: dt.date) -> set[str]:
        before, now = self.memberships(self.previous(night)), self.memberships(night)
        return set(self.stores(night)) | {s for _, s in before} | {s for _, s in now}

    def roll_forward(self) -> dict[tuple[dt.date, str], dict[str, Any]]:
        out = {}
        for night in self.nights:
            before, now = self.memberships(self.previous(night)), self.memberships(night)
            for store in self._row_stores(night):
                was = {k for k, m in before.items() if k[1] == store and m["status"] == "active"}
                is_ = {k for k, m in now.items() if k[1] == store and m["status"] == "active"}
                joined, left = is_ - was, was - is_
                status_now = {k: now[k]["status"] if k in now else None for k in left}
                out[(night, store)] = {
                    "store_name": self.stores(night).get(store),
                    "opening_active": len(was),
                    "new": sum(1 for k in joined if k not in before),
                    "reactivated": sum(1 for k in joined if k in before),
                    "frozen": sum(1 for s in status_now.values() if s in ("frozen", "on_hold")),
                    "canceled": sum(1 for s in status_now.values() if s == "canceled"),
                    "expired": sum(
                        1 for s in status_now.values() if s not in ("frozen", "on_hold", "canceled")
                    ),
                    "closing_active": len(is_),
                }
        return out

    def mrr(self) -> dict[tuple[dt.date, str], dict[str, Any]]:
        out = {}
        zero = D("0.00")
        for night in self.nights:
            before, now = self.memberships(self.previous(night)), self.memberships(night)
            for store in self._row_stores(night):
                row = dict.fromkeys(
                    (
                        "previous_mrr",
                        "new",
                        "reactivated",
                        "expansion",
                        "contraction",
                        "churned",
                        "paused",
                        "mrr",
                    ),
                    zero,
                )
                keys = {k for k in (*before, *now) if k[1] == store}
                for k in keys:
                    b, n = before.get(k), now.get(k)
                    was_in, is_in = bool(b and b["in_mrr"]), bool(n and n["in_mrr"])
                    if was_in:
                        row["previous_mrr"] += b["dues"]  # type: ignore[index]
                    if is_in:
                        row["mrr"] += n["dues"]  # type: ignore[index]
                    if is_in and not was_in:
                        row["new" if b is None else "reactivated"] += n["dues"]  # type: ignore[index]
                    elif was_in and is_in:
                        delta = n["dues"] - b["dues"]  # type: ignore[index]
                        if delta > 0:
                            row["expansion"] += delta
                        else:
                            row["contraction"] -= delta
                    elif was_in and not is_in:
                        paused = n is not None and n["status"] in ("frozen", "on_hold")
                        row["paused" if paused else "churned"] += b["dues"]  # type: ignore[index]
                out[(night, store)] = {"store_name": self.stores(night).get(store), **row}
        return out

    # --- monthly ---------------------------------------------------------------------------

    def roll_forward_monthly(self) -> dict[tuple[dt.date, str], dict[str, Any]]:
        daily = self.roll_forward()
        grouped: dict[tuple[dt.date, str], list[dt.date]] = defaultdict(list)
        for night, store in daily:
            grouped[(night.replace(day=1), store)].append(night)
        out = {}
        for (month, store), nights in grouped.items():
            first, last = min(nights), max(nights)

            def active(night: dt.date, store: str = store) -> int:
                return sum(
                    1 for k, m in self.memberships(night).items() if k[1] == store and m["status"] == "active"
                )

            out[(month, store)] = {
                "snapshot_date": last,
                "store_name": daily[(last, store)]["store_name"],
                "first_night": first,
                "nights": len(nights),
                "opening_active": active(self.previous(first)),
                **{
                    f: sum(daily[(n, store)][f] for n in nights)
                    for f in ("new", "reactivated", "frozen", "canceled", "expired")
                },
                "closing_active": active(last),
            }
        return out

    def churn(self) -> dict[tuple[dt.date, str], dict[str, Any]]:
        monthly = self.roll_forward_monthly()
        q = D("0.0001")

        def rate(num: Decimal, den: Decimal) -> Decimal | None:
            return None if den == 0 else (num / den).quantize(q, rounding=ROUND_HALF_UP)

        out = {}
        for (month, store), m in monthly.items():
            window = [
                w
                for (wm, ws), w in monthly.items()
                if ws == store and month >= wm > _months_before(month, 12)
            ]
            averages = [D(w["opening_active"] + w["closing_active"]) / 2 for w in window]
            canceled_12m = sum(w["canceled"] for w in window)
            out[(month, store)] = {
                "snapshot_date": m["snapshot_date"],
                "store_name": m["store_name"],
                "opening_active": m["opening_active"],
                "closing_active": m["closing_active"],
                "canceled": m["canceled"],
                "churn_rate": rate(D(m["canceled"]), D(m["opening_active"] + m["closing_active"]) / 2),
                "months_12m": len(window),
                "canceled_12m": canceled_12m,
                "churn_rate_12m": rate(D(canceled_12m), sum(averages, D(0)) / len(window)),
            }
        return out

    # --- store_scorecard --------------------------------------------------------------------

    def saved_sales(self) -> list[tuple[dict[str, Any], Decimal]]:
        """Every saved sale in its newest landed version, with the sum of its lines."""
        newest: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
        for night in self.nights:
            rows = self.landed[night]
            for t in rows.get("transactions", []):
                lines = [
                    x for x in rows.get("transaction_lines", []) if x["receipt_number"] == t["receipt_number"]
                ]
                newest[t["receipt_number"]] = (t, lines)
        return [
            (t, sum((x["amount"] for x in lines), D(0)))
            for t, lines in newest.values()
            if t["status"].lower() != "voided"
        ]

    def revenue(self) -> dict[tuple[str, dt.date], Decimal]:
        """(storecode, business date) -> revenue, each receipt in its newest landed version."""
        out: dict[tuple[str, dt.date], Decimal] = defaultdict(lambda: D("0.00"))
        for t, amount in self.saved_sales():
            out[(t["storecode"], t["transaction_date"].date())] += amount
        return out

    def scorecard(self) -> dict[tuple[dt.date, str], dict[str, Any]]:
        aging, mrr, revenue = self.aging(), self.mrr(), self.revenue()

        def figures(night: dt.date) -> dict[str, dict[str, Any]]:
            ms = self.memberships(night)
            return {
                store: {
                    "active_members": sum(
                        1 for k, m in ms.items() if k[1] == store and m["status"] == "active"
                    ),
                    "frozen_memberships": sum(
                        1 for k, m in ms.items() if k[1] == store and m["status"] == "frozen"
                    ),
                    "mrr": mrr[(night, store)]["mrr"] if (night, store) in mrr else D("0.00"),
                    "amount_owed": aging[(night, store)]["amount_owed"],
                    "owed_90_plus": aging[(night, store)]["owed_90_plus"],
                    "revenue_7d": sum(
                        (revenue.get((store, night - dt.timedelta(days=d)), D(0)) for d in range(7)),
                        D("0.00"),
                    ),
                }
                for store in self.stores(night)
            }

        out = {}
        for night in self.nights:
            week = night - dt.timedelta(days=7)
            month = _months_before(night, 1)
            week_ago = week if week in self.nights else None
            month_ago = month if month in self.nights else None
            tonight = figures(night)
            then_week = figures(week_ago) if week_ago else {}
            then_month = figures(month_ago) if month_ago else {}
            for store, f in tonight.items():
                row: dict[str, Any] = {
                    "store_name": self.stores(night)[store],
                    "week_ago_date": week_ago,
                    "month_ago_date": month_ago,
                }
                for name, value in f.items():
                    row[name] = value
                    row[f"{name}_week_ago"] = then_week.get(store, {}).get(name)
                    row[f"{name}_month_ago"] = then_month.get(store, {}).get(name)
                out[(night, store)] = row
        return out

    # --- cohort_retention -------------------------------------------------------------------

    def cohorts(self) -> dict[tuple[dt.date, str, int], dict[str, Any]]:
        """(cohort month, storecode, months since joining) -> cohort_size, still_members,
        revenue_to_date: a client's cohort is their earliest-starting membership's month, at its
        store (its newest landed row); still a member on the newest night <= the month's end
        holding one active or frozen (every month here is after the first night's, but those
        before it, read from the start dates: no membership here ends by date)."""
        newest_rows = {
            r["membership_id"]: r for n in self.nights for r in self.landed[n].get("memberships", [])
        }
        first: dict[str, dict[str, Any]] = {}
        for r in sorted(newest_rows.values(), key=lambda r: (r["start_date"], r["membership_id"])):
            first.setdefault(r["client_number"], r)
        spent = self._spent_by_client_day()
        out = {}
        for number, r in first.items():
            cohort = r["start_date"].replace(day=1)
            for k, month in enumerate(_month_span(cohort, self.nights[-1])):
                as_of = min(_months_before(month, -1) - dt.timedelta(days=1), self.nights[-1])
                row = out.setdefault(
                    (cohort, r["storecode"], k),
                    {"cohort_size": 0, "still_members": 0, "revenue_to_date": D("0.00")},
                )
                row["cohort_size"] += 1
                row["still_members"] += self._member_on(number, as_of, newest_rows)
                row["revenue_to_date"] += sum(
                    (v for (c, m), v in spent.items() if c == number and m <= as_of), D("0.00")
                )
        return out

    def _member_on(self, number: str, as_of: dt.date, newest_rows: dict[str, dict[str, Any]]) -> bool:
        held = [n for n in self.nights if n <= as_of]
        if not held:
            return any(
                r["client_number"] == number and r["start_date"] <= as_of for r in newest_rows.values()
            )
        rows = self.state(held[-1]).get(number, {}).get("memberships", [])
        return any(normalise(r["status"]) in ("active", "frozen") for r in rows)

    def _spent_by_client_day(self) -> dict[tuple[str, dt.date], Decimal]:
        """(client, business date) -> the lines of their saved sales (each in its newest version)."""
        out: dict[tuple[str, dt.date], Decimal] = defaultdict(lambda: D("0.00"))
        for t, amount in self.saved_sales():
            out[(t["client_number"], t["transaction_date"].date())] += amount
        return out


def _month_span(first: dt.date, last: dt.date) -> list[dt.date]:
    """The first days of the months from ``first``'s to ``last``'s."""
    months = [first.replace(day=1)]
    while months[-1] < last.replace(day=1):
        months.append(_months_before(months[-1], -1))
    return months


def _months_before(day: dt.date, months: int) -> dt.date:
    """The same day ``months`` calendar months earlier (its month's last day when shorter)."""
    total = day.year * 12 + day.month - 1 - months
    year, month = divmod(total, 12)
    return dt.date(year, month + 1, min(day.day, calendar.monthrange(year, month + 1)[1]))
