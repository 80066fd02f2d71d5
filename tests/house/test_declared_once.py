"""Facts declared once, and the copies that must follow them (issue 11).

The catalogue (``extract/catalogue.py``) declares the contract's enumerations, secret fields
and endpoints; the landed tables (``models/tables.py``) declare what lands. Where another
layer must spell a fact again (the SQL, its YAML tests, the report exports, the sandbox's
rendering, the client's record types, the staging models), a test here fails as soon as the
copy drifts.
"""

from __future__ import annotations

import datetime as dt
import itertools
import re
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

import pytest
import yaml
from membersync.extract import catalogue, redact
from membersync.extract import records as R
from membersync.extract.client import ServiceClient
from membersync.extract.sandbox import population
from membersync.flows.night import batches as B
from membersync.models import coerce
from membersync.models import tables as T
from membersync.warehouse.build.catalog import LINEAGE
from membersync.warehouse.build.dbt_run import model_yaml
from membersync.warehouse.exports.export import REPORTS

SQL = Path(__file__).resolve().parents[2] / "sql"


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
    for typed in T.TABLES:
        assert typed.endpoint in catalogue.BY_NAME, (typed.name, typed.endpoint)
    for table in T.LANDED:
        assert table.name in declared, f"{table.name} is not a dbt source"
        assert table.name in staged, f"{table.name} has no staging model"


def test_the_per_client_fan_out_follows_the_landed_tables() -> None:
    for endpoint, table in B.SIMPLE_READS.items():
        assert catalogue.BY_NAME[endpoint].kind == "client_read", endpoint
        assert T.table(table).endpoint == endpoint, (endpoint, table)
    assert set(B.BATCH_TABLES) <= {t.name for t in T.TABLES}


# --- one entity, four declarations: the sandbox's rendering, the records, the landed table, staging ---
#
# Ground truth is what the sandbox renders (its own data generator, its endpoint methods called
# in-process exactly as its HTTP handler calls them), the record types the client's methods
# return, the landed tables and the staging models as written. Nothing below lists a field.

ANCHOR = dt.date(2025, 6, 1)
SINCE = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)  # every client, for search's modifiedSince
Items = list[dict[str, Any]]
Request = tuple[dict[str, str], Items]  # the landing's context for one request, its items

# The tables a record's parts land in (models.coerce explodes a receipt so): table -> the key of
# the parts in the parent record. The parent's table takes the record itself.
PARTS = {"transaction_lines": "lines", "transaction_payments": "payments"}

# Fields the sandbox renders that deliberately land nowhere (not even in ``extra``), with why.
RENDERED_NOT_LANDED: dict[str, set[str]] = {
    # A night keeps only B.DISCOVERY_FIELDS of a search hit; the client's names and email land
    # from clientdetails (table "clients"), not from discovery.
    "synced_clients": {"firstName", "lastName", "email"},
}

# Landed columns a staging model deliberately does not select (none today), with why.
STAGING_OMITS: dict[str, set[str]] = {}


def _snake(name: str) -> str:
    return re.sub(r"(?=[A-Z])", "_", name).lower()


class Rendered:
    """The answers of every GET endpoint of a small generated sandbox, asked as a night asks:
    every store, both credential types, every client discovery finds, every membership."""

    def __init__(self, clients: int = 120, stores: int = 4, seed: int = 7) -> None:
        self.service = population.generate(seed, clients, stores, ANCHOR)
        self.service.materialize_all()
        self._answers: dict[str, list[Request]] = {}

    def answers(self, endpoint: str) -> list[Request]:
        if endpoint not in self._answers:
            self._answers[endpoint] = self._ask(catalogue.BY_NAME[endpoint])
        return self._answers[endpoint]

    def items(self, endpoint: str) -> Items:
        return [item for _, items in self.answers(endpoint) for item in items]

    def _ask(self, ep: catalogue.Endpoint) -> list[Request]:
        if ep.kind == "search":
            found: Items = []
            page, size = 1, catalogue.MAX_PAGE_SIZE
            while True:
                answer = self.service.search(modified_since=SINCE, page=page, page_size=size)
                found += answer["clients"]
                if page * size >= answer["totalCount"]:
                    return [({}, found)]
                page += 1
        requests = []
        for values in itertools.product(*(self._values(p) for p in ep.params)):
            args = dict(zip((p.name for p in ep.params), values, strict=True))
            # the handler's call: the service method named like the endpoint, snake_case arguments
            answer = getattr(self.service, ep.name)(**{_snake(k): v for k, v in args.items()})
            items = answer if isinstance(answer, list) else [answer]
            # the landing's context: clientNumber as is, any other request value as "@name"
            context = {(k if k in coerce.CONTEXT_FALLBACK else f"@{k}"): str(v) for k, v in args.items()}
            requests.append((context, items))
        return requests

    def _values(self, param: catalogue.Param) -> list[Any]:
        if param.kind == "storecode":
            return [s["storecode"] for s in self.items("storelist")]
        if param.kind == "credtype":
            return list(catalogue.CREDENTIAL_TYPES)
        if param.kind == "date":  # the whole generated history
            return [ANCHOR - dt.timedelta(days=3660) if param.name == "startDate" else ANCHOR]
        if param.name == "clientNumber":
            return [c["clientNumber"] for c in self.items("search")]
        if param.name == "membershipId":
            return [m["membershipId"] for m in self.items("clientmemberships")]
        raise AssertionError(f"this test does not know how a night asks for {param.name!r}: add it")

    def fed(self, table: T.Table) -> list[Request]:
        """What the landing is fed for ``table``: its endpoint's items (a search hit compacted to
        what discovery keeps), or, for a table of parts, the parts of each item (their context
        may name the parent's fields: "@receiptNumber")."""
        requests = self.answers(table.endpoint)
        if catalogue.BY_NAME[table.endpoint].kind == "search":
            return [
                ({}, [c.wire() for c in B.summarize_discovery(items, None).clients]) for _, items in requests
            ]
        key = PARTS.get(table.name)
        if key is None:
            return requests
        return [
            ({**ctx, **{f"@{k}": v for k, v in item.items() if isinstance(v, str)}}, item[key])
            for ctx, items in requests
            for item in items
        ]


def _fields(items: Items) -> set[str]:
    return {k for item in items for k in item}


@pytest.fixture(scope="module")
def rendered() -> Rendered:
    return Rendered()


def _nested(table: T.Table) -> dict[str, str]:
    """The parts a table's record carries (catalogue.NESTED_RECORDS), for the parent's table."""
    record = catalogue.BY_NAME[table.endpoint].record
    return {} if table.name in PARTS else catalogue.NESTED_RECORDS.get(record or "", {})


def test_tables_of_parts_follow_the_nested_records_of_the_catalogue() -> None:
    by_endpoint: dict[str, list[str]] = {}
    for table in T.TABLES:
        by_endpoint.setdefault(table.endpoint, []).append(table.name)
    for endpoint, names in by_endpoint.items():
        parents = [n for n in names if n not in PARTS]
        assert len(parents) == 1, (endpoint, names)  # one table takes the record itself
        record = catalogue.BY_NAME[endpoint].record or ""
        parts = {PARTS[n] for n in names if n in PARTS}
        assert parts == set(catalogue.NESTED_RECORDS.get(record, {})), (endpoint, parts)


def test_every_landed_column_is_fed_by_what_the_sandbox_renders(rendered: Rendered) -> None:
    for table in T.TABLES:
        requests = rendered.fed(table)
        assert any(items for _, items in requests), f"the sandbox renders no {table.name}"
        fields = _fields([item for _, items in requests for item in items])
        context = {k for ctx, _ in requests for k in ctx}
        for column in table.columns:
            if column.source.startswith("@") or column.source in coerce.CONTEXT_FALLBACK:
                assert column.source in fields | context, (table.name, column.name, column.source)
            else:
                assert column.source in fields, (table.name, column.name, column.source)


def test_every_field_the_sandbox_renders_lands_or_is_secret_or_named(rendered: Rendered) -> None:
    for table in T.TABLES:
        key = PARTS.get(table.name)
        items = rendered.items(table.endpoint)
        fields = _fields([part for item in items for part in item[key]] if key else items)
        unlanded = fields - table.sources - catalogue.SECRET_FIELDS - set(_nested(table))
        assert unlanded == RENDERED_NOT_LANDED.get(table.name, set()), table.name
    assert set(RENDERED_NOT_LANDED) <= {t.name for t in T.TABLES}
    for name, fields in RENDERED_NOT_LANDED.items():  # a secret is declared a secret, not here
        assert fields.isdisjoint(catalogue.SECRET_FIELDS), name


def test_the_sandbox_rendering_lands_whole_in_the_declared_arrow_types(rendered: Rendered) -> None:
    """The real landing types what the sandbox renders: no row quarantined, nothing left in
    ``extra``, each table's Arrow schema the declared one, every column given a value."""
    builder = coerce.BatchBuilder(coerce.TimezoneLookup.from_stores(rendered.items("storelist")))
    for table in T.TABLES:
        if table.name in PARTS:
            continue  # typed with their parent record
        for context, items in rendered.fed(table):
            if _nested(table):
                builder.add_transactions(items, context["clientNumber"])
            else:
                builder.add(table, items, context)
    landed = builder.build()
    assert set(landed) == {t.name for t in T.TABLES}
    for table in T.TABLES:
        got = landed[table.name]
        assert got.quarantine == [], (table.name, got.quarantine[:1])
        assert got.table.schema.equals(table.schema), table.name
        assert got.table.column("extra").null_count == got.rows, (table.name, "extra")
        for column in table.columns:
            assert got.table.column(column.name).null_count < got.rows, (table.name, column.name)


def _record_types() -> dict[str, type]:
    """Endpoint (or "endpoint.part") -> the record TypedDict the client's method returns."""
    found: dict[str, type] = {}
    for ep in catalogue.ENDPOINTS:
        if ep.is_write:
            continue
        method = ServiceClient.search_page if ep.kind == "search" else getattr(ServiceClient, ep.name)
        returned = get_type_hints(method)["return"]
        if returned is R.SearchPage:
            returned = get_type_hints(R.SearchPage)["items"]
        record = get_args(returned)[0] if get_origin(returned) is list else returned
        found[ep.name] = record
        hints = get_type_hints(record)
        for part in catalogue.NESTED_RECORDS.get(ep.record or "", {}):
            found[f"{ep.name}.{part}"] = get_args(hints[part])[0]
    return found


def _plain(annotation: Any) -> set[Any]:
    """The types an annotation allows, None aside (``Money | None`` -> {float, int, str})."""
    args = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    return {a for a in args if a is not type(None)}


# What a record may declare for a landed column of each kind (extract.records' aliases).
RECORD_TYPES: dict[str, set[Any]] = {
    "money": _plain(R.Money),
    "int": _plain(R.Count),
    "bool": {bool},
    "text_list": {list[str]},
    **{kind: {str} for kind in ("id", "text", "enum", "date", "local_ts", "utc_ts")},
}


def test_records_are_the_fields_the_sandbox_renders(rendered: Rendered) -> None:
    for name, record in _record_types().items():
        endpoint, _, part = name.partition(".")
        items = rendered.items(endpoint)
        fields = _fields([p for item in items for p in item[part]] if part else items)
        assert set(get_type_hints(record)) == fields, (name, record.__name__)


def test_records_agree_with_the_landed_tables() -> None:
    records = _record_types()
    assert set(T.ARROW_TYPES) == set(RECORD_TYPES)
    for table in T.TABLES:
        key = PARTS.get(table.name)
        record = records[f"{table.endpoint}.{key}" if key else table.endpoint]
        if catalogue.BY_NAME[table.endpoint].kind == "search":  # what discovery keeps of it
            assert table.sources <= B.DISCOVERY_FIELDS <= set(get_type_hints(record)), table.name
        hints = get_type_hints(record)
        for column in table.columns:
            if column.source.startswith("@") or (
                column.source in coerce.CONTEXT_FALLBACK and column.source not in hints
            ):
                continue  # from the request, not the record
            assert column.source in hints, (table.name, column.name, record.__name__)
            declared = _plain(hints[column.source])
            assert declared == RECORD_TYPES[column.kind], (table.name, column.name, declared)


# --- staging ------------------------------------------------------------------------------------------

_FINAL = re.compile(r"final as \(\s*select\s+(?P<select>.*?)\s+from deduplicated\s*\)", re.S | re.I)
_PARTITION = re.compile(r"partition by (?P<cols>[^\n]+)\n", re.I)


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return [*parts, text[start:].strip()]


def _staging_outputs(table: str) -> list[tuple[str, bool]]:
    """The staging model's output columns, each with whether it is a bare landed column."""
    sql = (SQL / "staging" / f"stg_{table}.sql").read_text()
    match = _FINAL.search(sql)
    assert match, f"stg_{table}.sql: no simple `final as (select ... from deduplicated)`"
    outputs = []
    for expr in _split_top_level(match["select"]):
        alias = re.fullmatch(r"(?s)(?P<expr>.+?)\s+as\s+(?P<name>\w+)", expr, re.I)
        if alias:
            outputs.append((alias["name"], False))
        else:
            assert re.fullmatch(r"\w+", expr), f"stg_{table}.sql: unnamed output {expr!r}"
            outputs.append((expr, True))
    return outputs


def _staging_models() -> dict[str, dict[str, Any]]:
    models = yaml.safe_load((SQL / "staging" / "_staging.yml").read_text())["models"]
    return {m["name"]: m for m in models}


def test_staging_selects_every_landed_column() -> None:
    for table in T.LANDED:
        outputs = _staging_outputs(table.name)
        names = [n for n, _ in outputs]
        assert len(names) == len(set(names)), table.name
        landed = set(table.schema.names)
        missing = landed - set(names) - STAGING_OMITS.get(table.name, set())
        assert not missing, f"stg_{table.name} drops landed column(s) {sorted(missing)}"
        # lineage: the night stays, the file bookkeeping does not
        assert set(names) & set(LINEAGE) == {"snapshot_date"}, table.name
        for name, bare in outputs:  # a bare name must exist in landing; a new one is computed
            assert not bare or name in landed | set(LINEAGE), (table.name, name)


def test_staging_yaml_documents_exactly_the_columns_the_model_outputs() -> None:
    models = _staging_models()
    for table in T.LANDED:
        documented = [c["name"] for c in models[f"stg_{table.name}"].get("columns", [])]
        assert documented == [n for n, _ in _staging_outputs(table.name)], table.name


def test_staging_deduplicates_and_tests_on_the_declared_key() -> None:
    models = _staging_models()
    for table in T.LANDED:
        key = ["snapshot_date", *table.key]
        sql = (SQL / "staging" / f"stg_{table.name}.sql").read_text()
        partitions = _PARTITION.findall(sql)
        assert [[c.strip() for c in p.split(",")] for p in partitions] == [key], table.name
        model = models[f"stg_{table.name}"]
        # meta.key is what sql/tests/staging_keys_and_landing.sql checks (not null, unique, and
        # reconciled with the landed table): no per-model key test to drift from it
        assert model["config"]["meta"]["key"] == key, table.name
        tests = {next(iter(t)) for t in model.get("data_tests", [])}
        assert "primary_key" not in tests, f"{table.name}: its key is checked by the staging test"


def test_the_projects_landed_tables_are_the_declared_ones() -> None:
    """dbt's var ``landing_tables`` drives the manifest test and the staging test (keys, and
    reconciliation with landing): every landed table (and the quarantine), no other."""
    project = yaml.safe_load((SQL / "dbt_project.yml").read_text())
    assert project["vars"]["landing_tables"] == [t.name for t in T.LANDED] + ["quarantine"]


def test_every_mart_and_report_is_in_the_key_test_and_has_no_test_of_its_own() -> None:
    """dbt's var ``keyed_models`` drives sql/tests/keys_of_marts_and_reports.sql (each model's
    meta.key, not null and unique): every mart and report, no other. The
    key is declared once (meta.key): no per-model key test to drift from it."""
    project = yaml.safe_load((SQL / "dbt_project.yml").read_text())
    models = [m for m in model_yaml(SQL) if m["_layer"] in ("marts", "reports", "identity")]
    assert sorted(project["vars"]["keyed_models"]) == sorted(m["name"] for m in models)
    for model in models:
        assert model["config"]["meta"]["key"], model["name"]
        tests = {next(iter(t)) for t in model.get("data_tests", [])}
        assert "primary_key" not in tests, f"{model['name']}: its key is checked by the key test"
    assert not (SQL / "tests" / "generic" / "primary_key.sql").exists()


def test_the_truths_cell_text_is_the_exports() -> None:
    """The truth writes its expected CSV cells with its own copy of the export's rule (it never
    calls the code it checks): the two agree on every kind of value a report holds."""
    from decimal import Decimal

    from membersync.warehouse.exports.export import cell_text as exported
    from truth import cell_text as expected

    values = [
        None,
        True,
        False,
        Decimal("0.00"),
        Decimal("-12.50"),
        Decimal("1E+3"),
        Decimal("0.0001"),
        dt.date(2026, 2, 28),
        dt.datetime(2026, 2, 28, 23, 59, 1),
        dt.datetime(2026, 2, 28, 0, 0, 0, 5),
        0,
        -7,
        'Céline, "the" store',
        "",
    ]
    assert [expected(v) for v in values] == [exported(v) for v in values]
