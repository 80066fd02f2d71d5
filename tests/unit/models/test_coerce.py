"""Typing wire items into Arrow: exactness, verbatim ids, store-local times, extra, secrets, quarantine.

The fuzz (hypothesis) throws malformed JSON-shaped items at every landed table: no exception
may escape, every item ends as exactly one typed row or one quarantined row, and no secret
reaches either.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from membersync.models.coerce import (
    BatchBuilder,
    TimezoneLookup,
    explode_transactions,
    quarantine_table,
    to_arrow,
)
from membersync.models.tables import SECRET_FIELDS, TABLES, TYPED_QUARANTINE_SCHEMA, table

CLIENT = {"clientNumber": "000417"}
CANARY = "CANARY-SECRET-41d9"
NY = TimezoneLookup({"DOWNTOWN  ": "America/New_York", "TOKYO     ": "Asia/Tokyo"})


def money_of(value: Any) -> Decimal | str:
    landed = to_arrow("ledger_balances", [{"storecode": "DOWNTOWN  ", "balance": value}], CLIENT)
    if landed.quarantine:
        return "quarantined: " + landed.quarantine[0].reason
    return landed.table["balance"][0].as_py()


# --- money ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wire", "exact"),
    [
        (42.5, "42.50"),
        ("42.50", "42.50"),
        (-10, "-10.00"),
        ("-10", "-10.00"),
        (0.1, "0.10"),
        (19.99, "19.99"),
        (-0.01, "-0.01"),
        ("-.5", "-0.50"),
        ("+7.1", "7.10"),
        ("12.500", "12.50"),  # trailing zeros: still exact to the cent
        (1234567890123.45, "1234567890123.45"),
        ("9999999999999999.99", "9999999999999999.99"),  # the largest decimal(18,2)
        (10**15, "1000000000000000.00"),
    ],
)
def test_money_is_exact(wire: Any, exact: str) -> None:
    assert money_of(wire) == Decimal(exact)


@pytest.mark.parametrize(
    ("wire", "why"),
    [
        (1.005, "more than 2 decimals"),
        ("1.005", "more than 2 decimals"),
        (0.1 + 0.2, "more than 2 decimals"),  # 0.30000000000000004: no silent rounding
        (5e-05, "more than 2 decimals"),
        (1e20, "range"),
        (10**16, "range"),
        ("10000000000000000.00", "range"),
        (12345678901234.56, "exact as a JSON number"),  # a double cannot hold 16 digits
        (float("nan"), "finite"),
        (float("inf"), "finite"),
        (-1e300, "range"),
        ("1e5", "money"),
        ("12,50", "money"),
        (" 12.50", "money"),
        ("١٢", "money"),  # Arabic-Indic digits: int() would accept them, the contract does not
        (True, "money"),
        ([], "money"),
    ],
)
def test_bad_money_is_quarantined(wire: Any, why: str) -> None:
    result = money_of(wire)
    assert isinstance(result, str) and result.startswith("quarantined: balance:") and why in result


def test_money_sums_exactly_to_the_cent() -> None:
    items = [{"storecode": f"S{i:09d}", "balance": 0.1} for i in range(10)]
    items += [{"storecode": f"T{i:09d}", "balance": "0.20"} for i in range(10)]
    landed = to_arrow("ledger_balances", items, CLIENT)
    assert sum(landed.table["balance"].to_pylist()) == Decimal("3.00")
    assert landed.table.schema.field("balance").type == pa.decimal128(18, 2)


# --- ids, ints, enums, bools, lists ---------------------------------------------------------------


def test_ids_and_storecodes_are_byte_exact() -> None:
    items = [
        {"membershipId": "0000123", "storecode": "DOWNTOWN  ", "membershipTypeId": " 07 "},
        {"membershipId": "ÄÖ-ß-✓", "storecode": "  MALL    "},
    ]
    landed = to_arrow("memberships", items, {"clientNumber": "000417"})
    rows = landed.table.to_pylist()
    assert [r["client_number"] for r in rows] == ["000417", "000417"]
    assert [r["membership_id"] for r in rows] == ["0000123", "ÄÖ-ß-✓"]
    assert [r["storecode"] for r in rows] == ["DOWNTOWN  ", "  MALL    "]
    assert rows[0]["membership_type_id"] == " 07 "


def test_an_id_sent_as_a_number_is_quarantined_not_cast() -> None:
    landed = to_arrow("memberships", [{"membershipId": 123}], CLIENT)
    assert landed.table.num_rows == 0
    # the reason names the column and the kind; the value stays in the raw JSON only (issue 59, 5)
    assert landed.quarantine[0].reason == "membership_id: expected a string, got int (3 characters)"
    assert "123" in landed.quarantine[0].raw


def test_points_ints_enums_bools_and_lists() -> None:
    landed = to_arrow(
        "points_balances", [{"storecode": "A", "points": "-120"}, {"storecode": "B", "points": 7.0}], CLIENT
    )
    assert landed.table["points"].to_pylist() == [-120, 7]
    assert to_arrow("points_balances", [{"storecode": "A", "points": 2**63}], CLIENT).quarantine
    assert to_arrow("points_balances", [{"storecode": "A", "points": 1.5}], CLIENT).quarantine
    assert to_arrow("points_balances", [{"storecode": "A", "points": True}], CLIENT).quarantine
    statuses = ["Active", "ACTIVE", "frozen", "Suspended-By-Vendor", ""]
    landed = to_arrow(
        "memberships", [{"membershipId": str(i), "status": s} for i, s in enumerate(statuses)], CLIENT
    )
    assert landed.table["status"].to_pylist() == statuses  # unknown values verbatim
    prefs = to_arrow(
        "comm_prefs", {"email": True, "sms": "false", "mail": None}, CLIENT
    )  # an unwrapped object
    assert prefs.table.to_pylist()[0] | {"extra": None} == {
        "client_number": "000417",
        "email": True,
        "sms": False,
        "mail": None,
        "phone": None,
        "marketing": None,
        "extra": None,
    }
    questions = to_arrow("profile_questions", [{"questionId": "Q1", "choices": ["a", "b"]}], {})
    assert questions.table["choices"].to_pylist() == [["a", "b"]]
    assert to_arrow("profile_questions", [{"questionId": "Q1", "choices": ["a", 1]}], {}).quarantine


# --- dates and times -------------------------------------------------------------------------------


def local_of(value: str, store: str = "DOWNTOWN  ", tz: TimezoneLookup | None = NY) -> dt.datetime | str:
    item = {"pointsTransactionId": "P1", "points": 1, "storecode": store, "date": value}
    landed = to_arrow("points_transactions", [item], CLIENT, tz)
    if landed.quarantine:
        return "quarantined: " + landed.quarantine[0].reason
    return landed.table["date"][0].as_py()


def test_store_local_datetimes() -> None:
    assert local_of("2026-03-08T09:15:00") == dt.datetime(2026, 3, 8, 9, 15)  # naive: kept as is
    assert local_of("2026-03-08") == dt.datetime(2026, 3, 8)  # a plain date is midnight
    # an offset or Z is honoured: that instant, in the store's timezone (DST began at 2am)
    assert local_of("2026-03-08T12:00:00Z") == dt.datetime(2026, 3, 8, 8, 0)
    assert local_of("2026-03-08T06:30:00Z") == dt.datetime(2026, 3, 8, 1, 30)
    assert local_of("2026-03-08T07:00:00-05:00") == dt.datetime(2026, 3, 8, 8, 0)
    assert local_of("2026-11-20T23:30:00+01:00", store="TOKYO     ") == dt.datetime(2026, 11, 21, 7, 30)
    # unknown store, or no lookup at all: UTC
    assert local_of("2026-03-08T12:00:00+02:00", store="NOWHERE   ") == dt.datetime(2026, 3, 8, 10, 0)
    assert local_of("2026-03-08T12:00:00+02:00", tz=None) == dt.datetime(2026, 3, 8, 10, 0)
    assert local_of("2026-03-08T12:00:00.250000") == dt.datetime(2026, 3, 8, 12, 0, 0, 250000)
    for bad in (
        "2026-02-30",
        "2026-03-08T25:00:00",
        "08/03/2026",
        "2026-W10-1",
        "20260308",
        "2026-03-08T12:00",
    ):
        assert str(local_of(bad)).startswith("quarantined: date:")


def test_utc_timestamps_and_dates() -> None:
    landed = to_arrow(
        "clients",
        [
            {"lastModified": "2026-11-21T01:59:58Z", "birthDate": "1990-02-28", "createdDate": "2026-01-01"},
            {"lastModified": "2026-11-21T03:59:58+02:00"},
        ],
        CLIENT,
    )
    assert landed.table.schema.field("last_modified").type == pa.timestamp("us", tz="UTC")
    moments = landed.table["last_modified"].to_pylist()
    assert moments[0] == moments[1] == dt.datetime(2026, 11, 21, 1, 59, 58, tzinfo=dt.UTC)
    assert landed.table["birth_date"][0].as_py() == dt.date(1990, 2, 28)
    assert to_arrow("clients", [{"birthDate": "1990-02-29"}], CLIENT).quarantine
    # an offset that moves the instant outside years 1..9999 is quarantined, not stored broken
    for edge in ("0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00"):
        assert "out of range" in to_arrow("clients", [{"lastModified": edge}], CLIENT).quarantine[0].reason
        assert str(local_of(edge)).startswith("quarantined: date: datetime out of range")


def test_timezone_lookup_from_the_store_list() -> None:
    tz = TimezoneLookup.from_stores(
        [
            {"storecode": "A         ", "timezone": "Europe/Paris"},
            {"storecode": "B"},
            "junk",
            {"timezone": "X/Y"},
        ]
    )
    assert str(tz.zone("A         ")) == "Europe/Paris"
    assert tz.zone("B") is dt.UTC and tz.zone(None) is dt.UTC
    assert TimezoneLookup({"C": "Not/AZone"}).zone("C") is dt.UTC  # a bad zone name: UTC, no crash


# --- extra and secrets -------------------------------------------------------------------------------


def test_unknown_fields_land_in_extra_and_secrets_nowhere() -> None:
    item = {
        "billingAccountId": "BA1",
        "lastFour": "4242",
        "tokenId": CANARY,
        "vaultToken": CANARY,
        "accountNo": CANARY,
        "routingNo": CANARY,
        "newField": {"a": [1, 2.5, None], "Password": CANARY, "deep": [{"api_key": CANARY, "keep": "x"}]},
        "ñ": "ü",
    }
    landed = to_arrow("billing_accounts", [item], CLIENT)
    row = landed.table.to_pylist()[0]
    assert json.loads(row["extra"]) == {"newField": {"a": [1, 2.5, None], "deep": [{"keep": "x"}]}, "ñ": "ü"}
    assert CANARY not in json.dumps(row, default=str)
    assert set(landed.table.column_names).isdisjoint(SECRET_FIELDS)
    for t in TABLES:  # an allowlist: no secret is a column source anywhere
        assert t.sources.isdisjoint(SECRET_FIELDS), t.name


def test_processor_credentials_keep_no_secret() -> None:
    items = [
        {"processor": "Acme", "merchantId": "m-1", "username": CANARY, "password": CANARY, "apiKey": CANARY}
    ]
    landed = to_arrow("processor_credentials", items, {"@storecode": "DOWNTOWN  ", "@type": "EFT"})
    assert landed.table.to_pylist() == [
        {
            "query_storecode": "DOWNTOWN  ",
            "credential_type": "EFT",
            "processor": "Acme",
            "merchant_id": "m-1",
            "extra": None,
        }
    ]


def test_quarantined_raw_json_is_scrubbed() -> None:
    items = [
        {"billingAccountId": None, "tokenId": CANARY, "x": [{"routingNo": CANARY}]},
        [{"password": CANARY}],
    ]
    landed = to_arrow("billing_accounts", items, CLIENT)
    assert len(landed.quarantine) == 2
    for row in landed.quarantine:
        assert CANARY not in row.raw and CANARY not in row.reason
        assert row.table_name == "billing_accounts" and row.client_number == "000417"
    assert json.loads(landed.quarantine[0].raw) == {"billingAccountId": None, "x": [{}]}
    assert "missing required field 'billingAccountId'" in landed.quarantine[0].reason
    assert landed.quarantine[1].reason == "expected an object, got list"
    q = quarantine_table(landed.quarantine)
    assert q.schema.equals(TYPED_QUARANTINE_SCHEMA) and q.num_rows == 2


def test_missing_context_is_a_caller_error() -> None:
    with pytest.raises(ValueError, match="@storecode"):
        to_arrow("payment_types", [{"code": "CASH"}], {})


# --- transactions --------------------------------------------------------------------------------------


def receipt(number: str, **over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "receiptNumber": number,
        "transactionDate": "2026-03-08T12:00:00Z",
        "storecode": "DOWNTOWN  ",
        "empNo": "E1",
        "status": "Saved",
        "lines": [
            {
                "lineNo": 1,
                "type": "PRODUCT",
                "productNumber": "P1",
                "quantity": 2,
                "pricePerUnit": 12.5,
                "amount": 25,
                "tax": "2.06",
            },
            {
                "lineNo": 2,
                "type": "PACKAGE",
                "packageId": "PK1",
                "quantity": 1,
                "pricePerUnit": "50",
                "amount": 50.0,
                "tax": 0,
            },
        ],
        "payments": [
            {
                "paymentId": f"{number}-P",
                "paymentType": "CARD",
                "amount": "77.06",
                "date": "2026-03-08T07:05:00-05:00",
            }
        ],
    }
    body.update(over)
    return body


def test_transaction_history_explodes_into_three_keyed_tables() -> None:
    out = explode_transactions(
        [receipt("R1"), receipt("R2", lines=[], payments=None, newThing=1)], "000417", NY
    )
    assert set(out) == {"transactions", "transaction_lines", "transaction_payments"}
    tx = out["transactions"].table.to_pylist()
    assert [r["receipt_number"] for r in tx] == ["R1", "R2"]
    assert tx[0]["transaction_date"] == dt.datetime(2026, 3, 8, 8, 0)  # Z -> New York wall clock
    assert tx[0]["extra"] is None and json.loads(tx[1]["extra"]) == {
        "newThing": 1
    }  # lines/payments not extra
    lines = out["transaction_lines"].table.to_pylist()
    assert [(r["client_number"], r["receipt_number"], r["line_no"]) for r in lines] == [
        ("000417", "R1", 1),
        ("000417", "R1", 2),
    ]
    assert sum(r["amount"] + r["tax"] for r in lines) == Decimal("77.06")
    payments = out["transaction_payments"].table.to_pylist()
    assert payments[0]["payment_id"] == "R1-P" and payments[0]["receipt_number"] == "R1"
    assert payments[0]["date"] == dt.datetime(2026, 3, 8, 8, 5)  # the transaction's store decides


def test_a_receipt_lands_whole_or_is_quarantined_whole() -> None:
    bad_line = receipt("R2")
    bad_line["lines"][1]["amount"] = "50.001"
    out = explode_transactions(
        [receipt("R1"), bad_line, receipt("R3", payments="cash"), receipt(None), 17],  # type: ignore[arg-type]
        "000417",
    )
    assert out["transactions"].table["receipt_number"].to_pylist() == ["R1"]
    assert out["transaction_lines"].table.num_rows == 2 and out["transaction_payments"].table.num_rows == 1
    reasons = [q.reason for q in out["transactions"].quarantine]
    assert reasons == [
        "transaction_lines[1]: amount: money with more than 2 decimals: (8 characters)",
        "payments: expected an array, got str",
        "receipt_number: missing required field 'receiptNumber'",
        "expected an object, got int",
    ]
    assert all(q.table_name == "transactions" for q in out["transactions"].quarantine)
    assert out["transaction_lines"].quarantine == [] and out["transaction_payments"].quarantine == []


def test_empty_history_still_yields_the_three_tables() -> None:
    out = explode_transactions([], "000417")
    assert {k: v.rows for k, v in out.items()} == {
        "transactions": 0,
        "transaction_lines": 0,
        "transaction_payments": 0,
    }
    for name, landed in out.items():
        assert landed.table.schema.equals(table(name).schema)


def test_batch_builder_accumulates_across_requests() -> None:
    builder = BatchBuilder(NY)
    for n in range(5):
        builder.add(
            "memberships", [{"membershipId": f"M{n}", "monthlyDues": n}], {"clientNumber": f"{n:06d}"}
        )
        builder.add_transactions([receipt(f"R{n}")], f"{n:06d}")
    built = builder.build()
    assert built["memberships"].table["client_number"].to_pylist() == [f"{n:06d}" for n in range(5)]
    assert built["transaction_lines"].rows == 10
    assert builder.build() == {}  # emptied


# --- the fuzz ---------------------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)  # any unicode, lone surrogates included
    | st.sampled_from(
        [
            "",
            " ",
            "0001",
            "DOWNTOWN  ",
            "42.50",
            "1.005",
            "2026-03-08",
            "2026-03-08T12:00:00Z",
            "2026-02-30",
            "-0",
            "1e400",
            "\x00",
            "𝟘𝟙",
            "١٢",
        ]
    )
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=6,
)
# Field values: mostly scalars of the wrong (or right) type, sometimes shallow containers.
field_values = (
    json_scalars
    | st.lists(json_scalars, max_size=3)
    | st.dictionaries(st.text(max_size=4), json_scalars, max_size=2)
)


_instants = st.datetimes()  # years 1..9999: an offset may push the instant out of range
_offsets = st.sampled_from(["", "Z", "+05:30", "-11:00", "+14:00"])
PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "id": st.text(max_size=10) | st.sampled_from(["000417", "DOWNTOWN  "]),
    "text": st.text(max_size=10),
    "enum": st.sampled_from(["Active", "FROZEN", "onhold", "Weird"]) | st.text(max_size=5),
    "money": st.decimals(min_value=-(10**17), max_value=10**17, places=2, allow_nan=False).map(str)
    | st.floats(min_value=-1e14, max_value=1e14)
    | st.integers(-(10**17), 10**17),
    "int": st.integers(-(2**64), 2**64) | st.integers(-50, 50).map(str),
    "bool": st.booleans() | st.sampled_from(["true", "False"]),
    "date": st.dates().map(dt.date.isoformat),
    "local_ts": st.tuples(_instants, _offsets).map(lambda p: p[0].isoformat(timespec="seconds") + p[1]),
    "utc_ts": st.tuples(_instants, _offsets).map(lambda p: p[0].isoformat(timespec="seconds") + p[1]),
    "text_list": st.lists(st.text(max_size=4), max_size=3),
}


@st.composite
def malformed_items(draw: st.DrawFn, fields: list[tuple[str, str]]) -> Any:
    """Items shaped like the table's records: mostly plausible values (so the typed path is
    fuzzed too), with wrong types, nulls, missing keys, extra keys and secrets mixed in."""
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)  # not even an object
    item: dict[str, Any] = {}
    for name, kind in fields:
        choice = draw(st.integers(0, 5))
        if choice <= 3:
            item[name] = draw(PLAUSIBLE[kind])
        elif choice == 4:
            item[name] = draw(field_values)
    for secret in draw(st.lists(st.sampled_from(sorted(SECRET_FIELDS)), max_size=3)):
        item[secret] = CANARY
    extra = draw(st.dictionaries(st.text(max_size=6), json_values, max_size=2))  # nested garbage
    for key, value in extra.items():
        item.setdefault(key, value)
    if draw(st.booleans()):
        item["nested"] = {"apiKey": CANARY, "list": [{"vaultToken": CANARY}]}
    return item


ITEM_FIELDS = {
    t.name: sorted((c.source, c.kind) for c in t.columns if not c.source.startswith("@")) for t in TABLES
}
CONTEXT = {"clientNumber": "000417", "@storecode": "DOWNTOWN  ", "@type": "POS", "@membershipId": "M1"}


def assert_clean(landed_table: pa.Table, quarantine: list[Any]) -> None:
    text = json.dumps(landed_table.to_pylist(), default=str) + json.dumps([q.raw for q in quarantine])
    assert CANARY not in text
    for q in quarantine:
        assert CANARY not in q.reason
        json.loads(q.raw)  # always valid JSON
    quarantine_table(quarantine)  # always buildable (valid UTF-8)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_any_json_shaped_item_lands_or_is_quarantined(data: st.DataObject) -> None:
    target = data.draw(st.sampled_from([t for t in TABLES if not t.name.startswith("transaction")]))
    items = data.draw(st.lists(malformed_items(ITEM_FIELDS[target.name]), max_size=5))
    landed = to_arrow(target, items, CONTEXT, NY)
    assert landed.table.schema.equals(target.schema)
    assert landed.table.num_rows + len(landed.quarantine) == len(items)
    landed.table.validate(full=True)
    landed.table.to_pylist()  # every value reads back into Python
    event(f"rows typed: {min(landed.table.num_rows, 2)}, quarantined: {min(len(landed.quarantine), 2)}")
    assert_clean(landed.table, landed.quarantine)
    # and it really is writable as Parquet
    sink = pa.BufferOutputStream()
    import pyarrow.parquet as pq

    pq.write_table(landed.table, sink)


RECEIPT_FIELDS = ITEM_FIELDS["transactions"]
LINE_FIELDS = [*ITEM_FIELDS["transaction_lines"], ("receiptNumber", "id")]
PAYMENT_FIELDS = ITEM_FIELDS["transaction_payments"]


@st.composite
def malformed_receipts(draw: st.DrawFn) -> Any:
    item = draw(malformed_items(RECEIPT_FIELDS))
    if isinstance(item, dict):
        if draw(st.booleans()):
            item["receiptNumber"] = draw(st.sampled_from(["R1", "000123"]))
        item["lines"] = draw(st.lists(malformed_items(LINE_FIELDS), max_size=3) | json_values)
        item["payments"] = draw(st.lists(malformed_items(PAYMENT_FIELDS), max_size=2) | json_values)
    return item


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(malformed_receipts(), max_size=4))
def test_fuzz_transaction_history(items: list[Any]) -> None:
    out = explode_transactions(items, "000417", NY)
    tx = out["transactions"]
    assert tx.rows + len(tx.quarantine) == len(items)
    for name, landed in out.items():
        assert landed.table.schema.equals(table(name).schema)
        assert_clean(landed.table, landed.quarantine)
    receipts = set(tx.table["receipt_number"].to_pylist())
    assert set(out["transaction_lines"].table["receipt_number"].to_pylist()) <= receipts  # no orphan lines


def test_raw_json_of_odd_values_never_fails() -> None:
    deep: Any = []
    for _ in range(5000):
        deep = [deep]
    odd = [{"a": 2**100}, {"s": "\ud800"}, {1: "int key"}, deep, {"b": b"bytes"}, float("nan")]
    landed = to_arrow("memberships", odd, CLIENT)
    assert len(landed.quarantine) == len(odd)
    for row in landed.quarantine:
        json.loads(row.raw)
        row.raw.encode("utf-8")
    assert orjson.loads(landed.quarantine[0].raw) == {"a": 2**100} or "2" in landed.quarantine[0].raw
