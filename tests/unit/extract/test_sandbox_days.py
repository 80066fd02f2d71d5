"""Issue 65: the sandbox's business days (``extract/sandbox/days.py``): data that reaches the night
it serves, the same for the same seed, stamped on its day at every store."""

from __future__ import annotations

import datetime as dt

from membersync.extract.sandbox.days import run_day, run_days
from membersync.extract.sandbox.population import generate
from membersync.extract.sandbox.server import SandboxConfig, build_service

ANCHOR = dt.date(2026, 11, 20)


def _sales_by_day(service) -> dict[dt.date, int]:
    out: dict[dt.date, int] = {}
    for txn in service.transactions.values():
        out[txn.local_datetime.date()] = out.get(txn.local_datetime.date(), 0) + 1
    return out


def test_each_business_day_has_sales_dated_that_day_at_every_open_store() -> None:
    service = generate(42, 300, 5, ANCHOR)
    run_days(service, ANCHOR, ANCHOR + dt.timedelta(days=6), seed=42)
    sales = _sales_by_day(service)
    assert all(sales.get(ANCHOR + dt.timedelta(days=d), 0) > 0 for d in range(7)), sales
    newest = max(t.local_datetime for t in service.transactions.values())
    assert newest.date() == ANCHOR + dt.timedelta(days=6)  # nothing on a later local date anywhere


def test_the_same_seed_and_day_make_the_same_writes() -> None:
    a, b = generate(7, 120, 3, ANCHOR), generate(7, 120, 3, ANCHOR)
    assert run_day(a, ANCHOR, seed=7) == run_day(b, ANCHOR, seed=7) > 0
    assert sorted((t.receipt_number, t.status) for t in a.transactions.values()) == sorted(
        (t.receipt_number, t.status) for t in b.transactions.values()
    )
    assert {c.client_number: c.ledger for c in a.iter_clients()} == {
        c.client_number: c.ledger for c in b.iter_clients()
    }


def test_a_sandbox_with_recent_days_reaches_the_eve_of_its_anchor_and_later_changes_are_newer() -> None:
    service = build_service(SandboxConfig(clients=200, anchor_date=ANCHOR, recent_days=14))
    assert max(_sales_by_day(service)) == ANCHOR - dt.timedelta(days=1)
    newest = max(c.last_modified for c in service.iter_clients())
    assert service.touch(next(iter(service.iter_clients()))) >= newest  # the real clock, never earlier
    without = build_service(SandboxConfig(clients=200, anchor_date=ANCHOR))
    assert max(_sales_by_day(without)) < ANCHOR - dt.timedelta(days=1)  # why the days exist
