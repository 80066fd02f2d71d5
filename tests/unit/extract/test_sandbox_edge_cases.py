"""The sandbox's generated data holds the management reports' edge cases (issue 9), deterministically
from the seed, at the default store count; the end-to-end truth suite (test_reports_truth.py) relies
on them. Checked on the generated state directly (no HTTP, no sync): fast, and for several seeds.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from membersync.extract import catalogue
from membersync.extract.sandbox import data, population
from membersync.extract.sandbox.state import Service

ANCHOR = dt.date(2026, 11, 23)
DEFAULT_STORES = 5  # SandboxConfig's default
TOP = 50


def generated(seed: int, clients: int = 200, stores: int = DEFAULT_STORES) -> Service:
    service = population.generate(seed, clients, stores, ANCHOR)
    service.materialize_all()
    return service


def ranked(service: Service, code: str) -> list[tuple[str, Decimal]]:
    owing = [(c.client_number, c.ledger[code]) for c in service.clients.values() if c.ledger.get(code, 0) > 0]
    return sorted(owing, key=lambda x: (-x[1], x[0]))


@pytest.mark.parametrize("seed", [42, 7, 4])
def test_more_than_50_debtors_at_a_store_and_a_tie_straddling_rank_50(seed: int) -> None:
    service = generated(seed)
    first = next(iter(service.stores))
    debtors = ranked(service, first)
    assert len(debtors) > TOP
    tie = debtors[TOP - 1][1]
    assert debtors[TOP - 2][1] == tie == debtors[TOP][1]  # ranks 49, 50 and 51 owe the same
    assert debtors[TOP + 2][1] < tie


@pytest.mark.parametrize("seed", [42, 7])
def test_an_idle_store_and_a_store_closed_mid_history(seed: int) -> None:
    service = generated(seed)
    codes = list(service.stores)
    idle, closed = codes[-1], codes[-2]
    assert service.stores[idle].active and not service.stores[closed].active
    assert [s.active for s in service.stores.values()].count(False) == 1
    assert not any(
        c.home_store == idle or idle in c.ledger or idle in c.points for c in service.clients.values()
    )
    assert not any(ms.storecode == idle for ms in service.memberships.values())
    assert not any(t.storecode == idle for t in service.transactions.values())
    sales = [t.local_datetime.date() for t in service.transactions.values() if t.storecode == closed]
    assert len(sales) > 5 and max(sales) <= data.closed_on(ANCHOR) < ANCHOR - dt.timedelta(days=60)


@pytest.mark.parametrize("seed", [42, 7])
def test_balances_and_a_membership_at_a_storecode_outside_the_store_list(seed: int) -> None:
    service = generated(seed)
    assert data.UNLISTED_STORECODE not in service.stores and len(data.UNLISTED_STORECODE) == 10
    balances = [
        c.ledger[data.UNLISTED_STORECODE]
        for c in service.clients.values()
        if data.UNLISTED_STORECODE in c.ledger
    ]
    assert any(b > 0 for b in balances) and any(b < 0 for b in balances)
    unlisted = [ms for ms in service.memberships.values() if ms.storecode not in service.stores]
    assert [(ms.storecode, ms.status, ms.is_eft) for ms in unlisted] == [
        (data.UNLISTED_STORECODE, "Active", True)
    ]
    # the member owes at the first store: a top debtor whose active memberships include this one
    member = unlisted[0].client_number
    assert member in [n for n, _ in ranked(service, next(iter(service.stores)))[:TOP]]


@pytest.mark.parametrize("seed", [42, 7])
def test_membership_statuses_outside_the_contracts_five(seed: int) -> None:
    service = generated(seed)
    odd = {ms.status for ms in service.memberships.values()} - set(catalogue.MEMBERSHIP_STATUSES)
    assert odd == set(data.ODD_STATUSES) | set(data.SPELLED_STATUSES)


@pytest.mark.parametrize("seed", [42, 7])
def test_sales_at_local_times_on_dst_changes(seed: int) -> None:
    service = generated(seed)
    first = next(iter(service.stores))
    zone = service.zone(first)
    assert str(zone).startswith("America/")
    fall, spring = data.dst_days(zone, ANCHOR - dt.timedelta(days=20))
    assert fall is not None and spring is not None
    # the days are DST changes indeed: the offset at midnight before and after differs
    for day, step in ((fall, -1), (spring, 1)):
        before = dt.datetime.combine(day, dt.time(), zone).utcoffset()
        after = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), zone).utcoffset()
        assert before is not None and after is not None and (after - before) == dt.timedelta(hours=step)
    at_first = [t for t in service.transactions.values() if t.storecode == first]
    stamps = {(t.local_datetime.replace(fold=0), t.local_datetime.fold, t.wire_style) for t in at_first}
    at = dt.datetime.combine
    assert {
        (at(fall, dt.time(1, 30)), 0, "utc"),
        (at(fall, dt.time(1, 30)), 1, "offset"),
        (at(fall, dt.time(23, 30)), 0, "utc"),
        (at(spring, dt.time(1, 59, 59)), 0, "local"),
        (at(spring, dt.time(3, 0)), 0, "offset"),
    } <= stamps
    # the two 01:30 are an hour apart in UTC
    first_, second = (at(fall, dt.time(1, 30, fold=f)).replace(tzinfo=zone) for f in (0, 1))
    assert second.astimezone(dt.UTC) - first_.astimezone(dt.UTC) == dt.timedelta(hours=1)


@pytest.mark.parametrize("seed", [42, 7])
def test_a_sale_paid_months_later(seed: int) -> None:
    service = generated(seed)
    late = [
        t
        for t in service.transactions.values()
        if any((p.local_datetime.date() - t.local_datetime.date()).days > 200 for p in t.payments)
    ]
    assert late and all(t.status == "Saved" for t in late)


def test_the_generated_data_still_keeps_its_promises_with_the_edge_cases() -> None:
    """Every holding is older than its client's lastModified; every lastModified before the anchor."""
    service = generated(42)
    floor = dt.datetime.combine(ANCHOR, dt.time(), dt.UTC)
    assert all(c.last_modified < floor for c in service.clients.values())
    assert all(
        t.local_datetime.date() < service.clients[t.client_number].last_modified.date()
        for t in service.transactions.values()
    )
    assert all(
        ms.last_modified <= service.clients[ms.client_number].last_modified
        for ms in service.memberships.values()
    )


def test_too_small_for_more_than_50_debtors_is_no_error() -> None:
    """A small sandbox skips the cases it cannot hold (no debtors forced) and keeps the others."""
    service = generated(3, clients=30, stores=2)
    assert all(s.active for s in service.stores.values())  # 2 stores: no idle, no closed store
    assert len(ranked(service, next(iter(service.stores)))) < TOP
