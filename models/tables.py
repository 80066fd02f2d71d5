"""What lands: one declaration per landed table, and the Arrow schema derived from it.

Each :class:`Table` lists its columns as an **allowlist**: a source field that is not a
column here is kept in the row's ``extra`` JSON column, unless it is a secret
(:data:`SECRET_FIELDS`), which never lands anywhere. Column kinds fix the Arrow type and
how a wire value is coerced (``membersync.models.coerce``):

=============  ======================  ===============================================
kind           Arrow type              wire value
=============  ======================  ===============================================
id             string                  opaque string, never trimmed, never a number
text           string                  free text
enum           string                  kept verbatim (compare case-insensitively later)
money          decimal128(18, 2)       number or numeric string, at most 2 decimals
int            int64                   integer (number or numeric string)
bool           bool                    JSON boolean
date           date32                  ``YYYY-MM-DD``
local_ts       timestamp[us]           store-local datetime; an offset is converted to
                                       the store's timezone, then dropped
utc_ts         timestamp[us, UTC]      ``YYYY-MM-DDTHH:MM:SSZ``
text_list      list<string>            array of strings
=============  ======================  ===============================================

Every landed file also carries ``extra`` (JSON text of the fields not in the allowlist, or
null). The night (``snapshot_date``) is the Hive partition of the path, not a column.

**Typed, then landed.** :data:`TABLES` declares what typing produces from the wire (``schema``:
client numbers and personal fields included). What lands is derived from it once
(:data:`LANDED`, :func:`landed`): personal fields (``catalogue.PERSONAL_FIELDS``) leave every
table for the identity tables, and every client number becomes the client's surrogate key
(``client_number`` -> ``client_key``, ``referred_by`` -> ``referred_by_key``), so that the
identity table's row is the only link between a key and a person
(:mod:`membersync.models.privacy` does it per batch):

=====================  ==========  =========================================================
landed table           tier        what it holds
=====================  ==========  =========================================================
``client_identity``    identified  the key, the client number, the personal fields, the
                                   client record's ``extra``: a version when new or changed
``client_demographics`` analyst    the key, birth year and the postal code's first characters
every other table      analyst     keys instead of numbers, no personal field
=====================  ==========  =========================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
from membersync.extract import catalogue

ColumnKind = Literal["id", "text", "enum", "money", "int", "bool", "date", "local_ts", "utc_ts", "text_list"]
Scope = Literal["config", "current", "event", "identity"]
Tier = Literal["analyst", "identified"]

MONEY = pa.decimal128(18, 2)

ARROW_TYPES: dict[str, pa.DataType] = {
    "id": pa.string(),
    "text": pa.string(),
    "enum": pa.string(),
    "money": MONEY,
    "int": pa.int64(),
    "bool": pa.bool_(),
    "date": pa.date32(),
    "local_ts": pa.timestamp("us"),
    "utc_ts": pa.timestamp("us", tz="UTC"),
    "text_list": pa.list_(pa.string()),
}

# Fields that never land, in any table, under any name we know of (allowlists keep them
# out; this set is what the tests hunt for and what extra never carries). Declared once, in
# the catalogue.
SECRET_FIELDS: frozenset[str] = catalogue.SECRET_FIELDS


@dataclass(frozen=True, slots=True)
class Column:
    name: str  # column name in Parquet / DuckDB (snake_case)
    kind: ColumnKind
    source: str  # logical field name in the record (contract's camelCase), or a context key
    nullable: bool = True


@dataclass(frozen=True, slots=True)
class Table:
    """One landed table. ``key`` is unique per night; ``endpoint`` is what fills it."""

    name: str
    endpoint: str
    scope: Scope
    key: tuple[str, ...]
    columns: tuple[Column, ...]

    @property
    def schema(self) -> pa.Schema:
        """The typed schema (what typing produces from the wire, before landing)."""
        return _schema(self.columns)

    @property
    def sources(self) -> frozenset[str]:
        return frozenset(c.source for c in self.columns)

    @property
    def record(self) -> str | None:
        return catalogue.endpoint(self.endpoint).record

    @property
    def personal(self) -> tuple[Column, ...]:
        """Columns holding personal data (they land in the identity tables only)."""
        fields = catalogue.PERSONAL_FIELDS.get(self.record or "", frozenset())
        return tuple(c for c in self.columns if c.source in fields)

    @property
    def client_refs(self) -> tuple[Column, ...]:
        """Columns holding a client number (they land as the client's surrogate key)."""
        return tuple(c for c in self.columns if c.source in catalogue.CLIENT_NUMBER_FIELDS)

    @property
    def describes_a_person(self) -> bool:
        """Its record describes a person: its ``extra`` is personal too."""
        return (self.record or "") in catalogue.PERSONAL_RECORDS


def _schema(columns: tuple[Column, ...], extra: bool = True) -> pa.Schema:
    fields = [pa.field(c.name, ARROW_TYPES[c.kind], nullable=c.nullable) for c in columns]
    if extra:
        fields.append(pa.field("extra", pa.string()))
    return pa.schema(fields)


def key_column(name: str) -> str:
    """The landed name of a client-number column: ``client_number`` -> ``client_key``,
    ``shared_from_client_number`` -> ``shared_from_client_key``, ``referred_by`` -> ``referred_by_key``."""
    return name.removesuffix("_number") + "_key"


@dataclass(frozen=True, slots=True)
class LandedTable:
    """One table as it lands (see the module's docstring): its files hold exactly ``schema``.

    ``typed`` is the typed table it comes from (None for the identity tables, which the landing
    derives from ``clients``); ``tier`` says which catalog may read its files."""

    name: str
    scope: Scope
    key: tuple[str, ...]
    columns: tuple[Column, ...]
    typed: Table | None = None
    tier: Tier = "analyst"
    extra: bool = True  # it carries the fields the contract does not name (JSON)

    @property
    def schema(self) -> pa.Schema:
        return _schema(self.columns, self.extra)

    @property
    def personal(self) -> bool:
        """Its rows are about a person: ``membersync forget`` rewrites its files."""
        return self.scope == "identity"


def _landed(table: Table) -> LandedTable:
    personal = {c.name for c in table.personal}
    refs = {c.name for c in table.client_refs}
    columns = tuple(
        Column(key_column(c.name), "id", c.source, c.nullable) if c.name in refs else c
        for c in table.columns
        if c.name not in personal
    )
    key = tuple(key_column(k) if k in refs else k for k in table.key)
    return LandedTable(table.name, table.scope, key, columns, typed=table)


def C(name: str, kind: ColumnKind, source: str | None = None, nullable: bool = True) -> Column:
    return Column(name, kind, source or _camel(name), nullable)


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(p.title() for p in rest)


# Context columns: not in the wire item, but known from the request that fetched it.
CLIENT = C("client_number", "id", "clientNumber", nullable=False)
QUERY_STORE = C(
    "query_storecode", "id", "@storecode", nullable=False
)  # the store a store-scoped list was asked for

TABLES: tuple[Table, ...] = (
    # --- configuration lists (landed whole each night) -------------------------------------
    Table(
        "stores",
        "storelist",
        "config",
        ("storecode",),
        (
            C("storecode", "id", nullable=False),
            C("name", "text"),
            C("city", "text"),
            C("state", "text"),
            C("timezone", "text"),
            C("active", "bool"),
        ),
    ),
    Table(
        "sellable_packages",
        "packagelist",
        "config",
        ("package_id",),
        (
            C("package_id", "id", nullable=False),
            C("name", "text"),
            C("price", "money"),
            C("sessions", "int"),
            C("affiliated", "bool"),
            C("storecode", "id"),
        ),
    ),
    Table(
        "eft_membership_types",
        "eft_memberships",
        "config",
        ("membership_type_id",),
        (
            C("membership_type_id", "id", nullable=False),
            C("name", "text"),
            C("monthly_dues", "money"),
            C("enrollment_fee", "money"),
            C("storecode", "id"),
        ),
    ),
    Table(
        "noneft_membership_types",
        "noneft_memberships",
        "config",
        ("membership_type_id",),
        (
            C("membership_type_id", "id", nullable=False),
            C("name", "text"),
            C("price", "money"),
            C("term_months", "int"),
            C("storecode", "id"),
        ),
    ),
    Table(
        "eft_deduct_types",
        "eft_deduct_types",
        "config",
        ("code",),
        (
            C("code", "enum", nullable=False),
            C("description", "text"),
        ),
    ),
    Table(
        "eft_draw_days",
        "eft_draw_days",
        "config",
        ("day",),
        (
            C("day", "int", nullable=False),
            C("description", "text"),
        ),
    ),
    Table(
        "skin_types",
        "skin_types",
        "config",
        ("code",),
        (
            C("code", "enum", nullable=False),
            C("description", "text"),
        ),
    ),
    Table(
        "web_docs",
        "webdocs",
        "config",
        ("doc_id",),
        (
            C("doc_id", "id", nullable=False),
            C("name", "text"),
        ),
    ),
    Table(
        "payment_types",
        "payment_types",
        "config",
        ("query_storecode", "code"),
        (
            QUERY_STORE,
            C("code", "enum", nullable=False),
            C("description", "text"),
            C("kind", "enum"),
        ),
    ),
    Table(
        "employees",
        "employees",
        "config",
        ("query_storecode", "emp_no"),
        (
            QUERY_STORE,
            C("emp_no", "id", nullable=False),
            C("first_name", "text"),
            C("last_name", "text"),
            C("storecode", "id"),
            C("role", "enum"),
        ),
    ),
    Table(
        "products",
        "products",
        "config",
        ("query_storecode", "product_number"),
        (
            QUERY_STORE,
            C("product_number", "id", nullable=False),
            C("name", "text"),
            C("price", "money"),
            C("category", "enum"),
            C("storecode", "id"),
        ),
    ),
    # Processor credentials: username, password and apiKey are secrets and never land.
    Table(
        "processor_credentials",
        "processor_credentials",
        "config",
        ("query_storecode", "credential_type", "processor", "merchant_id"),
        (
            QUERY_STORE,
            C("credential_type", "enum", "@type", nullable=False),
            C("processor", "text", nullable=False),
            C("merchant_id", "id", nullable=False),
        ),
    ),
    Table(
        "profile_questions",
        "profile_questions",
        "config",
        ("question_id",),
        (
            C("question_id", "id", nullable=False),
            C("text", "text"),
            C("answer_type", "enum"),
            C("choices", "text_list"),
        ),
    ),
    # --- per-client current state (a snapshot of every client synced that night) ----------
    # The clients synced on a night (from discovery): the warehouse takes each client's whole
    # newest snapshot from the night named here, so a row that vanished (a ledger paid off to
    # nothing) is not resurrected from an older night.
    Table(
        "synced_clients",
        "search",
        "current",
        ("client_number",),
        (
            CLIENT,
            C("home_store", "id"),
            C("last_modified", "utc_ts"),
        ),
    ),
    Table(
        "clients",
        "clientdetails",
        "current",
        ("client_number",),
        (
            CLIENT,
            C("first_name", "text"),
            C("last_name", "text"),
            C("email", "text"),
            C("phone", "text"),
            C("birth_date", "date"),
            C("gender", "enum"),
            C("address1", "text"),
            C("city", "text"),
            C("state", "text"),
            C("postal_code", "text"),
            C("home_store", "id"),
            C("referred_by", "id"),
            C("skin_type", "enum"),
            C("created_date", "date"),
            C("last_modified", "utc_ts"),
        ),
    ),
    Table(
        "ledger_balances",
        "ledgerbalance",
        "current",
        ("client_number", "storecode"),
        (
            CLIENT,
            C("storecode", "id", nullable=False),
            C("balance", "money", nullable=False),
            C("as_of", "date"),
        ),
    ),
    Table(
        "comm_prefs",
        "commprefs",
        "current",
        ("client_number",),
        (
            CLIENT,
            C("email", "bool"),
            C("sms", "bool"),
            C("mail", "bool"),
            C("phone", "bool"),
            C("marketing", "bool"),
        ),
    ),
    Table(
        "memberships",
        "clientmemberships",
        "current",
        ("membership_id",),
        (
            CLIENT,
            C("membership_id", "id", nullable=False),
            C("membership_type_id", "id"),
            C("name", "text"),
            C("is_eft", "bool"),
            C("status", "enum"),
            C("storecode", "id"),
            C("start_date", "date"),
            C("end_date", "date"),
            C("draw_day", "int"),
            C("monthly_dues", "money"),
            C("price", "money"),
            C("freeze_start_date", "date"),
            C("freeze_end_date", "date"),
            C("cancel_date", "date"),
            C("last_modified", "utc_ts"),
        ),
    ),
    Table(
        "client_packages",
        "clientpackages",
        "current",
        ("client_number", "client_package_id"),
        (
            CLIENT,
            C("client_package_id", "id", nullable=False),
            C("package_id", "id"),
            C("name", "text"),
            C("storecode", "id"),
            C("purchase_date", "date"),
            C("expiration_date", "date"),
            C("sessions_total", "int"),
            C("sessions_remaining", "int"),
            C("shared_from_client_number", "id"),
        ),
    ),
    Table(
        "points_balances",
        "pointsbalance",
        "current",
        ("client_number", "storecode"),
        (
            CLIENT,
            C("storecode", "id", nullable=False),
            C("points", "int", nullable=False),
        ),
    ),
    # Billing accounts: tokenId, vaultToken, accountNo and routingNo are secrets and never land.
    Table(
        "billing_accounts",
        "billinginfo",
        "current",
        ("billing_account_id",),
        (
            CLIENT,
            C("billing_account_id", "id", nullable=False),
            C("membership_id", "id"),
            C("type", "enum"),
            C("deduct_type", "enum"),
            C("last_four", "text"),
            C("exp_month", "int"),
            C("exp_year", "int"),
        ),
    ),
    Table(
        "affiliated_package_clients",
        "affiliatedpackageclients",
        "current",
        ("membership_id", "client_number"),
        (
            C("membership_id", "id", "@membershipId", nullable=False),
            C("client_number", "id", nullable=False),
            C("first_name", "text"),
            C("last_name", "text"),
            C("shared_date", "date"),
        ),
    ),
    # --- events (what the night fetched: whole history the first night, then a window) ------
    Table(
        "points_transactions",
        "getpointstransactions",
        "event",
        ("points_transaction_id",),
        (
            CLIENT,
            C("points_transaction_id", "id", nullable=False),
            C("date", "local_ts"),
            C("storecode", "id"),
            C("points", "int", nullable=False),
            C("reason", "text"),
            C("receipt_number", "id"),
        ),
    ),
    Table(
        "transactions",
        "transactionhistory",
        "event",
        ("receipt_number",),
        (
            CLIENT,
            C("receipt_number", "id", nullable=False),
            C("transaction_date", "local_ts"),
            C("storecode", "id"),
            C("emp_no", "id"),
            C("status", "enum"),
        ),
    ),
    Table(
        "transaction_lines",
        "transactionhistory",
        "event",
        ("receipt_number", "line_no"),
        (
            CLIENT,
            C("receipt_number", "id", "@receiptNumber", nullable=False),
            C("line_no", "int", nullable=False),
            C("type", "enum"),
            C("product_number", "id"),
            C("package_id", "id"),
            C("membership_id", "id"),
            C("gift_cert_no", "id"),
            C("description", "text"),
            C("quantity", "int"),
            C("price_per_unit", "money"),
            C("amount", "money"),
            C("tax", "money"),
        ),
    ),
    Table(
        "transaction_payments",
        "transactionhistory",
        "event",
        ("payment_id",),
        (
            CLIENT,
            C("receipt_number", "id", "@receiptNumber", nullable=False),
            C("payment_id", "id", nullable=False),
            C("payment_type", "enum"),
            C("amount", "money"),
            C("date", "local_ts"),
        ),
    ),
)

BY_NAME: dict[str, Table] = {t.name: t for t in TABLES}
CONFIG_TABLES = tuple(t for t in TABLES if t.scope == "config")
CURRENT_TABLES = tuple(t for t in TABLES if t.scope == "current")
EVENT_TABLES = tuple(t for t in TABLES if t.scope == "event")

# --- the identity tables: the only place a client number or a personal field lands ---------------
CLIENT_KEY = Column("client_key", "id", "clientNumber", nullable=False)
IDENTITY_DIGEST = Column("identity_digest", "id", "@digest")  # null: a link known from a reference only
CLIENT_IDENTITY = LandedTable(
    "client_identity",
    "identity",
    ("client_key",),
    (CLIENT_KEY, C("client_number", "id", nullable=False), *BY_NAME["clients"].personal, IDENTITY_DIGEST),
    tier="identified",
)
CLIENT_DEMOGRAPHICS = LandedTable(
    "client_demographics",
    "identity",
    ("client_key",),
    (CLIENT_KEY, C("birth_year", "int", "@birthYear"), C("postal_prefix", "text", "@postalPrefix")),
    extra=False,
)
# Column names that carry a person's identity wherever a model or a query shows them: the
# identity table's columns (but its key and digest), and the names the identified tier's
# models give them. A failing check's example rows and the analyst prompt's hints use this.
PERSONAL_COLUMNS: frozenset[str] = frozenset(
    {"client_number", "client_name", *(c.name for c in CLIENT_IDENTITY.columns)}
    - {"client_key", "identity_digest"}
)
POSTAL_PREFIX_CHARS = 3  # the analyst tier's postal code: its first characters only

LANDED: tuple[LandedTable, ...] = (*(_landed(t) for t in TABLES), CLIENT_IDENTITY, CLIENT_DEMOGRAPHICS)
LANDED_BY_NAME: dict[str, LandedTable] = {t.name: t for t in LANDED}
IDENTITY_TABLES: tuple[LandedTable, ...] = tuple(t for t in LANDED if t.personal)

# Rows that cannot be typed land here, raw, instead of failing the night (keyed, without a
# personal field: models.privacy rewrites each row before it lands).
QUARANTINE_SCHEMA = pa.schema(
    [
        pa.field("table_name", pa.string(), nullable=False),
        pa.field("client_key", pa.string()),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("raw", pa.string(), nullable=False),  # JSON of the item, secrets and personal data removed
    ]
)
# What typing produces before it lands (the client's number, the raw item).
TYPED_QUARANTINE_SCHEMA = pa.schema(
    [
        pa.field("table_name", pa.string(), nullable=False),
        pa.field("client_number", pa.string()),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("raw", pa.string(), nullable=False),  # JSON of the item, secrets removed
    ]
)


def table(name: str) -> Table:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown typed table {name!r}") from None


def landed(name: str) -> LandedTable:
    try:
        return LANDED_BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown landed table {name!r}") from None
