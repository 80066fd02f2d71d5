"""Facts declared once, and the copies that must follow them (issue 11).

The catalogue (``extract/catalogue.py``) declares the contract's enumerations, secret fields
and endpoints; the landed tables (``models/tables.py``) declare what lands. Where another
layer must spell a fact again (the SQL, its YAML tests, the report exports), a test here fails
as soon as the copy drifts.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from membersync.extract import catalogue, redact
from membersync.flows import batches as B
from membersync.models import tables as T
from membersync.warehouse.export import REPORTS

SQL = Path(__file__).resolve().parent.parent / "sql"


def normalised_status(status: str) -> str:
    """The staging model's rule: lower-case, without spaces, '_' or '-'; OnHold -> on_hold."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", status).lower()


STATUS_BUCKETS = [normalised_status(s) for s in catalogue.MEMBERSHIP_STATUSES] + ["other"]


def _accepted_values(yml: Path, column: str) -> list[list[Any]]:
    found = []
    models = yaml.safe_load(yml.read_text()).get("models")
    for model in models if isinstance(models, list) else []:
        for col in model.get("columns", []):
            if col["name"] != column:
                continue
            for test in col.get("data_tests", col.get("tests", [])) or []:
                if isinstance(test, dict) and "accepted_values" in test:
                    spec = test["accepted_values"]
                    found.append(spec.get("arguments", spec)["values"])
    return found


def test_membership_statuses_in_the_sql_follow_the_catalogue() -> None:
    assert STATUS_BUCKETS == ["active", "frozen", "on_hold", "canceled", "expired", "other"]
    lists = [v for yml in SQL.rglob("_*.yml") for v in _accepted_values(yml, "status")]
    status_lists = [v for v in lists if "active" in v]
    assert status_lists, "no accepted_values test on a membership status column"
    for values in status_lists:
        assert values == STATUS_BUCKETS
    staging = (SQL / "staging" / "stg_memberships.sql").read_text()
    for status in catalogue.MEMBERSHIP_STATUSES:
        squashed = status.lower()
        assert f"when '{squashed}' then '{normalised_status(status)}'" in staging, status


def test_the_status_report_columns_follow_the_catalogue() -> None:
    total = REPORTS["frozen_memberships_by_store"].total
    assert total is not None and list(total.sums) == STATUS_BUCKETS
    daily = (SQL / "reports" / "membership_status_daily.sql").read_text()
    for rank, bucket in enumerate(STATUS_BUCKETS, start=1):
        assert f"('{bucket}', {rank})" in daily, bucket


def test_line_types_in_the_sql_follow_the_catalogue() -> None:
    lists = [v for yml in SQL.rglob("_*.yml") for v in _accepted_values(yml, "type")]
    assert [*catalogue.TRANSACTION_TYPES, "other"] in lists


def test_secret_fields_are_one_set_everywhere() -> None:
    assert T.SECRET_FIELDS is catalogue.SECRET_FIELDS
    assert set(redact.SECRET_FIELD_NAMES) == set(catalogue.SECRET_FIELDS) | {"authorization"}
    for table in T.TABLES:  # no landed column is fed from a secret field
        assert {c.source for c in table.columns}.isdisjoint(catalogue.SECRET_FIELDS), table.name


def test_every_landed_table_is_filled_by_a_catalogue_endpoint_and_staged() -> None:
    sources = yaml.safe_load((SQL / "staging" / "_sources.yml").read_text())
    declared = {t["name"] for s in sources["sources"] for t in s["tables"]}
    staged = {p.stem.removeprefix("stg_") for p in (SQL / "staging").glob("stg_*.sql")}
    for table in T.TABLES:
        if table.endpoint:
            assert table.endpoint in catalogue.BY_NAME, (table.name, table.endpoint)
        assert table.name in declared, f"{table.name} is not a dbt source"
        assert table.name in staged, f"{table.name} has no staging model"


def test_the_per_client_fan_out_follows_the_landed_tables() -> None:
    for endpoint, table in B.SIMPLE_READS.items():
        assert catalogue.BY_NAME[endpoint].kind == "client_read", endpoint
        assert T.table(table).endpoint == endpoint, (endpoint, table)
    assert set(B.BATCH_TABLES) <= {t.name for t in T.TABLES}
