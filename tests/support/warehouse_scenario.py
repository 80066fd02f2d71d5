"""A synthetic landing zone over three nights, and the reports computed from it in plain Python.

The expected values are computed here independently of the SQL models (Decimal, dicts), from
the same rows that are landed, following the modelling rules:

- a client's state as of night N = all its rows of its newest synced night <= N;
- store lists per night; events deduplicated by key across nights, newest night wins.

Edge cases on purpose: a client whose ledger row at one store vanishes on night 2 (must not be
resurrected), a transaction voided on a later night, statuses in odd casing (``on hold``,
``ON_HOLD``, `` Active ``), an unknown status (``Suspended``), storecodes that differ only by
case or trailing spaces, a store with nothing, cent amounts whose float sums are not exact,
names that start like a spreadsheet formula, more than 50 debtors at a store with tied balances.
"""

from __future__ import annotations

import datetime as dt
import random
from collections import defaultdict
from collections.abc import Iterable
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

from membersync.warehouse.landing.paths import DataDir

D = Decimal
NIGHTS = (dt.date(2026, 3, 1), dt.date(2026, 3, 2), dt.date(2026, 3, 3))

DOWNTOWN = "DOWNTOWN  "
DOWNTOWN_LOWER = "downtown  "  # differs from DOWNTOWN only by case: a different store
UPTOWN = "UPTOWN    "
EMPTY = "A B       "  # a store with nothing at all
NEW = "NEW-STORE "  # opens on night 2
NOT_LISTED = "GHOST     "  # memberships/ledgers at a store not in any store list

STORE_NAMES = {
    DOWNTOWN: "Downtown Spa",
    DOWNTOWN_LOWER: "downtown annex",
    UPTOWN: "Uptown Día",
    EMPTY: "@Mall kiosk",
    NEW: "New store",
}
STATUS_CYCLE = (
    "Active",
    "active",
    " Active ",
    "Frozen",
    "OnHold",
    "on hold",
    "ON_HOLD",
    "Canceled",
    "Expired",
)
KNOWN_STATUS = {
    "active": "active",
    "frozen": "frozen",
    "onhold": "on_hold",
    "canceled": "canceled",
    "expired": "expired",
}
STATUSES = ("active", "frozen", "on_hold", "canceled", "expired", "other")
SPECIAL = "000417"  # ledger row at DOWNTOWN vanishes on night 2
EVIL = "000666"  # a name that starts like a formula


def stores_of(night_index: int) -> list[dict[str, Any]]:
    codes = [DOWNTOWN, DOWNTOWN_LOWER, UPTOWN, EMPTY] + ([NEW] if night_index >= 1 else [])
    return [{"storecode": c, "name": STORE_NAMES[c], "timezone": "America/New_York"} for c in codes]


def _client_state(number: str, night_index: int, rng: random.Random) -> dict[str, list[dict[str, Any]]]:
    """The whole state of one client as landed on a night it is synced."""
    i = int(number)
    first, last = f"First{i}", f"Last{i}"
    if number == EVIL:
        first, last = '=HYPERLINK("http://x")', "-Evil"
    ledger: dict[str, Decimal] = {}
    if number == SPECIAL:
        ledger = {DOWNTOWN: D("100.10"), UPTOWN: D("-20.05")}
        if night_index >= 1:
            del ledger[DOWNTOWN]  # paid off: the row vanishes from the service
    else:
        # 0.10 + 0.20 style amounts; ties at 123.45 across clients (the top-50 tie-break).
        base = D(rng.choice(["0.10", "0.20", "0.30", "123.45", "99.99", "1500.01", "0.01"]))
        ledger[DOWNTOWN] = base + D(i % 7) + D(night_index) * D("0.10")
        if i % 5 == 0:
            ledger[DOWNTOWN_LOWER] = -D("10.05") - D(i % 3)
        if i % 4 == 0:
            ledger[UPTOWN] = D("0.00") if i % 8 == 0 else D("33.33")
        if i % 11 == 0:
            ledger[NOT_LISTED] = D("5.55")
        if number == EVIL:
            ledger[DOWNTOWN] = D("9999.99")  # at the top of the debtors, name and all
    status = STATUS_CYCLE[(i + night_index) % len(STATUS_CYCLE)]
    if i % 13 == 0:
        status = "Suspended"  # unknown: counted as other
    store = (DOWNTOWN, UPTOWN, DOWNTOWN_LOWER, NOT_LISTED)[i % 4]
    is_eft = i % 3 != 0
    memberships = [
        {
            "client_number": number,
            "membership_id": f"M{number}",
            "membership_type_id": "EFT1" if is_eft else "PIF",
            "name": "Gold",
            "is_eft": is_eft,
            "status": status,
            "storecode": store,
            "start_date": dt.date(2025, 1 + i % 12, 1 + i % 28),  # a cohort a month of 2025
            "draw_day": (1, 15, 20)[i % 3] if is_eft else None,
            "monthly_dues": D("39.99") + D(i % 4) * D("0.01") if is_eft else None,
            "price": None if is_eft else D("499.00"),
        }
    ]
    if i % 6 == 1:  # a second membership at another store
        memberships.append(
            {
                "client_number": number,
                "membership_id": f"M{number}-2",
                "is_eft": True,
                "status": "active",
                "storecode": UPTOWN,
                "start_date": dt.date(2026, 2, 10),
                "draw_day": 15,
                "monthly_dues": D("0.10"),
            }
        )
    points = {DOWNTOWN: (i * 37 + night_index) % 400 - 50}
    if i % 3 == 0:
        points[UPTOWN] = 0
    billing = (
        [
            {
                "client_number": number,
                "billing_account_id": f"B{number}",
                "membership_id": f"M{number}",
                "type": "CARD",
            }
        ]
        if i % 2 == 0
        else []
    )
    return {
        "synced_clients": [{"client_number": number, "home_store": DOWNTOWN}],
        "clients": [
            {"client_number": number, "first_name": first, "last_name": last, "home_store": DOWNTOWN}
        ],
        "ledger_balances": [
            {"client_number": number, "storecode": s, "balance": b} for s, b in sorted(ledger.items())
        ],
        "memberships": memberships,
        "points_balances": [
            {"client_number": number, "storecode": s, "points": p} for s, p in points.items()
        ],
        "billing_accounts": billing,
    }


ALL_CLIENTS = [f"{i:06d}" for i in range(1, 71)] + [SPECIAL, EVIL]
SYNCED = {
    0: [*ALL_CLIENTS[:-5], SPECIAL, EVIL],  # the full first night (5 clients join later)
    1: [SPECIAL, "000001", "000002", "000003", "000013", "000066", "000067"],
    2: ["000002", "000068", "000069", "000070", "000026"],
}


def _tx(receipt: str, client: str, store: str, when: dt.datetime, status: str, lines: list[tuple[Any, ...]]):
    header = {
        "client_number": client,
        "receipt_number": receipt,
        "transaction_date": when,
        "storecode": store,
        "emp_no": "E1",
        "status": status,
    }
    rows = [
        {
            "client_number": client,
            "receipt_number": receipt,
            "line_no": n,
            "type": t,
            "quantity": q,
            "price_per_unit": p,
            "amount": D(q) * p,
            "tax": tax,
        }
        for n, (t, q, p, tax) in enumerate(lines, start=1)
    ]
    return header, rows


def _events(night_index: int) -> dict[str, list[dict[str, Any]]]:
    """Transactions fetched on a night (a window; some fetched again on later nights)."""
    T = dt.datetime
    specs: list[tuple[str, str, str, dt.datetime, str, list[tuple[Any, ...]]]] = []
    if night_index == 0:
        specs += [
            (
                "R1",
                "000001",
                DOWNTOWN,
                T(2026, 2, 28, 9, 0),
                "Saved",
                [("R", 3, D("0.10"), D("0.02")), ("P", 1, D("0.20"), D("0.00"))],
            ),
            ("R2", "000020", DOWNTOWN, T(2026, 2, 28, 23, 59), "Saved", [("r", 1, D("19.99"), D("1.60"))]),
            (
                "R3",
                "000003",
                UPTOWN,
                T(2026, 3, 1, 0, 0),
                "saved",
                [("M", 1, D("39.99"), D("0")), ("1", 1, D("25.00"), D("2.00"))],
            ),
            ("R4", EVIL, DOWNTOWN_LOWER, T(2026, 3, 1, 12, 0), "Saved", [("g", 2, D("50.00"), D("0"))]),
            ("R5", "000041", DOWNTOWN, T(2026, 3, 1, 8, 30), "Saved", [("R", 1, D("1000.00"), D("80.00"))]),
        ]
    if night_index == 1:
        specs += [
            # R5 fetched again: voided since. Not revenue, on any night's export.
            ("R5", "000041", DOWNTOWN, T(2026, 3, 1, 8, 30), "Voided", [("R", 1, D("1000.00"), D("80.00"))]),
            (
                "R6",
                "000001",
                DOWNTOWN,
                T(2026, 3, 2, 10, 0),
                "Saved",
                [("R", 7, D("0.10"), D("0.01")), ("X", 1, D("3.00"), D("0"))],
            ),
            ("R7", "000013", NEW, T(2026, 3, 2, 18, 0), "SAVED", [("P", 2, D("0.30"), D("0.05"))]),
        ]
    if night_index == 2:
        specs += [
            (
                "R1",
                "000001",
                DOWNTOWN,
                T(2026, 2, 28, 9, 0),
                "Saved",
                [("R", 3, D("0.10"), D("0.02")), ("P", 1, D("0.20"), D("0.00"))],
            ),
            ("R8", "000020", DOWNTOWN, T(2026, 3, 3, 7, 0), "Saved", [("R", 1, D("0.01"), D("0.00"))]),
        ]
    headers, lines, payments = [], [], []
    for receipt, client, store, when, status, line_specs in specs:
        header, rows = _tx(receipt, client, store, when, status, line_specs)
        headers.append(header)
        lines += rows
        total = sum((r["amount"] + r["tax"] for r in rows), D(0))
        payments.append(
            {
                "client_number": client,
                "receipt_number": receipt,
                "payment_id": f"PAY-{receipt}",
                "payment_type": "CASH",
                "amount": total,
                "date": when,
            }
        )
    return {"transactions": headers, "transaction_lines": lines, "transaction_payments": payments}


def landed_nights() -> dict[dt.date, dict[str, list[dict[str, Any]]]]:
    """What each night lands: table name -> rows (Python values)."""
    out: dict[dt.date, dict[str, list[dict[str, Any]]]] = {}
    for n, night in enumerate(NIGHTS):
        tables: dict[str, list[dict[str, Any]]] = defaultdict(list)
        tables["stores"] = stores_of(n)
        tables["eft_draw_days"] = [{"day": 1}, {"day": 15}]
        for client in SYNCED[n]:
            # The client's state depends on the client and the night, not on the order.
            rng = random.Random(f"{client}-{n}")
            for name, rows in _client_state(client, n, rng).items():
                tables[name] += rows
        for name, rows in _events(n).items():
            tables[name] += rows
        out[night] = dict(tables)
    return out


# ---------------------------------------------------------------------------------------------
# The reports, computed independently in Python
# ---------------------------------------------------------------------------------------------


def _norm_status(raw: str | None) -> str:
    key = (raw or "").strip().lower().replace(" ", "").replace("_", "").replace("-", "")
    return KNOWN_STATUS.get(key, "other")


def _as_of(
    landed: dict[dt.date, dict[str, list[dict[str, Any]]]], night: dt.date, table: str
) -> list[dict[str, Any]]:
    """All rows of `table` of each client's newest synced night <= night."""
    newest: dict[str, dt.date] = {}
    for n in sorted(d for d in landed if d <= night):
        for row in landed[n].get("synced_clients", []):
            newest[row["client_number"]] = n
    return [
        row
        for client, n in newest.items()
        for row in landed[n].get(table, [])
        if row["client_number"] == client
    ]


def _events_newest(landed: dict[dt.date, dict[str, list[dict[str, Any]]]], table: str, key: tuple[str, ...]):
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for n in sorted(landed):
        for row in landed[n].get(table, []):
            out[tuple(row[k] for k in key)] = row
    return list(out.values())


def _stores(landed, night) -> list[dict[str, Any]]:
    return sorted(landed[night]["stores"], key=lambda s: s["storecode"].encode())


def expected_outstanding(landed, night) -> list[dict[str, Any]]:
    ledger = _as_of(landed, night, "ledger_balances")
    out = []
    for store in _stores(landed, night):
        balances = [r["balance"] for r in ledger if r["storecode"] == store["storecode"]]
        owing = [b for b in balances if b > 0]
        credit = [b for b in balances if b < 0]
        out.append(
            {
                "snapshot_date": night,
                "storecode": store["storecode"],
                "store_name": store["name"],
                "clients_owing": len(owing),
                "amount_owed": sum(owing, D("0.00")),
                "clients_in_credit": len(credit),
                "credit_amount": -sum(credit, D("0.00")),
                "net_balance": sum(balances, D("0.00")),
            }
        )
    return out


def expected_frozen(landed, night) -> list[dict[str, Any]]:
    memberships = _as_of(landed, night, "memberships")
    out = []
    for store in _stores(landed, night):
        counts = {s: 0 for s in STATUSES}
        for m in memberships:
            if m["storecode"] == store["storecode"]:
                counts[_norm_status(m["status"])] += 1
        denominator = counts["active"] + counts["frozen"]
        rate = (
            None
            if denominator == 0
            else (D(counts["frozen"]) / D(denominator)).quantize(D("0.0001"), rounding=ROUND_HALF_UP)
        )
        out.append(
            {
                "snapshot_date": night,
                "storecode": store["storecode"],
                "store_name": store["name"],
                **counts,
                "frozen_rate": rate,
            }
        )
    return out


def expected_points(landed, night) -> list[dict[str, Any]]:
    points = _as_of(landed, night, "points_balances")
    out = []
    for store in _stores(landed, night):
        positive = [p["points"] for p in points if p["storecode"] == store["storecode"] and p["points"] > 0]
        out.append(
            {
                "snapshot_date": night,
                "storecode": store["storecode"],
                "store_name": store["name"],
                "clients_with_points": len(positive),
                "points_outstanding": sum(positive),
            }
        )
    return out


def expected_eft(landed, night) -> list[dict[str, Any]]:
    active = [
        m
        for m in _as_of(landed, night, "memberships")
        if m.get("is_eft") and _norm_status(m["status"]) == "active"
    ]
    days = {d["day"] for d in landed[night]["eft_draw_days"]} | {m["draw_day"] or 0 for m in active}
    out = []
    for store in _stores(landed, night):
        for day in sorted(days):
            rows = [m for m in active if m["storecode"] == store["storecode"] and (m["draw_day"] or 0) == day]
            out.append(
                {
                    "snapshot_date": night,
                    "storecode": store["storecode"],
                    "draw_day": day,
                    "active_eft_memberships": len(rows),
                    "monthly_dues_total": sum((m["monthly_dues"] or D(0) for m in rows), D("0.00")),
                }
            )
    return out


def _line_type(raw: str | None) -> str:
    value = (raw or "").strip().upper()
    return value if value in ("R", "P", "M", "1", "G") else "other"


def expected_revenue(landed, up_to: dt.date | None = None) -> list[dict[str, Any]]:
    headers = {t["receipt_number"]: t for t in _events_newest(landed, "transactions", ("receipt_number",))}
    lines = _events_newest(landed, "transaction_lines", ("receipt_number", "line_no"))
    groups: dict[tuple[str, dt.date, str], dict[str, Any]] = {}
    for line in lines:
        header = headers[line["receipt_number"]]
        if header["status"].strip().lower() == "voided":
            continue
        day = header["transaction_date"].date()
        if up_to is not None and day > up_to:
            continue
        key = (header["storecode"], day, _line_type(line["type"]))
        g = groups.setdefault(key, {"receipts": set(), "quantity": 0, "amount": D("0.00"), "tax": D("0.00")})
        g["receipts"].add(line["receipt_number"])
        g["quantity"] += line["quantity"]
        g["amount"] += line["amount"]
        g["tax"] += line["tax"]
    return [
        {
            "storecode": s,
            "business_date": d,
            "type": t,
            "transactions": len(g["receipts"]),
            "quantity": g["quantity"],
            "amount": g["amount"],
            "tax": g["tax"],
        }
        for (s, d, t), g in sorted(
            groups.items(), key=lambda kv: (kv[0][0].encode(), kv[0][1], kv[0][2].encode())
        )
    ]


def expected_status_daily(landed, night) -> list[dict[str, Any]]:
    memberships = _as_of(landed, night, "memberships")
    out = []
    for store in _stores(landed, night):
        for status in STATUSES:
            n = sum(
                1
                for m in memberships
                if m["storecode"] == store["storecode"] and _norm_status(m["status"]) == status
            )
            out.append(
                {"snapshot_date": night, "storecode": store["storecode"], "status": status, "memberships": n}
            )
    return out


def expected_top_debtors(landed, night) -> list[dict[str, Any]]:
    ledger = _as_of(landed, night, "ledger_balances")
    clients = {c["client_number"]: c for c in _as_of(landed, night, "clients")}
    memberships = _as_of(landed, night, "memberships")
    billing = {b["client_number"] for b in _as_of(landed, night, "billing_accounts")}
    headers = {t["receipt_number"]: t for t in _events_newest(landed, "transactions", ("receipt_number",))}
    payments = _events_newest(landed, "transaction_payments", ("payment_id",))
    out = []
    for store in _stores(landed, night):
        code = store["storecode"]
        debtors = sorted(
            (r for r in ledger if r["storecode"] == code and r["balance"] > 0),
            key=lambda r: (-r["balance"], r["client_number"]),
        )[:50]
        for r in debtors:
            number = r["client_number"]
            c = clients[number]
            paid = [
                p["date"].date()
                for p in payments
                if p["client_number"] == number
                and headers[p["receipt_number"]]["storecode"] == code
                and headers[p["receipt_number"]]["status"].strip().lower() != "voided"
                and p["date"].date() <= night
            ]
            out.append(
                {
                    "snapshot_date": night,
                    "storecode": code,
                    "client_number": number,
                    "client_name": f"{c['first_name']} {c['last_name']}",
                    "balance": r["balance"],
                    "active_memberships": sum(
                        1
                        for m in memberships
                        if m["client_number"] == number and _norm_status(m["status"]) == "active"
                    ),
                    "eft_on_file": number in billing,
                    "last_payment_date": max(paid) if paid else None,
                }
            )
    return out


EXPECTED = {
    "outstanding_balances_by_store": expected_outstanding,
    "frozen_memberships_by_store": expected_frozen,
    "points_liability_by_store": expected_points,
    "eft_draw_forecast": expected_eft,
    "membership_status_daily": expected_status_daily,
    "top_debtors": expected_top_debtors,
}


def rows_as_dicts(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> list[dict[str, Any]]:
    names = list(header)
    return [dict(zip(names, row, strict=True)) for row in rows]


# --- shared by the export and workbook tests ---------------------------------------------------

BOM = b"\xef\xbb\xbf"


def land_scenario(data_dir: DataDir, nights: int = 3) -> dict[dt.date, dict[str, list[dict[str, Any]]]]:
    """The scenario's first ``nights`` nights landed as committed nights (two parts each)."""
    from membersync.flows.benchmarks.synthetic import write_night

    landed = landed_nights()
    for n, night in enumerate(NIGHTS[:nights]):
        write_night(data_dir, night, landed[night], mode="full" if n == 0 else "incremental", parts=2)
    return landed


def read_csv(path: Path) -> list[list[str]]:
    """A report CSV's rows (it starts with a UTF-8 BOM, for Excel)."""
    import csv
    import io

    raw = path.read_bytes()
    assert raw.startswith(BOM)
    return list(csv.reader(io.StringIO(raw[len(BOM) :].decode("utf-8"), newline="")))
