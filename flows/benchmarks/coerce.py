"""A small benchmark of typing (not a test): rows/s of ``to_arrow`` and of ``BatchBuilder``.

Run ``python -m membersync.flows.benchmarks.coerce [--clients N] [--per-client K] [--batch B]``.
It reports CPU time (``process_time``), for memberships and for transaction history, in two
ways of calling:

* per request: ``to_arrow`` / ``explode_transactions`` once per client (a few rows each),
  which pays the fixed cost of building Arrow arrays on every call;
* batched: ``BatchBuilder.add`` per client and one ``build`` per batch of clients.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

from membersync.models.coerce import BatchBuilder, TimezoneLookup, explode_transactions, to_arrow

log = logging.getLogger(__name__)
STORES = ("DOWNTOWN  ", "UPTOWN    ", "MALL      ")
TZ = TimezoneLookup({"DOWNTOWN  ": "America/New_York", "UPTOWN    ": "America/Chicago"})


def membership(rng: random.Random, n: int) -> dict[str, Any]:
    eft = rng.random() < 0.6
    return {
        "membershipId": f"M{n:08d}",
        "membershipTypeId": f"T{rng.randrange(20):03d}",
        "name": "Gold Monthly",
        "isEft": eft,
        "status": rng.choice(["Active", "Frozen", "OnHold", "Canceled", "Expired"]),
        "storecode": rng.choice(STORES),
        "startDate": "2025-03-01",
        "endDate": None,
        "drawDay": rng.randrange(1, 29) if eft else None,
        "monthlyDues": round(rng.uniform(10, 200), 2) if eft else None,
        "price": None if eft else f"{rng.uniform(10, 900):.2f}",
        "freezeStartDate": None,
        "freezeEndDate": None,
        "cancelDate": None,
        "lastModified": "2026-11-20T22:14:03Z",
    }


def transaction(rng: random.Random, n: int) -> dict[str, Any]:
    lines = [
        {
            "lineNo": i + 1,
            "type": "PRODUCT",
            "productNumber": f"P{rng.randrange(500):05d}",
            "description": "Massage oil",
            "quantity": 2,
            "pricePerUnit": 12.5,
            "amount": 25.0,
            "tax": "2.06",
        }
        for i in range(rng.randrange(1, 4))
    ]
    return {
        "receiptNumber": f"R{n:09d}",
        "transactionDate": "2026-11-20T14:03:00",
        "storecode": rng.choice(STORES),
        "empNo": "E042",
        "status": "Saved",
        "lines": lines,
        "payments": [
            {"paymentId": f"PY{n:09d}", "paymentType": "CARD", "amount": 27.06, "date": "2026-11-20"}
        ],
    }


def _cpu(fn: Callable[[], object]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def run(clients: int = 2000, per_client: int = 3, batch: int = 100, seed: int = 1) -> dict[str, float]:
    """Rows/s (CPU) of each way of typing; rows = memberships, or transaction rows of 3 tables."""
    rng = random.Random(seed)
    members = [[membership(rng, c * per_client + i) for i in range(per_client)] for c in range(clients)]
    receipts = [[transaction(rng, c * per_client + i) for i in range(per_client)] for c in range(clients)]
    numbers = [f"{c:06d}" for c in range(clients)]
    member_rows = clients * per_client
    receipt_rows = sum(1 + len(t["lines"]) + len(t["payments"]) for r in receipts for t in r)

    def per_request_members() -> None:
        for number, items in zip(numbers, members, strict=True):
            to_arrow("memberships", items, {"clientNumber": number}, TZ)

    def per_request_receipts() -> None:
        for number, items in zip(numbers, receipts, strict=True):
            explode_transactions(items, number, TZ)

    def batched(receipts_too: bool) -> Callable[[], None]:
        def go() -> None:
            builder = BatchBuilder(TZ)
            for i, number in enumerate(numbers):
                if receipts_too:
                    builder.add_transactions(receipts[i], number)
                else:
                    builder.add("memberships", members[i], {"clientNumber": number})
                if (i + 1) % batch == 0:
                    builder.build()
            builder.build()

        return go

    to_arrow("memberships", members[0], {"clientNumber": numbers[0]}, TZ)  # one-time imports in pyarrow
    figures = {
        "memberships_per_request_rows_s": member_rows / _cpu(per_request_members),
        "memberships_batched_rows_s": member_rows / _cpu(batched(False)),
        "transactions_per_request_rows_s": receipt_rows / _cpu(per_request_receipts),
        "transactions_batched_rows_s": receipt_rows / _cpu(batched(True)),
    }
    figures["memberships_per_request_us_per_call"] = (
        1e6 * member_rows / figures["memberships_per_request_rows_s"] / clients
    )
    figures["transactions_per_request_us_per_call"] = (
        1e6 * receipt_rows / figures["transactions_per_request_rows_s"] / clients
    )
    figures["memberships_batched_us_per_call"] = (
        1e6 * member_rows / figures["memberships_batched_rows_s"] / clients
    )
    figures["transactions_batched_us_per_call"] = (
        1e6 * receipt_rows / figures["transactions_batched_rows_s"] / clients
    )
    return figures


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m membersync.flows.benchmarks.coerce", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--per-client", type=int, default=3, help="memberships and receipts per client")
    parser.add_argument("--batch", type=int, default=100, help="clients per batch")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for name, value in run(args.clients, args.per_client, args.batch).items():
        log.info("%-40s %12.0f", name, value)


if __name__ == "__main__":
    main()
