"""The sandbox against the contract, through a plain HTTP client (raw httpx, not our client).

Every endpoint of the catalogue is walked: configuration lists, client reads, search paging and
criteria, every write and a later read showing its effect, the validation rules (400 naming the
field), 401/404/405/409, the membership state machine, rate limiting, injected faults, drift, a
tenant profile with other wire names, determinism and data coverage, and ``membersync sandbox``
as a subprocess answering ``curl``. Ground truth is the sandbox's ``Service``, read on its loop.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from membersync.extract import catalogue
from membersync.extract.profile import Profile
from membersync.extract.sandbox import population
from membersync.extract.sandbox.running import RunningSandbox, start_in_thread
from membersync.extract.sandbox.server import FAULT_KINDS, SandboxConfig
from membersync.extract.sandbox.state import Service
from membersync.extract.settings import SettingsError
from membersync.flows.pool.schedule import free_port

ANCHOR = dt.date(2025, 6, 1)
AUTH = ("sandbox", "sandbox")
P = "/svcapi/"

# Item fields of the contract (section 3), by record.
FIELDS: dict[str, set[str]] = {
    "storeInfo": {"storecode", "name", "city", "state", "timezone", "active"},
    "packageInfo": {"packageId", "name", "price", "sessions", "affiliated", "storecode"},
    "eftMembershipInfo": {"membershipTypeId", "name", "monthlyDues", "enrollmentFee", "storecode"},
    "nonEftMembershipInfo": {"membershipTypeId", "name", "price", "termMonths", "storecode"},
    "eftDeductTypes": {"code", "description"},
    "eftDrawDays": {"day", "description"},
    "skintypes": {"code", "description"},
    "webdoc": {"docId", "name"},
    "paymentType": {"code", "description", "kind"},
    "employee": {"empNo", "firstName", "lastName", "storecode", "role"},
    "products": {"productNumber", "name", "price", "category", "storecode"},
    "processorCredentials": {"processor", "merchantId", "username", "password", "apiKey"},
    "profileQuestion": {"questionId", "text", "answerType", "choices"},
    "clientSummary": {"clientNumber", "firstName", "lastName", "email", "homeStore", "lastModified"},
    "client": {
        "clientNumber", "firstName", "lastName", "email", "phone", "birthDate", "gender", "address1", "city",
        "state", "postalCode", "homeStore", "referredBy", "skinType", "createdDate", "lastModified",
    },
    "ledgerBalance": {"storecode", "balance", "asOf"},
    "commPrefs": {"email", "sms", "mail", "phone", "marketing"},
    "clientMembership": {
        "membershipId", "membershipTypeId", "name", "isEft", "status", "storecode", "startDate", "endDate",
        "drawDay", "monthlyDues", "price", "freezeStartDate", "freezeEndDate", "cancelDate", "lastModified",
    },
    "clientPackage": {
        "clientPackageId", "packageId", "name", "storecode", "purchaseDate", "expirationDate",
        "sessionsTotal", "sessionsRemaining", "sharedFromClientNumber",
    },
    "pointsBalance": {"storecode", "points"},
    "pointsTransaction": {"pointsTransactionId", "date", "storecode", "points", "reason", "receiptNumber"},
    "billingAccount": {
        "billingAccountId", "membershipId", "type", "deductType", "lastFour", "expMonth", "expYear",
        "tokenId", "vaultToken", "accountNo", "routingNo",
    },
    "transaction": {"receiptNumber", "transactionDate", "storecode", "empNo", "status", "lines", "payments"},
    "affiliatedClient": {"clientNumber", "firstName", "lastName", "sharedDate"},
}  # fmt: skip
LINE_FIELDS = {"lineNo", "type", "description", "quantity", "pricePerUnit", "amount", "tax"}
PAYMENT_FIELDS = {"paymentId", "paymentType", "amount", "date"}


def money(value: Any) -> Decimal:
    assert isinstance(value, int | float | str) and not isinstance(value, bool), value
    return Decimal(str(value))


def error_of(response: httpx.Response) -> dict[str, str]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    return dict(body["error"])


def expect_error(response: httpx.Response, status: int, field: str | None = None) -> dict[str, str]:
    assert response.status_code == status, (response.status_code, response.text)
    err = error_of(response)
    assert err["code"] and err["code"] == err["code"].lower() and " " not in err["code"], err
    if field is not None:
        assert field in err["message"], (field, err)
    return err


@pytest.fixture(scope="module")
def sb() -> Iterator[RunningSandbox]:
    """This module's own sandbox (it writes), with a fixed anchor date."""
    running = start_in_thread(SandboxConfig(clients=200, seed=42, anchor_date=ANCHOR))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def http(sb: RunningSandbox) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sb.url, auth=AUTH, timeout=30) as client:
        yield client


def get(http: httpx.Client, path: str, **params: Any) -> Any:
    response = http.get(P + path, params=params)
    assert response.status_code == 200, (path, response.status_code, response.text)
    return response.json()


def post(http: httpx.Client, path: str, body: dict[str, Any], status: int = 200) -> Any:
    response = http.post(P + path, json=body)
    assert response.status_code == status, (path, response.status_code, response.text)
    return response.json()


def new_client(http: httpx.Client, sb: RunningSandbox, **fields: Any) -> tuple[str, str, str]:
    """A fresh client (number, its store, an employee of the store) to write on."""
    store = sb.call(lambda s: next(iter(s.stores)))
    emp = sb.call(lambda s: next(e.emp_no for e in s.store_employees[store] if e.active))
    body = {"storecode": store, "empNo": emp, "firstName": "Test", "lastName": "Writer", **fields}
    number = post(http, "clients/insert", body)["clientNumber"]
    return number, store, emp


# --- the fixtures of CONTRACTS.md A ----------------------------------------------------------------


def test_session_fixture_is_a_running_sandbox_of_200_clients(sandbox: RunningSandbox) -> None:
    assert sandbox.config.clients == 200 and sandbox.config.seed == 42
    assert sandbox.call(lambda s: (len(s.clients), s.materialized)) == (200, True)
    response = httpx.get(sandbox.url + P + "stores/storelist", auth=AUTH)
    assert response.status_code == 200 and response.json()["stores"]


def test_fresh_sandbox_takes_config_keywords_and_checks_them(
    fresh_sandbox: Callable[..., RunningSandbox],
) -> None:
    running = fresh_sandbox(clients=7, seed=3, password="other-secret")
    assert running.call(lambda s: len(s.clients)) == 7
    assert (
        httpx.get(running.url + P + "stores/storelist", auth=("sandbox", "other-secret")).status_code == 200
    )
    with pytest.raises(SettingsError, match="fault rate"):
        fresh_sandbox(fault_rate=2)


# --- configuration -----------------------------------------------------------------------------


def test_every_configuration_list_answers_its_wrapper_and_fields(
    http: httpx.Client, sb: RunningSandbox
) -> None:
    stores = get(http, "stores/storelist")["stores"]
    codes = [s["storecode"] for s in stores]
    assert codes == sb.call(lambda s: list(s.stores))
    for ep in catalogue.CONFIG_ENDPOINTS:
        path = ep.path.removeprefix(P)
        if ep.kind == "config":
            calls: list[dict[str, str]] = [{}]
        elif ep.name == "processor_credentials":
            calls = [{"storecode": c, "type": t} for c in codes for t in ("POS", "EFT")]
        else:
            calls = [{"storecode": c} for c in codes]
        for params in calls:
            body = get(http, path, **params)
            assert list(body) == [ep.wrapper], (ep.name, list(body))
            items = body[ep.wrapper]
            assert items, (ep.name, params)
            for item in items:
                assert set(item) == FIELDS[ep.record or ""], (ep.name, item)
    # store-scoped items really belong to the store asked for
    for code in codes:
        assert {e["storecode"] for e in get(http, "setup/employees", storecode=code)["employees"]} == {code}
        assert {p["storecode"] for p in get(http, "setup/getproducts", storecode=code)["products"]} == {code}


def test_configuration_values_follow_the_contract(http: httpx.Client) -> None:
    stores = get(http, "stores/storelist")["stores"]
    assert all(len(s["storecode"]) == 10 for s in stores)
    assert any(s["storecode"].endswith(" ") for s in stores), "a storecode with trailing spaces"
    offsets = {
        dt.datetime(2025, 1, 15, tzinfo=__import__("zoneinfo").ZoneInfo(s["timezone"])).utcoffset()
        for s in stores
    }
    assert len(offsets) >= 3
    days = [d["day"] for d in get(http, "memberships/eftdrawdays")["types"]]
    assert all(isinstance(d, int) and 1 <= d <= 28 for d in days)
    kinds = {
        p["kind"] for p in get(http, "setup/paymenttypes", storecode=stores[0]["storecode"])["paymentTypes"]
    }
    assert kinds <= set(catalogue.PAYMENT_KINDS) and "ACCOUNT" in kinds
    questions = get(http, "setup/profilequestions")["questions"]
    assert {q["answerType"] for q in questions} == set(catalogue.ANSWER_TYPES)
    assert any(p["affiliated"] for p in get(http, "packages/packagelist")["packages"])
    for item in get(http, "memberships/eft")["memberships"]:
        assert money(item["monthlyDues"]) > 0
    creds = get(http, "setup/getprocessorcredentials", storecode=stores[0]["storecode"], type="EFT")[
        "products"
    ]
    assert all(c["username"] and c["password"] and c["apiKey"] for c in creds)


def test_store_scoped_lists_validate_storecode_and_type(http: httpx.Client) -> None:
    expect_error(http.get(P + "setup/paymenttypes"), 400, "storecode")
    expect_error(http.get(P + "setup/employees", params={"storecode": "DOWNTOWN"}), 400, "storecode")
    expect_error(http.get(P + "setup/getproducts", params={"storecode": "NOWHERE   "}), 404, "storecode")
    path = P + "setup/getprocessorcredentials"
    expect_error(http.get(path, params={"storecode": "DOWNTOWN  ", "type": "ACH"}), 400, "type")
    expect_error(http.get(path, params={"storecode": "DOWNTOWN  ", "type": "POSX"}), 400, "type")
    expect_error(http.get(path, params={"storecode": "DOWNTOWN  "}), 400, "type")
    # a storecode is byte-exact: trimmed, it is another (wrong-length) code
    expect_error(
        http.get(P + "setup/employees", params={"storecode": "DOWNTOWN  ".strip()}), 400, "storecode"
    )


# --- client reads ------------------------------------------------------------------------------------


def rich_client(s: Service) -> str:
    """A client holding a bit of everything (ledger, membership, transactions, points, billing)."""
    for c in s.iter_clients():
        if c.ledger and c.memberships and c.transactions and c.points and c.billing_accounts and c.packages:
            return c.client_number
    raise AssertionError("no client holds everything")


def test_every_client_read_answers_the_contract_and_the_truth(http: httpx.Client, sb: RunningSandbox) -> None:
    number = sb.call(rich_client)
    truth = sb.call(lambda s: s.client(number))
    details = get(http, "clients/clientdetails", clientNumber=number)["client"]
    assert set(details) == FIELDS["client"] and details["clientNumber"] == number
    assert details["lastName"] == truth.last_name and details["homeStore"] == truth.home_store
    assert details["lastModified"] == truth.last_modified.strftime("%Y-%m-%dT%H:%M:%SZ")

    balances = get(http, "clients/ledgerbalance", clientNumber=number)["balances"]
    assert {b["storecode"]: money(b["balance"]) for b in balances} == truth.ledger
    assert all(set(b) == FIELDS["ledgerBalance"] for b in balances)

    prefs = get(http, "clients/commprefs", clientNumber=number)["preferences"]
    assert prefs == truth.comm_prefs and set(prefs) == FIELDS["commPrefs"]

    memberships = get(http, "clients/clientmemberships", clientNumber=number)["memberships"]
    assert [m["membershipId"] for m in memberships] == [m.membership_id for m in truth.memberships]
    for item, ms in zip(memberships, truth.memberships, strict=True):
        assert set(item) == FIELDS["clientMembership"] and item["status"] == ms.status
        if ms.is_eft:
            assert item["drawDay"] in sb.call(lambda s: s.draw_days) and item["price"] is None
            assert money(item["monthlyDues"]) == ms.monthly_dues
        else:
            assert item["drawDay"] is None and money(item["price"]) == ms.price

    packages = get(http, "clients/clientpackages", clientNumber=number)["packages"]
    assert all(set(p) == FIELDS["clientPackage"] for p in packages)
    assert {p["clientPackageId"] for p in packages} >= {p.client_package_id for p in truth.packages}

    points = get(http, "clients/pointsbalance", clientNumber=number)["balances"]
    assert {p["storecode"]: int(p["points"]) for p in points} == truth.points

    accounts = get(http, "clients/billinginfo", clientNumber=number)["accounts"]
    assert all(set(a) == FIELDS["billingAccount"] for a in accounts)
    assert {a["billingAccountId"] for a in accounts} == {a.billing_account_id for a in truth.billing_accounts}

    history = get(http, "clients/transactionhistory", clientNumber=number)["transactions"]
    assert [t["receiptNumber"] for t in history] == [t.receipt_number for t in truth.transactions]
    for item, txn in zip(history, truth.transactions, strict=True):
        assert set(item) == FIELDS["transaction"] and item["status"] == txn.status
        for line in item["lines"]:
            assert set(line) == LINE_FIELDS | {catalogue.LINE_REQUIRED_FIELD[line["type"]]}
            assert money(line["amount"]) == line["quantity"] * money(line["pricePerUnit"])
        for payment in item["payments"]:
            assert set(payment) == PAYMENT_FIELDS
        total = sum((money(x["amount"]) + money(x["tax"]) for x in item["lines"]), Decimal(0))
        assert total == txn.total


def test_points_transactions_need_dates_and_filter_on_them(http: httpx.Client, sb: RunningSandbox) -> None:
    number = sb.call(rich_client)
    path = P + "clients/getpointstransactions"
    expect_error(http.get(path, params={"clientNumber": number}), 400, "startDate")
    expect_error(http.get(path, params={"clientNumber": number, "startDate": "2020-01-01"}), 400, "endDate")
    expect_error(
        http.get(path, params={"clientNumber": number, "startDate": "2020-13-01", "endDate": "2025-01-01"}),
        400,
        "startDate",
    )
    everything = get(
        http,
        "clients/getpointstransactions",
        clientNumber=number,
        startDate="2000-01-01",
        endDate="2100-01-01",
    )["transactions"]
    truth = sb.call(lambda s: s.client(number).points_transactions)
    assert len(everything) == len(truth) > 0
    assert all(set(t) == FIELDS["pointsTransaction"] for t in everything)
    assert sum(int(t["points"]) for t in everything) == sum(
        sb.call(lambda s: s.client(number).points).values()
    )
    day = truth[0].local_datetime.date().isoformat()
    one_day = get(http, "clients/getpointstransactions", clientNumber=number, startDate=day, endDate=day)
    assert {t["pointsTransactionId"] for t in one_day["transactions"]} == {
        t.points_transaction_id for t in truth if t.local_datetime.date().isoformat() == day
    }


def test_transaction_history_filters_on_the_local_date(http: httpx.Client, sb: RunningSandbox) -> None:
    number = sb.call(rich_client)
    truth = sb.call(lambda s: s.client(number).transactions)
    day = truth[0].local_datetime.date()
    since = get(http, "clients/transactionhistory", clientNumber=number, startDate=day.isoformat())
    assert {t["receiptNumber"] for t in since["transactions"]} == {
        t.receipt_number for t in truth if t.local_datetime.date() >= day
    }
    until = get(http, "clients/transactionhistory", clientNumber=number, endDate=day.isoformat())
    assert {t["receiptNumber"] for t in until["transactions"]} == {
        t.receipt_number for t in truth if t.local_datetime.date() <= day
    }


def test_client_reads_404_on_unknown_numbers_and_400_without_one(http: httpx.Client) -> None:
    for ep in catalogue.CLIENT_READ_ENDPOINTS:
        path = ep.path.removeprefix(P)
        if ep.name == "affiliatedpackageclients":
            expect_error(http.get(P + path, params={"membershipId": "M999999-9"}), 404, "membershipId")
            expect_error(http.get(P + path), 400, "membershipId")
            continue
        params = {"clientNumber": "999999", "startDate": "2020-01-01", "endDate": "2020-12-31"}
        expect_error(http.get(P + path, params=params), 404, "clientNumber")
        expect_error(
            http.get(P + path, params={"startDate": "2020-01-01", "endDate": "2020-12-31"}),
            400,
            "clientNumber",
        )
    # an opaque number: "417" is not "000417"
    first = get(http, "clients/search", lastName="a")["clients"][0]["clientNumber"]
    expect_error(http.get(P + "clients/clientdetails", params={"clientNumber": str(int(first))}), 404)


def test_affiliated_package_clients(http: httpx.Client, sb: RunningSandbox) -> None:
    owner_ms, sharees = sb.call(lambda s: next((k, sorted(v)) for k, v in s.shares.items() if v))
    body = get(http, "setup/affiliatedpackageclients", membershipId=owner_ms)
    assert [c["clientNumber"] for c in body["clients"]] == sharees
    assert all(set(c) == FIELDS["affiliatedClient"] for c in body["clients"])
    owner = sb.call(lambda s: s.memberships[owner_ms].client_number)
    shared = get(http, "clients/clientpackages", clientNumber=sharees[0])["packages"]
    assert any(p["sharedFromClientNumber"] == owner for p in shared)
    lonely = sb.call(lambda s: next(m for m in s.memberships if not s.shares.get(m)))
    assert get(http, "setup/affiliatedpackageclients", membershipId=lonely) == {"clients": []}


# --- search ------------------------------------------------------------------------------------------


def test_search_pages_in_client_number_order(http: httpx.Client, sb: RunningSandbox) -> None:
    store = sb.call(lambda s: next(iter(s.stores)))
    truth = sb.call(lambda s: sorted(c.client_number for c in s.clients.values() if c.home_store == store))
    first = get(http, "clients/search", storecode=store)
    assert (first["page"], first["pageSize"], first["totalCount"]) == (1, 100, len(truth))
    seen: list[str] = []
    page = 1
    while True:
        body = get(http, "clients/search", storecode=store, page=page, pageSize=7)
        assert body["page"] == page and body["pageSize"] == 7 and body["totalCount"] == len(truth)
        assert all(set(c) == FIELDS["clientSummary"] for c in body["clients"])
        if not body["clients"]:
            break
        seen += [c["clientNumber"] for c in body["clients"]]
        page += 1
    assert seen == truth
    assert (
        get(http, "clients/search", storecode=store, pageSize=500)["clients"][-1]["clientNumber"] == truth[-1]
    )


def test_search_criteria_and_modified_since(http: httpx.Client, sb: RunningSandbox) -> None:
    clients = sb.call(lambda s: list(s.clients.values()))
    stamps = sorted(c.last_modified for c in clients)
    since = stamps[len(stamps) // 2]
    text = since.strftime("%Y-%m-%dT%H:%M:%SZ")
    body = get(http, "clients/search", modifiedSince=text, pageSize=500)
    assert [c["clientNumber"] for c in body["clients"]] == sorted(
        c.client_number for c in clients if c.last_modified >= since
    )
    assert all(c["lastModified"] >= text for c in body["clients"])
    someone = clients[3]
    by_email = get(http, "clients/search", email=someone.email.upper())["clients"]
    assert [c["clientNumber"] for c in by_email] == [someone.client_number]
    by_name = get(http, "clients/search", lastName=someone.last_name, firstName=someone.first_name)["clients"]
    assert someone.client_number in {c["clientNumber"] for c in by_name}
    by_phone = get(http, "clients/search", phone=someone.phone)["clients"]
    assert someone.client_number in {c["clientNumber"] for c in by_phone}


def test_search_validation(http: httpx.Client) -> None:
    expect_error(http.get(P + "clients/search"), 400, "criterion")
    expect_error(http.get(P + "clients/search", params={"lastName": "a", "pageSize": 501}), 400, "pageSize")
    expect_error(http.get(P + "clients/search", params={"lastName": "a", "pageSize": 0}), 400, "pageSize")
    expect_error(http.get(P + "clients/search", params={"lastName": "a", "page": 0}), 400, "page")
    expect_error(http.get(P + "clients/search", params={"modifiedSince": "yesterday"}), 400, "modifiedSince")
    expect_error(http.get(P + "clients/search", params={"storecode": "X"}), 400, "storecode")
    assert get(http, "clients/search", lastName="a", pageSize=500)["pageSize"] == 500


# --- writes --------------------------------------------------------------------------------------------


def test_every_write_requires_its_catalogue_fields(http: httpx.Client) -> None:
    for ep in catalogue.WRITE_ENDPOINTS:
        expect_error(http.post(ep.path, json={}), 400, ep.required[0])
        expect_error(http.post(ep.path, content=b"{not json"), 400)
        expect_error(http.post(ep.path, json=[1, 2]), 400)


def test_insert_and_update_a_client(http: httpx.Client, sb: RunningSandbox) -> None:
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    number, store, _ = new_client(http, sb, email="w@example.com", birthDate="1990-02-03")
    assert number.isdigit() and len(number) == 6
    details = get(http, "clients/clientdetails", clientNumber=number)["client"]
    assert details["homeStore"] == store and details["birthDate"] == "1990-02-03"
    stamp = dt.datetime.strptime(details["lastModified"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    assert stamp >= before
    assert number in {
        c["clientNumber"]
        for c in get(http, "clients/search", modifiedSince=details["lastModified"], pageSize=500)["clients"]
    }
    answer = post(
        http, "clients/updatedemographics", {"clientNumber": number, "city": "Salem", "phone": None}
    )
    assert answer["client"]["city"] == "Salem" and answer["client"]["email"] == "w@example.com"
    expect_error(
        http.post(P + "clients/updatedemographics", json={"clientNumber": number, "shoeSize": 9}),
        400,
        "shoeSize",
    )
    expect_error(http.post(P + "clients/insert", json={"storecode": "SHORT", "empNo": "x"}), 400, "storecode")
    expect_error(http.post(P + "clients/insert", json={"storecode": store, "empNo": "nobody"}), 400, "empNo")


def test_billing_info_rules(http: httpx.Client, sb: RunningSandbox) -> None:
    number, store, emp = new_client(http, sb)
    day = sb.call(lambda s: next(iter(s.draw_days)))
    mid = post(
        http,
        "clients/insertMembership",
        {
            "clientNumber": number,
            "storecode": store,
            "empNo": emp,
            "membershipTypeId": "E02",
            "isEft": True,
            "drawDay": day,
        },
    )["membershipId"]
    base = {"clientNumber": number, "membershipId": mid, "deductType": "MON"}
    path = P + "clients/updatebillinginfo"
    expect_error(http.post(path, json={**base, "type": "PAYPAL"}), 400, "type")
    expect_error(http.post(path, json={**base, "type": "CARD", "deductType": "WEEKLY"}), 400, "deductType")
    card = {"lastFour": "4242", "expMonth": 12, "expYear": 2030, "tokenId": "tok_secret_1"}
    for name in card:
        without = {k: v for k, v in card.items() if k != name}
        expect_error(http.post(path, json={**base, "type": "CARD", **without}), 400, name)
    expect_error(http.post(path, json={**base, "type": "CHECKING", "accountNo": "123456"}), 400, "routingNo")
    expect_error(
        http.post(path, json={**base, "type": "CHECKING", "routingNo": "021000021"}), 400, "accountNo"
    )
    expect_error(
        http.post(path, json={**base, "membershipId": "M999999-1", "type": "CARD", **card}),
        404,
        "membershipId",
    )
    account_id = post(http, "clients/updatebillinginfo", {**base, "type": "CARD", **card})["billingAccountId"]
    accounts = get(http, "clients/billinginfo", clientNumber=number)["accounts"]
    assert [(a["billingAccountId"], a["type"], a["tokenId"]) for a in accounts] == [
        (account_id, "CARD", "tok_secret_1")
    ]
    post(
        http,
        "clients/updatebillinginfo",
        {**base, "type": "CHECKING", "accountNo": "123456789", "routingNo": "021000021"},
    )
    accounts = get(http, "clients/billinginfo", clientNumber=number)["accounts"]
    assert [(a["type"], a["accountNo"], a["tokenId"]) for a in accounts] == [("CHECKING", "123456789", None)]


def test_insert_membership_rules(http: httpx.Client, sb: RunningSandbox) -> None:
    number, store, emp = new_client(http, sb)
    base = {"clientNumber": number, "storecode": store, "empNo": emp}
    path = P + "clients/insertMembership"
    expect_error(http.post(path, json={**base, "membershipTypeId": "E01", "isEft": True}), 400, "drawDay")
    expect_error(
        http.post(path, json={**base, "membershipTypeId": "E01", "isEft": True, "drawDay": 29}),
        400,
        "drawDay",
    )
    expect_error(
        http.post(path, json={**base, "membershipTypeId": "N01", "isEft": True, "drawDay": 1}),
        400,
        "membershipTypeId",
    )
    eft = post(
        http, "clients/insertMembership", {**base, "membershipTypeId": "E01", "isEft": True, "drawDay": 5}
    )
    non = post(
        http,
        "clients/insertMembership",
        {**base, "membershipTypeId": "N02", "isEft": False, "startDate": "2025-01-01", "onHold": True},
    )
    items = {
        m["membershipId"]: m
        for m in get(http, "clients/clientmemberships", clientNumber=number)["memberships"]
    }
    assert items[eft["membershipId"]]["status"] == "Active" and items[eft["membershipId"]]["drawDay"] == 5
    assert (
        items[non["membershipId"]]["status"] == "OnHold"
        and items[non["membershipId"]]["endDate"] == "2025-07-01"
    )


def test_membership_state_machine(http: httpx.Client, sb: RunningSandbox) -> None:
    number, store, emp = new_client(http, sb)

    def insert(type_id: str, eft: bool, on_hold: bool = False) -> str:
        body = {
            "clientNumber": number,
            "storecode": store,
            "empNo": emp,
            "membershipTypeId": type_id,
            "isEft": eft,
            "drawDay": 10,
            "onHold": on_hold,
        }
        return str(post(http, "clients/insertMembership", body)["membershipId"])

    def op(path: str, mid: str, status: int = 200, **extra: Any) -> Any:
        response = http.post(
            P + "clients/" + path, json={"clientNumber": number, "membershipId": mid, **extra}
        )
        if status != 200:
            err = expect_error(response, status, "membershipId")
            assert err["code"] == "invalid_state"
            return None
        assert response.status_code == 200, response.text
        return response.json()["membership"]

    mid = insert("E02", True)
    assert op("freezemembership", mid, freezeStartDate="2025-06-01")["status"] == "Frozen"
    for forbidden in (
        "freezemembership",
        "activatemembership",
        "upgrademembership",
        "downgrademembership",
        "cancelmembership",
    ):
        op(forbidden, mid, 409, freezeStartDate="2025-06-01", newMembershipTypeId="E03")
    assert op("unfreezemembership", mid)["status"] == "Active"
    op("unfreezemembership", mid, 409)
    op("activatemembership", mid, 409)
    upgraded = op("upgrademembership", mid, newMembershipTypeId="E03")
    assert (upgraded["status"], upgraded["membershipTypeId"], money(upgraded["monthlyDues"])) == (
        "Active",
        "E03",
        Decimal("79.99"),
    )
    expect_error(
        http.post(
            P + "clients/upgrademembership",
            json={"clientNumber": number, "membershipId": mid, "newMembershipTypeId": "E01"},
        ),
        400,
        "newMembershipTypeId",
    )
    expect_error(
        http.post(
            P + "clients/downgrademembership",
            json={"clientNumber": number, "membershipId": mid, "newMembershipTypeId": "E04"},
        ),
        400,
        "newMembershipTypeId",
    )
    assert op("downgrademembership", mid, newMembershipTypeId="E01")["membershipTypeId"] == "E01"
    canceled = op("cancelmembership", mid, cancelDate="2025-06-02")
    assert (canceled["status"], canceled["cancelDate"]) == ("Canceled", "2025-06-02")
    for forbidden in (
        "freezemembership",
        "unfreezemembership",
        "activatemembership",
        "upgrademembership",
        "downgrademembership",
        "cancelmembership",
    ):
        op(forbidden, mid, 409, freezeStartDate="2025-06-01", newMembershipTypeId="E03")

    held = insert("N01", False, on_hold=True)
    op("freezemembership", held, 409, freezeStartDate="2025-06-01")
    assert op("activatemembership", held)["status"] == "Active"
    # freeze, upgrade, downgrade and cancel are for EFT memberships only
    op("freezemembership", held, 409, freezeStartDate="2025-06-01")
    op("cancelmembership", held, 409)
    op("upgrademembership", held, 409, newMembershipTypeId="E03")
    expired = sb.call(lambda s: next(m for m in s.memberships.values() if m.status == "Expired"))
    response = http.post(
        P + "clients/freezemembership",
        json={
            "clientNumber": expired.client_number,
            "membershipId": expired.membership_id,
            "freezeStartDate": "2025-06-01",
        },
    )
    assert expect_error(response, 409)["code"] == "invalid_state"
    # somebody else's membership is not found for this client
    other = sb.call(
        lambda s: next(m.membership_id for m in s.memberships.values() if m.client_number != number)
    )
    expect_error(
        http.post(P + "clients/cancelmembership", json={"clientNumber": number, "membershipId": other}),
        404,
        "membershipId",
    )
    assert sb.call(lambda s: s.memberships[mid].status) == "Canceled"


def test_transactions_payments_and_the_ledger(http: httpx.Client, sb: RunningSandbox) -> None:
    number, store, emp = new_client(http, sb)
    product = sb.call(lambda s: s.store_products[store][0].product_number)
    mid = post(
        http,
        "clients/insertMembership",
        {
            "clientNumber": number,
            "storecode": store,
            "empNo": emp,
            "membershipTypeId": "E01",
            "isEft": True,
            "drawDay": 1,
        },
    )["membershipId"]
    lines = [
        {"type": "R", "productNumber": product, "quantity": 2, "pricePerUnit": "12.50", "tax": 1.55},
        {"type": "P", "packageId": "PK101", "quantity": 1, "pricePerUnit": 425},
        {"type": "M", "membershipId": mid, "quantity": 1, "pricePerUnit": "49.00", "tax": "0"},
        {"type": "1", "membershipId": mid, "quantity": 1, "pricePerUnit": 29.99},
        {"type": "G", "giftCertNo": "GC-T-1", "quantity": 1, "pricePerUnit": "50"},
    ]
    receipt = post(
        http,
        "clients/inserttransaction",
        {"clientNumber": number, "storecode": store, "empNo": emp, "lines": lines},
    )["receiptNumber"]
    total = Decimal("25.00") + Decimal("1.55") + 425 + Decimal("49.00") + Decimal("29.99") + 50
    ledger = {
        b["storecode"]: money(b["balance"])
        for b in get(http, "clients/ledgerbalance", clientNumber=number)["balances"]
    }
    assert ledger == {store: total}
    history = get(http, "clients/transactionhistory", clientNumber=number)["transactions"]
    assert [t["receiptNumber"] for t in history] == [receipt]
    assert [line["type"] for line in history[0]["lines"]] == ["R", "P", "M", "1", "G"]
    assert money(history[0]["lines"][0]["amount"]) == Decimal("25.00")
    packages = get(http, "clients/clientpackages", clientNumber=number)["packages"]
    assert [p["packageId"] for p in packages] == ["PK101"]  # a package sale gives the package

    paid = post(
        http, "clients/insertpayment", {"receiptNumber": receipt, "paymentType": "VISA", "amount": "100.54"}
    )
    assert paid["paymentId"]
    history = get(http, "clients/transactionhistory", clientNumber=number)["transactions"]
    assert [(p["paymentId"], money(p["amount"])) for p in history[0]["payments"]] == [
        (paid["paymentId"], Decimal("100.54"))
    ]
    answer = post(
        http,
        "clients/postaccountledgerpayment",
        {"clientNumber": number, "storecode": store, "amount": 80, "paymentType": "CASH"},
    )
    assert money(answer["balance"]) == total - Decimal("100.54") - 80
    assert sb.call(lambda s: s.clients[number].ledger[store]) == total - Decimal("180.54")

    expect_error(
        http.post(
            P + "clients/insertpayment", json={"receiptNumber": "R404", "paymentType": "CASH", "amount": 1}
        ),
        404,
        "receiptNumber",
    )
    expect_error(
        http.post(
            P + "clients/insertpayment",
            json={"receiptNumber": receipt, "paymentType": "BITCOIN", "amount": 1},
        ),
        400,
        "paymentType",
    )
    expect_error(
        http.post(
            P + "clients/insertpayment",
            json={"receiptNumber": receipt, "paymentType": "CASH", "amount": "1.005"},
        ),
        400,
        "amount",
    )
    voided = sb.call(lambda s: next(t.receipt_number for t in s.transactions.values() if t.voided))
    response = http.post(
        P + "clients/insertpayment", json={"receiptNumber": voided, "paymentType": "CASH", "amount": 1}
    )
    assert expect_error(response, 409)["code"] == "transaction_voided"


def test_each_line_type_requires_its_field(http: httpx.Client, sb: RunningSandbox) -> None:
    number, store, emp = new_client(http, sb)
    base = {"clientNumber": number, "storecode": store, "empNo": emp}
    path = P + "clients/inserttransaction"
    for kind, field in catalogue.LINE_REQUIRED_FIELD.items():
        line = {"type": kind, "quantity": 1, "pricePerUnit": 1}
        expect_error(http.post(path, json={**base, "lines": [line]}), 400, f"lines[0].{field}")
    expect_error(
        http.post(path, json={**base, "lines": [{"type": "X", "pricePerUnit": 1}]}), 400, "lines[0].type"
    )
    expect_error(http.post(path, json={**base, "lines": []}), 400, "lines")
    expect_error(
        http.post(path, json={**base, "lines": [{"type": "G", "giftCertNo": "g"}]}), 400, "pricePerUnit"
    )
    expect_error(
        http.post(path, json={**base, "lines": [{"type": "R", "productNumber": "nope", "pricePerUnit": 1}]}),
        400,
        "productNumber",
    )
    assert sb.call(lambda s: s.clients[number].transactions) == []


def test_points_gift_certs_comments_prefs_profile_referrals_webdocs(
    http: httpx.Client, sb: RunningSandbox
) -> None:
    number, store, emp = new_client(http, sb)
    pid = post(
        http,
        "clients/insertpoints",
        {"clientNumber": number, "storecode": store, "points": 120, "reason": "Bonus"},
    )["pointsTransactionId"]
    post(
        http,
        "clients/insertpoints",
        {"clientNumber": number, "storecode": store, "points": "-20", "reason": "Use"},
    )
    assert get(http, "clients/pointsbalance", clientNumber=number)["balances"] == [
        {"storecode": store, "points": 100}
    ]
    expect_error(
        http.post(
            P + "clients/insertpoints",
            json={"clientNumber": number, "storecode": store, "points": -500, "reason": "x"},
        ),
        409,
    )
    today = dt.date.today()
    window = {
        "startDate": (today - dt.timedelta(days=2)).isoformat(),
        "endDate": (today + dt.timedelta(days=2)).isoformat(),
    }
    listed = get(http, "clients/getpointstransactions", clientNumber=number, **window)["transactions"]
    assert pid in {t["pointsTransactionId"] for t in listed}

    gc = post(
        http,
        "clients/insertgiftcert",
        {"clientNumber": number, "storecode": store, "giftCertNo": "GC-77", "amount": "25.00"},
    )
    assert gc == {"giftCertNo": "GC-77"}
    expect_error(
        http.post(
            P + "clients/insertgiftcert",
            json={"clientNumber": number, "storecode": store, "giftCertNo": "GC-77", "amount": 5},
        ),
        409,
    )
    comment = post(
        http, "clients/insertcomment", {"clientNumber": number, "empNo": emp, "text": "Prefers mornings"}
    )
    assert sb.call(lambda s: [c.comment_id for c in s.clients[number].comments]) == [comment["commentId"]]

    prefs = post(
        http, "clients/updateclientcommpref", {"clientNumber": number, "sms": True, "marketing": False}
    )
    assert prefs["preferences"]["sms"] is True
    assert get(http, "clients/commprefs", clientNumber=number)["preferences"] == prefs["preferences"]
    expect_error(
        http.post(P + "clients/updateclientcommpref", json={"clientNumber": number, "sms": "yes"}), 400, "sms"
    )

    answers = [{"questionId": "Q1", "answer": "none"}, {"questionId": "Q2", "answer": "Firm"}]
    assert post(http, "clients/insertprofileanswers", {"clientNumber": number, "answers": answers}) == {
        "count": 2
    }
    expect_error(
        http.post(
            P + "clients/insertprofileanswers",
            json={"clientNumber": number, "answers": [{"questionId": "Q2", "answer": "Brutal"}]},
        ),
        400,
        "answers[0].answer",
    )
    expect_error(
        http.post(
            P + "clients/insertprofileanswers",
            json={"clientNumber": number, "answers": [{"questionId": "Q99", "answer": "x"}]},
        ),
        400,
        "questionId",
    )

    friend, _, _ = new_client(http, sb)
    referral = post(http, "clients/addreferral", {"clientNumber": number, "referredClientNumber": friend})
    assert referral["referralId"]
    assert get(http, "clients/clientdetails", clientNumber=friend)["client"]["referredBy"] == number
    expect_error(
        http.post(P + "clients/addreferral", json={"clientNumber": number, "referredClientNumber": "999999"}),
        404,
    )

    url = post(http, "clients/generatewebdocument", {"clientNumber": number, "docId": "W01"})["url"]
    assert url.startswith("https://") and "W01" in url
    expect_error(
        http.post(P + "clients/generatewebdocument", json={"clientNumber": number, "docId": "W99"}),
        400,
        "docId",
    )


def test_case_points_earned_on_an_overdrawn_balance_are_accepted(
    http: httpx.Client, sb: RunningSandbox
) -> None:
    """The seed overdraws a few clients' points (a redemption whose earning sale was refunded):
    earning points reduces the overdraft; only a redemption below zero is refused."""

    def overdrawn(service: Any) -> list[tuple[str, str, int]]:
        return [
            (c.client_number, code, points)
            for c in service.iter_clients()
            for code, points in c.points.items()
            if points < 0
        ]

    number, store, before = sb.call(overdrawn)[0]
    post(
        http,
        "clients/insertpoints",
        {"clientNumber": number, "storecode": store, "points": 5, "reason": "Bonus"},
    )
    assert {"storecode": store, "points": before + 5} in get(
        http, "clients/pointsbalance", clientNumber=number
    )["balances"]
    expect_error(
        http.post(
            P + "clients/insertpoints",
            json={"clientNumber": number, "storecode": store, "points": -1, "reason": "Use"},
        ),
        409,
    )


def test_share_and_unshare_an_affiliated_package(http: httpx.Client, sb: RunningSandbox) -> None:
    owner_ms = sb.call(lambda s: next(k for k, v in s.shares.items() if v))
    newcomer, _, _ = new_client(http, sb)
    body = {"membershipId": owner_ms, "clientNumber": newcomer}
    now_sharing = post(http, "clients/shareaffiliatedpackage", body)["clients"]
    assert newcomer in [c["clientNumber"] for c in now_sharing]
    listed = get(http, "setup/affiliatedpackageclients", membershipId=owner_ms)["clients"]
    assert [c["clientNumber"] for c in listed] == [c["clientNumber"] for c in now_sharing]
    packages = get(http, "clients/clientpackages", clientNumber=newcomer)["packages"]
    assert [p["sharedFromClientNumber"] for p in packages] == [
        sb.call(lambda s: s.memberships[owner_ms].client_number)
    ]
    expect_error(http.post(P + "clients/shareaffiliatedpackage", json=body), 409)
    after = post(http, "clients/unshareaffiliatedpackage", body)["clients"]
    assert newcomer not in [c["clientNumber"] for c in after]
    assert get(http, "clients/clientpackages", clientNumber=newcomer)["packages"] == []
    expect_error(http.post(P + "clients/unshareaffiliatedpackage", json=body), 409)
    plain = sb.call(lambda s: next(m for m in s.memberships if m not in s.affiliated))
    expect_error(
        http.post(
            P + "clients/shareaffiliatedpackage", json={"membershipId": plain, "clientNumber": newcomer}
        ),
        409,
    )
    expect_error(
        http.post(
            P + "clients/shareaffiliatedpackage", json={"membershipId": "M000000-9", "clientNumber": newcomer}
        ),
        404,
    )


def test_users_register_login_reset(http: httpx.Client, sb: RunningSandbox) -> None:
    store = sb.call(lambda s: next(iter(s.stores)))
    body = {
        "username": "ava01",
        "password": "correct horse",
        "email": "ava@example.com",
        "firstName": "Ava",
        "lastName": "Stone",
        "storecode": store,
    }
    answer = post(http, "users/register", body)
    assert answer["user"] == {"username": "ava01", "clientNumber": answer["clientNumber"]}
    assert (
        get(http, "clients/clientdetails", clientNumber=answer["clientNumber"])["client"]["lastName"]
        == "Stone"
    )
    expect_error(http.post(P + "users/register", json=body), 409, "username")
    expect_error(
        http.post(P + "users/register", json={**body, "username": "x2", "password": "short"}), 400, "password"
    )
    assert post(http, "users/login", {"username": "ava01", "password": "correct horse"}) == {
        "valid": True,
        "clientNumber": answer["clientNumber"],
    }
    assert post(http, "users/login", {"username": "ava01", "password": "wrong"}) == {
        "valid": False,
        "clientNumber": None,
    }
    assert post(http, "users/login", {"username": "nobody", "password": "x"}) == {
        "valid": False,
        "clientNumber": None,
    }
    assert post(http, "users/resetpassword", {"username": "ava01", "newPassword": "battery staple"}) == {
        "reset": True
    }
    assert post(http, "users/login", {"username": "ava01", "password": "correct horse"})["valid"] is False
    assert post(http, "users/login", {"username": "ava01", "password": "battery staple"})["valid"] is True
    expect_error(
        http.post(P + "users/resetpassword", json={"username": "ghost", "newPassword": "long enough"}), 404
    )
    user = sb.call(lambda s: s.users["ava01"])
    assert len(user.logins) == 2  # valid logins are recorded
    stored = repr(user).encode() + user.password_hash + user.salt
    assert b"battery staple" not in stored and b"correct horse" not in stored


def test_every_write_sets_last_modified(http: httpx.Client, sb: RunningSandbox) -> None:
    number, _, emp = new_client(http, sb)
    sb.call(lambda s: setattr(s.clients[number], "last_modified", s.floor))
    post(http, "clients/insertcomment", {"clientNumber": number, "empNo": emp, "text": "hello"})
    stamp = sb.call(lambda s: s.clients[number].last_modified)
    assert stamp > sb.call(lambda s: s.floor) - dt.timedelta(seconds=1)
    assert stamp.tzinfo is not None and stamp.microsecond == 0
    # every generated value is before the anchor's start: a change is never older than any of them
    generated = sb.call(lambda s: [c.last_modified for c in s.clients.values() if c.last_modified < s.floor])
    assert len(generated) >= 190 and max(generated) < stamp


# --- protocol: auth, routing, rate, faults -------------------------------------------------------------


def test_basic_auth_on_every_endpoint(sb: RunningSandbox) -> None:
    with httpx.Client(base_url=sb.url) as client:
        for ep in catalogue.ENDPOINTS:
            for auth in (None, ("sandbox", "wrong"), ("someone", "sandbox")):
                kw: dict[str, Any] = {"json": {}} if ep.is_write else {}
                response = client.request(ep.method, ep.path, auth=auth, **kw)
                assert response.status_code == 401, (ep.name, auth)
                assert response.headers["WWW-Authenticate"].startswith("Basic")
                assert error_of(response)["code"] == "unauthorized"
        token = base64.b64encode(b"sandbox:sandbox").decode()
        response = client.get(P + "stores/storelist", headers={"Authorization": f"basic  {token}"})
        assert response.status_code == 200  # the scheme is case-insensitive
        assert client.get(P + "stores/storelist", headers={"Authorization": "Basic !!!"}).status_code == 401


def test_unknown_paths_and_methods(http: httpx.Client) -> None:
    expect_error(http.get(P + "clients/teleport"), 404)
    response = http.post(P + "stores/storelist", json={})
    assert expect_error(response, 405) and response.headers["Allow"] == "GET"
    assert http.get(P + "clients/insertMembership").status_code == 405


def test_rate_limit_answers_429_with_retry_after(fresh_sandbox: Callable[..., RunningSandbox]) -> None:
    running = fresh_sandbox(clients=5, rate=0.5, burst=2)
    with httpx.Client(base_url=running.url, auth=AUTH) as client:
        statuses = [client.get(P + "stores/storelist") for _ in range(4)]
    assert [r.status_code for r in statuses[:2]] == [200, 200]
    limited = [r for r in statuses if r.status_code == 429]
    assert limited, [r.status_code for r in statuses]
    for response in limited:
        assert int(response.headers["Retry-After"]) >= 1
        assert error_of(response)["code"] == "rate_limited"
    assert running.stats.rate_limited == len(limited)


def test_a_fixed_window_refuses_past_its_quota_until_its_end(
    fresh_sandbox: Callable[..., RunningSandbox],
) -> None:
    """``--window 30`` at 0.1/s: 3 requests a 30-s window, then 429 with Retry-After the window's
    end (not a token's next second); announced, the window's own RateLimit-* headers."""
    running = fresh_sandbox(clients=5, rate=0.1, window=30.0, announce_limits=True)
    with httpx.Client(base_url=running.url, auth=AUTH) as client:
        statuses = [client.get(P + "stores/storelist") for _ in range(5)]
    assert [r.status_code for r in statuses] == [200, 200, 200, 429, 429]
    assert 28 <= int(statuses[3].headers["Retry-After"]) <= 30
    assert statuses[0].headers["RateLimit-Policy"] == "3;w=30"
    assert statuses[2].headers["RateLimit-Remaining"] == "0"
    assert running.stats.rate_limited == 2


def test_a_cap_on_requests_in_flight_refuses_the_one_past_it(
    fresh_sandbox: Callable[..., RunningSandbox],
) -> None:
    """``--max-in-flight 2`` (200 ms latency): of 5 requests open at once, 2 are answered and 3
    refused at once with a 429; one at a time, none is."""
    running = fresh_sandbox(clients=5, max_in_flight=2, latency_ms=200)

    async def at_once() -> list[int]:
        async with httpx.AsyncClient(base_url=running.url, auth=AUTH) as client:
            answers = await asyncio.gather(*(client.get(P + "stores/storelist") for _ in range(5)))
        return sorted(r.status_code for r in answers)

    assert asyncio.run(at_once()) == [200, 200, 429, 429, 429]
    assert running.stats.over_in_flight == 3 and running.stats.peak_in_flight == 2
    with httpx.Client(base_url=running.url, auth=AUTH) as client:
        assert {client.get(P + "stores/storelist").status_code for _ in range(3)} == {200}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"window": 60.0}, "window needs a rate"),
        ({"rate": 20.0, "window": 60.0, "burst": 5.0}, "fixed window has none"),
        ({"rate": 20.0, "window": -1.0}, "window must be >= 0"),
        ({"max_in_flight": -1}, "max in flight"),
    ],
)
def test_limit_settings_that_cannot_be_are_refused(
    fresh_sandbox: Callable[..., RunningSandbox], config: dict[str, Any], message: str
) -> None:
    with pytest.raises(SettingsError, match=message):
        fresh_sandbox(clients=5, **config)


def test_the_stats_say_when_the_loop_was_held_back(fresh_sandbox: Callable[..., RunningSandbox]) -> None:
    """Case: the sandbox's loop blocked for 0.4 s (a busy process): its stats note a late wake-up
    of at least 0.3 s in that second (or the next, when the block straddled a second's end)."""
    running = fresh_sandbox(clients=5)
    blocked_at = int(time.monotonic())
    running.call(lambda _service: time.sleep(0.4))
    time.sleep(0.2)  # the watch wakes (late) and notes it
    late = dict(running.stats.loop_late_per_second)
    assert max(late.get(blocked_at, 0.0), late.get(blocked_at + 1, 0.0)) >= 0.3, late
    with httpx.Client(base_url=running.url) as client:
        served = client.get("/_sandbox/stats").json()["loop_late_per_second"]
    assert {int(k): v for k, v in served.items() if int(k) in late} == late


def is_faulty(response: httpx.Response | None) -> bool:
    if response is None:
        return True  # dropped connection
    if response.status_code != 200:
        return response.status_code in (500, 502, 503)
    try:
        orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return True
    return False


def fetch(client: httpx.Client, method: str, path: str, **kw: Any) -> httpx.Response | None:
    try:
        return client.request(method, path, **kw)
    except httpx.TransportError:
        return None


def test_fault_rate_one_faults_every_request(fresh_sandbox: Callable[..., RunningSandbox]) -> None:
    running = fresh_sandbox(clients=5, fault_rate=1.0)
    kinds: Counter[str] = Counter()
    with httpx.Client(base_url=running.url, auth=AUTH) as client:
        for _ in range(60):
            response = fetch(client, "GET", P + "stores/storelist")
            assert is_faulty(response)
            kinds["dropped" if response is None else str(response.status_code)] += 1
        for _ in range(20):  # even a request the service would refuse gets a fault instead
            assert is_faulty(fetch(client, "POST", P + "clients/insertcomment", json={}))
    assert set(kinds) == {"dropped", "200", "500", "502", "503"}, kinds  # every kind appears
    assert running.stats.faults_injected == 80
    assert set(running.stats.faults) >= set(FAULT_KINDS)


def test_fault_rate_share_and_writes_applied_before_failing(
    fresh_sandbox: Callable[..., RunningSandbox],
) -> None:
    running = fresh_sandbox(clients=5, fault_rate=0.3, seed=5)
    with httpx.Client(base_url=running.url, auth=AUTH) as client:
        faulty = sum(is_faulty(fetch(client, "GET", P + "setup/webdocs")) for _ in range(300))
    assert 45 <= faulty <= 135, faulty
    assert running.stats.faults_injected == faulty

    running = fresh_sandbox(clients=5, fault_rate=1.0, seed=9)
    number, emp = running.call(
        lambda s: (next(iter(s.clients)), s.store_employees[next(iter(s.stores))][0].emp_no)
    )
    with httpx.Client(base_url=running.url, auth=AUTH) as client:
        for i in range(40):
            fetch(
                client,
                "POST",
                P + "clients/insertcomment",
                json={"clientNumber": number, "empNo": emp, "text": str(i)},
            )
    stats = running.stats.faults
    written = running.call(lambda s: len(s.clients[number].comments))
    assert stats["write_applied"] > 0, "a 5xx or a dropped connection sometimes comes after the write"
    assert written == stats["write_applied"] + stats["truncated"]


def test_latency_is_added(fresh_sandbox: Callable[..., RunningSandbox]) -> None:
    running = fresh_sandbox(clients=5, latency_ms=150)
    started = time.perf_counter()
    assert httpx.get(running.url + P + "setup/webdocs", auth=AUTH).status_code == 200
    assert time.perf_counter() - started >= 0.15


# --- drift and tenant profiles ------------------------------------------------------------------------------


def test_drift_changes_the_look_not_the_meaning(fresh_sandbox: Callable[..., RunningSandbox]) -> None:
    drifted_sb = fresh_sandbox(clients=30, drift=True, anchor_date=ANCHOR)
    plain_sb = fresh_sandbox(clients=30, anchor_date=ANCHOR)
    numbers = plain_sb.call(lambda s: sorted(s.clients))
    statuses: set[str] = set()
    with (
        httpx.Client(base_url=drifted_sb.url, auth=AUTH) as drifted,
        httpx.Client(base_url=plain_sb.url, auth=AUTH) as plain,
    ):
        calls = [("memberships/eftdrawdays", {}, "types"), ("clients/search", {"lastName": "a"}, "clients")]
        calls += [("clients/clientmemberships", {"clientNumber": n}, "memberships") for n in numbers]
        for path, params, key in calls:
            d_body = drifted.get(P + path, params=params).json()
            n_body = plain.get(P + path, params=params).json()
            assert d_body["serverNode"] and d_body["rowVersion"]  # unannounced top-level fields
            for d_item, n_item in zip(d_body[key], n_body[key], strict=True):
                assert set(d_item) - set(n_item) == {"rowVersion", "legacyCode"}
                for name, value in n_item.items():
                    if isinstance(value, int | float) and not isinstance(value, bool):
                        assert isinstance(d_item[name], str) and Decimal(d_item[name]) == Decimal(str(value))
                    elif name == "status":
                        assert d_item[name].lower() == value.lower()
                        statuses.add(d_item[name])
            if path == "clients/search":
                assert d_body["totalCount"] == str(n_body["totalCount"])
    assert statuses - set(catalogue.MEMBERSHIP_STATUSES), statuses  # some in another casing


def test_a_tenant_with_other_wire_names_end_to_end(
    tmp_path: Path, fresh_sandbox: Callable[..., RunningSandbox]
) -> None:
    toml = tmp_path / "tenant.toml"
    toml.write_text(
        '[params]\nclientNumber = "clientNo"\nmodifiedSince = "changedSince"\n'
        '[paging]\npage = "pg"\npageSize = "size"\ntotalCount = "total"\nfirst_page = 0\n'
        '[wrappers]\nclientdetails = "data"\nsearch = "results"\n'
        '[fields.client]\nfirstName = "first_name"\n'
        '[fields.clientSummary]\nclientNumber = "id"\n'
        '[fields.transactionLine]\npricePerUnit = "unitPrice"\n'
        '[fields.insert_comment]\ncommentId = "id"\n',
        encoding="utf-8",
    )
    running = fresh_sandbox(clients=40, profile=Profile.load(toml), anchor_date=ANCHOR)
    with httpx.Client(base_url=running.url, auth=AUTH) as client:
        page0 = client.get(
            P + "clients/search", params={"changedSince": "2000-01-01T00:00:00Z", "size": 10}
        ).json()
        assert (page0["pg"], page0["size"], page0["total"]) == (0, 10, 40)
        first = page0["results"][0]["id"]
        assert first == running.call(lambda s: min(s.clients))
        page1 = client.get(
            P + "clients/search", params={"changedSince": "2000-01-01T00:00:00Z", "size": 10, "pg": 1}
        )
        assert page1.json()["results"][0]["id"] != first
        details = client.get(P + "clients/clientdetails", params={"clientNo": first}).json()
        assert (
            set(details) == {"data"}
            and "first_name" in details["data"]
            and "firstName" not in details["data"]
        )
        assert client.get(P + "clients/clientdetails", params={"clientNumber": first}).status_code == 400
        who = running.call(lambda s: next(c.client_number for c in s.clients.values() if c.transactions))
        lines = [
            ln
            for t in client.get(P + "clients/transactionhistory", params={"clientNo": who}).json()[
                "transactions"
            ]
            for ln in t["lines"]
        ]
        assert lines and all("unitPrice" in ln and "pricePerUnit" not in ln for ln in lines)
        emp = running.call(lambda s: s.store_employees[next(iter(s.stores))][0].emp_no)
        answer = client.post(
            P + "clients/insertcomment", json={"clientNumber": first, "empNo": emp, "text": "hi"}
        )
        assert set(answer.json()) == {"id"}


# --- data: determinism and coverage ------------------------------------------------------------------------


def snapshot(service: Service) -> list[Any]:
    out: list[Any] = [
        service.storelist(),
        service.packagelist(),
        service.products(next(iter(service.stores))),
    ]
    for number in sorted(service.clients):
        out += [
            service.clientdetails(number),
            service.ledgerbalance(number),
            service.clientmemberships(number),
            service.clientpackages(number),
            service.pointsbalance(number),
            service.billinginfo(number),
            service.transactionhistory(number),
            service.commprefs(number),
        ]
    for ledger in out:
        for item in ledger if isinstance(ledger, list) else [ledger]:
            if isinstance(item, dict):
                item.pop("asOf", None)  # today's date, not data
    return out


def test_same_seed_same_data_whatever_the_order_of_first_use() -> None:
    eager = population.generate(11, 120, 4, ANCHOR)
    eager.materialize_all()
    lazy = population.generate(11, 120, 4, ANCHOR)
    for number in reversed(sorted(lazy.clients)):  # first use in another order
        lazy.clientpackages(number)
    assert snapshot(eager) == snapshot(lazy)
    other = population.generate(12, 120, 4, ANCHOR)
    assert snapshot(other) != snapshot(eager)


@pytest.mark.parametrize("seed", [42, 7])
def test_generated_data_covers_what_clients_must_cope_with(seed: int) -> None:
    """200 clients (the session fixture's size) show every case, whatever the seed."""

    def facts(s: Service) -> dict[str, Any]:
        s.materialize_all()
        txns = list(s.transactions.values())
        return {
            "statuses": {(m.status, m.is_eft) for m in s.memberships.values()},
            "trailing": [c for c in s.stores if c.endswith(" ")],
            "inner": [c for c in s.stores if " " in c.strip()],
            "leading_zero": sum(n.startswith("0") for n in s.clients),
            "voided": sum(t.voided for t in txns),
            "line_types": {ln.type for t in txns for ln in t.lines},
            "styles": {t.wire_style for t in txns},
            "shared": sum(len(v) for v in s.shares.values()),
            "owed": sum(b > 0 for c in s.clients.values() for b in c.ledger.values()),
            "credit": sum(b < 0 for c in s.clients.values() for b in c.ledger.values()),
            "zero": sum(b == 0 for c in s.clients.values() for b in c.ledger.values()),
            "multi_store": sum(len(c.ledger) > 1 for c in s.clients.values()),
            "billing": {a.type for a in s.billing_accounts.values()},
            "points": sum(len(c.points_transactions) for c in s.clients.values()),
            "redeemed": sum(p.points < 0 for c in s.clients.values() for p in c.points_transactions),
            "unpaid": sum(not t.payments for t in txns),
            "former_staff": sum(not e.active for v in s.store_employees.values() for e in v),
            "two_decimals": all(
                ln.amount == ln.amount.quantize(Decimal("0.01")) for t in txns for ln in t.lines
            ),
            "before_floor": all(c.last_modified < s.floor for c in s.clients.values()),
            "ms_before_client": all(
                m.last_modified <= s.clients[m.client_number].last_modified for m in s.memberships.values()
            ),
            "history_days": (s.anchor - min(t.local_datetime.date() for t in txns)).days,
            "recent_share": sum((s.anchor - t.local_datetime.date()).days <= 731 for t in txns) / len(txns),
            "shares_fit": all(
                s.memberships[mid].start_date <= s.affiliated[mid].purchase_date <= day
                and day <= s.clients[sharee].last_modified.date()
                for mid, shared in s.shares.items()
                for sharee, day in shared.items()
            ),
            "txns_before_client": all(
                t.local_datetime.date() < s.clients[t.client_number].last_modified.date() for t in txns
            ),
        }

    f = facts(population.generate(seed, 200, 5, ANCHOR))
    for status in catalogue.MEMBERSHIP_STATUSES:
        assert (status, True) in f["statuses"], status
    assert {s for s, eft in f["statuses"] if not eft} >= {"Active", "Expired"}
    assert f["trailing"] and f["inner"] and f["leading_zero"] > 100
    assert f["voided"] and f["shared"] and f["points"] and f["redeemed"] and f["unpaid"] and f["former_staff"]
    assert f["line_types"] == set(catalogue.TRANSACTION_TYPES)
    assert f["styles"] == {"local", "offset", "utc"}
    assert f["owed"] and f["credit"] and f["zero"] and f["multi_store"]
    assert f["billing"] == {"CARD", "CHECKING"}
    assert f["two_decimals"] and f["before_floor"] and f["ms_before_client"]
    assert f["shares_fit"] and f["txns_before_client"]
    assert 400 <= f["history_days"] <= 1200 and f["recent_share"] > 0.9  # ~2 years (idle clients: older)


def test_money_and_datetimes_on_the_wire(sandbox: RunningSandbox) -> None:
    kinds: set[type] = set()
    styles: set[str] = set()
    with httpx.Client(base_url=sandbox.url, auth=AUTH) as client:
        for number in sandbox.call(lambda s: sorted(s.clients))[:80]:
            body = client.get(P + "clients/transactionhistory", params={"clientNumber": number}).json()
            for txn in body["transactions"]:
                kinds |= {type(ln["amount"]) for ln in txn["lines"]}
                date = txn["transactionDate"]
                styles.add("Z" if date.endswith("Z") else "offset" if len(date) > 19 else "local")
                truth = sandbox.call(
                    lambda s, r=txn["receiptNumber"]: (s.transactions[r], s.zone(s.transactions[r].storecode))
                )
                parsed = dt.datetime.fromisoformat(date.replace("Z", "+00:00"))
                if parsed.tzinfo is not None:
                    parsed = parsed.astimezone(truth[1]).replace(tzinfo=None)
                assert parsed == truth[0].local_datetime  # the same instant in every style
    assert {float, str} <= kinds
    assert styles == {"Z", "offset", "local"}


# --- the command line ---------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_membersync_sandbox_answers_curl() -> None:
    exe = Path(sys.executable).with_name("membersync")
    port = free_port()
    process = subprocess.Popen(
        [str(exe), "sandbox", "--port", str(port), "--clients", "200", "--password", "pw-not-in-logs"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        answer = None
        while time.monotonic() < deadline:
            run = subprocess.run(
                [
                    "curl",
                    "-s",
                    "-f",
                    "-u",
                    "sandbox:pw-not-in-logs",
                    f"http://127.0.0.1:{port}/svcapi/stores/storelist",
                ],
                capture_output=True,
            )
            if run.returncode == 0:
                answer = json.loads(run.stdout)
                break
            assert process.poll() is None, process.stdout.read() if process.stdout else ""
            time.sleep(0.2)
        assert answer is not None, "the sandbox did not answer within 60 s"
        assert list(answer) == ["stores"] and len(answer["stores"]) == 5
        assert all(set(s) == FIELDS["storeInfo"] and len(s["storecode"]) == 10 for s in answer["stores"])
        denied = subprocess.run(
            [
                "curl",
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                f"http://127.0.0.1:{port}/svcapi/stores/storelist",
            ],
            capture_output=True,
        )
        assert denied.stdout == b"401"
    finally:
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=30)
    assert process.returncode == 0, out
    log = out.decode()
    assert f"http://127.0.0.1:{port}/svcapi/" in log and "clients=200" in log
    assert "pw-not-in-logs" not in log


def test_cli_rejects_bad_settings_with_one_line() -> None:
    exe = Path(sys.executable).with_name("membersync")
    run = subprocess.run(
        [str(exe), "sandbox", "--fault-rate", "1.5"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        timeout=60,
    )
    assert run.returncode == 2
    assert "fault rate" in run.stderr and "Traceback" not in run.stderr


def test_config_checked() -> None:
    assert SandboxConfig.checked(clients=3).clients == 3
    for bad_kw, words in (
        ({"clients": 0}, "clients"),
        ({"rate": -1}, "rate"),
        ({"latency_ms": -5}, "latency"),
        ({"username": "a:b"}, "username"),
        ({"password": ""}, "password"),
        ({"burst": 0.5}, "burst"),
        ({"colour": "red"}, "colour"),
    ):
        with pytest.raises(SettingsError, match=words):
            SandboxConfig.checked(**bad_kw)
    assert "hunter2" not in repr(SandboxConfig(password="hunter2"))
    assert "hunter2" not in SandboxConfig(password="hunter2").describe()
    assert "canary-user" not in SandboxConfig(username="canary-user").describe()
