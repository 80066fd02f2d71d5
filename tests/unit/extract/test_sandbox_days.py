"""Issue 65: the sandbox's business days (``extract/sandbox/days.py``): data that reaches the night
it serves, the same for the same seed, stamped on its day at every store; and the demo's sandbox
in a child process, where its days run."""

from __future__ import annotations

import datetime as dt

import httpx
import pytest
from membersync.extract.sandbox.days import run_day, run_days
from membersync.extract.sandbox.population import generate
from membersync.extract.sandbox.running import start_in_process
from membersync.extract.sandbox.server import STATS_PATH, SandboxConfig, build_service

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


def test_a_sandbox_in_a_child_process_runs_a_day_there_and_a_failure_is_one_line() -> None:
    """The demo's sandbox (``start_in_process``): it serves over loopback, a day's business runs
    on its service in the child (the same writes as a twin's here), an error there comes back as
    one line, and stopping it ends the process (a call then is one line too)."""
    config = SandboxConfig(clients=120, stores=3, seed=7, anchor_date=ANCHOR)
    twin = build_service(config)
    with start_in_process(config) as sandbox:
        assert httpx.get(f"{sandbox.url}{STATS_PATH}").status_code == 200
        assert sandbox.call(run_day, ANCHOR, 7) == run_day(twin, ANCHOR, seed=7) > 0
        with pytest.raises(RuntimeError, match=r"the sandbox process failed: .*Error"):
            sandbox.call(run_day, "not a day", 7)
        assert sandbox.call(run_day, ANCHOR + dt.timedelta(days=1), 7) > 0  # still serving
        process = sandbox._process
    assert not process.is_alive()
    with pytest.raises(RuntimeError, match="the sandbox process ended"):
        sandbox.call(run_day, ANCHOR, 7)  # one line, not a broken pipe's traceback
