"""Landing without identity: a typed batch becomes the tables that land.

Typing (:mod:`membersync.models.coerce`) produces what the wire said: client numbers, names,
emails. Before anything is written, :func:`land_batch` turns it into what lands
(:data:`membersync.models.tables.LANDED`):

* every client number (``clientNumber``, ``referredBy``, ``sharedFromClientNumber``) becomes the
  client's **surrogate key**, given by a :class:`KeyBook` (random per client, assigned when the
  client is first seen; the register's key for a client who was forgotten);
* personal fields (``catalogue.PERSONAL_FIELDS``) leave every table; the client record's go to
  ``client_identity`` (with the client number: the one link from key to person) and its coarse
  part (birth year, the postal code's first characters) to ``client_demographics``, both only
  when the client is new or their identity changed (their digest differs from the one held), and
  never for a forgotten client;
* a client known only from a reference (a referral, a shared package) gets a link row (key and
  number, no personal field), so their key is the same when they are first synced;
* untrusted text (a client's rows' text columns, every ``extra``) is masked for every
  identity value the night knows (:mod:`membersync.models.mask`);
* quarantined rows carry the key, and their raw JSON and reason lose every personal value.

Everything here is a pure function of the batch and the key book: the landing zone
(:mod:`membersync.warehouse.landing.zone`) owns the book and calls :func:`land_batch` in
``write_batch``, so no path lands a client number outside the identity table.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from membersync.extract import catalogue
from membersync.models import tables as T
from membersync.models.mask import MASKED_FIELDS, IdentityMask

WITHHELD = "[withheld: personal data]"
_REASON_COLUMN = re.compile(r"^([a-z0-9_]+)(\[\d+\])?: ")


class KeyBook(Protocol):
    """What landing asks of the keys (:class:`membersync.warehouse.landing.identity.ClientKeys`)."""

    mask: IdentityMask  # every identity value known: the held clients', the night's, the forgotten's

    def assign(self, numbers: Iterable[str]) -> dict[str, str]:
        """number -> surrogate key, for every number given (new ones get a new key)."""
        ...

    def wants_identity(self, number: str, digest: str) -> bool:
        """Whether this identity lands tonight (new or changed, and the client not forgotten);
        a yes is remembered, so a second batch holding the same identity lands nothing."""
        ...

    def wants_link(self, number: str, synced_here: bool) -> bool:
        """Whether a client known here only by number needs a link row (no identity row yet,
        not forgotten, and, unless ``synced_here``, not synced by another batch of the night);
        a yes is remembered."""
        ...


# --- the batch -------------------------------------------------------------------------------------


def land_batch(typed: Mapping[str, pa.Table], keys: KeyBook) -> dict[str, pa.Table]:
    """The landed tables of one typed batch (names of ``typed``, plus the identity tables when the
    batch holds any client)."""
    numbers = client_numbers_in(typed)
    keys.mask.add(identity_values_in(typed))
    keys.mask.add_numbers(numbers)
    if not numbers:
        return {name: pseudonymous(table, T.landed(name), {}, keys.mask) for name, table in typed.items()}
    mapping = keys.assign(sorted(numbers))
    out = {name: pseudonymous(table, T.landed(name), mapping, keys.mask) for name, table in typed.items()}
    identity, demographics = identity_rows(typed.get("clients"), mapping, keys)
    here = synced_in(typed)
    links = link_rows([n for n in sorted(numbers) if keys.wants_link(n, n in here)], mapping)
    out[T.CLIENT_IDENTITY.name] = pa.concat_tables([identity, links])
    out[T.CLIENT_DEMOGRAPHICS.name] = demographics
    return out


def identity_values_in(typed: Mapping[str, pa.Table]) -> list[str]:
    """The batch's names, emails and phones: every personal column of :data:`MASKED_FIELDS` (a
    client's own, a package sharer's names)."""
    values: list[str] = []
    for name, table in typed.items():
        for column in T.table(name).personal:
            if column.name in MASKED_FIELDS and column.name in table.column_names:
                values.extend(v for v in pc.unique(table[column.name]).to_pylist() if isinstance(v, str))
    return values


def untrusted_text(spec: T.LandedTable) -> frozenset[str]:
    """The columns of ``spec`` masked before landing: ``extra``, and the text columns of a table
    whose rows belong to clients (see :mod:`membersync.models.mask`)."""
    typed = spec.typed
    belongs_to_clients = typed is not None and typed.scope != "config"
    text = {c.name for c in spec.columns if c.kind == "text"} if belongs_to_clients else set()
    return frozenset({*text, "extra"})


def client_numbers_in(typed: Mapping[str, pa.Table]) -> set[str]:
    """Every client number any client-number column of the batch holds."""
    found: set[str] = set()
    for name, table in typed.items():
        for column in T.table(name).client_refs:
            found.update(v for v in pc.unique(table[column.name]).to_pylist() if v is not None)
    return found


def synced_in(typed: Mapping[str, pa.Table]) -> set[str]:
    """The numbers of the clients the batch syncs (its ``synced_clients``)."""
    synced = typed.get("synced_clients")
    return set() if synced is None else {n for n in synced["client_number"].to_pylist() if n is not None}


def pseudonymous(
    table: pa.Table, spec: T.LandedTable, mapping: Mapping[str, str], mask: IdentityMask | None = None
) -> pa.Table:
    """``table`` as it lands: client-number columns as keys, personal columns dropped, the extra
    of a record that describes a person dropped (it went to the identity table, or is a copy),
    untrusted text masked."""
    typed = spec.typed
    if typed is None:
        raise ValueError(f"{spec.name} is derived by landing, not typed")
    refs = {c.name for c in typed.client_refs}
    masked = untrusted_text(spec) if mask is not None else frozenset()
    arrays = []
    for column in spec.columns:
        source = column.name
        if column.name not in table.column_names:  # a key column: from its number column
            source = next(r for r in refs if T.key_column(r) == column.name)
            arrays.append(to_keys(table[source], mapping))
        elif mask is not None and column.name in masked:
            arrays.append(mask.array(table[source]))
        else:
            arrays.append(table[source])
    extra = table["extra"]
    if typed.describes_a_person:
        extra = pa.nulls(table.num_rows, pa.string())
    elif mask is not None:
        extra = mask.array(extra)
    arrays.append(extra)
    return pa.Table.from_arrays(arrays, schema=spec.schema)


def to_keys(numbers: pa.ChunkedArray | pa.Array, mapping: Mapping[str, str]) -> pa.Array:
    """Each number's key (null stays null; a number without a key is the caller's bug)."""
    if not mapping:
        if pc.count(numbers).as_py():
            raise ValueError("client numbers to land, but no key for them")
        return pa.nulls(len(numbers), pa.string())
    known = pa.array(list(mapping), pa.string())
    positions = pc.index_in(numbers, value_set=known)
    missing = pc.and_(pc.is_null(positions), pc.is_valid(numbers))
    if pc.any(missing).as_py():
        raise ValueError("a client number without a surrogate key")
    return pa.array(list(mapping.values()), pa.string()).take(positions)


# --- identity ------------------------------------------------------------------------------------------


def identity_digest(values: Sequence[Any]) -> str:
    """A digest of one client's personal values (and record extra): equal when nothing changed."""
    text = json.dumps([None if v is None else str(v) for v in values], ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def identity_rows(
    clients: pa.Table | None, mapping: Mapping[str, str], keys: KeyBook
) -> tuple[pa.Table, pa.Table]:
    """The identity and demographics rows of the batch's clients who are new or changed."""
    identity_schema = T.CLIENT_IDENTITY.schema
    if clients is None or clients.num_rows == 0:
        return identity_schema.empty_table(), T.CLIENT_DEMOGRAPHICS.schema.empty_table()
    personal = [c.name for c in T.BY_NAME["clients"].personal]
    numbers = clients["client_number"].to_pylist()
    rows = zip(*(clients[c].to_pylist() for c in [*personal, "extra"]), strict=True)
    digests, chosen = [], []
    for index, (number, values) in enumerate(zip(numbers, rows, strict=True)):
        digest = identity_digest(values)
        if number is not None and keys.wants_identity(number, digest):
            chosen.append(index)
            digests.append(digest)
    picked = clients.take(pa.array(chosen, pa.int64()))
    key = to_keys(picked["client_number"], mapping)
    arrays = [key, picked["client_number"], *(picked[c] for c in personal), pa.array(digests, pa.string())]
    identity = pa.Table.from_arrays([*arrays, picked["extra"]], schema=identity_schema)
    return identity, demographics_of(key, picked)


def demographics_of(keys: pa.Array, clients: pa.Table) -> pa.Table:
    """Birth year and the postal code's first characters: what the analyst tier may know."""
    birth_year = pc.cast(pc.year(clients["birth_date"]), pa.int64())
    postal = pc.utf8_slice_codeunits(
        pc.utf8_trim_whitespace(clients["postal_code"]), 0, T.POSTAL_PREFIX_CHARS
    )
    return pa.Table.from_arrays([keys, birth_year, postal], schema=T.CLIENT_DEMOGRAPHICS.schema)


def link_rows(numbers: Sequence[str], mapping: Mapping[str, str]) -> pa.Table:
    """Key and number of clients known only by reference tonight (no personal field)."""
    schema = T.CLIENT_IDENTITY.schema
    columns: dict[str, pa.Array] = {
        "client_key": pa.array([mapping[n] for n in numbers], pa.string()),
        "client_number": pa.array(list(numbers), pa.string()),
    }
    arrays = [columns.get(f.name, pa.nulls(len(numbers), f.type)) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


# --- quarantine ---------------------------------------------------------------------------------------


def land_quarantine(quarantine: pa.Table, keys: KeyBook) -> pa.Table:
    """Quarantined rows as they land: the client's key, no personal value in the raw JSON or
    the reason (a quarantined client record keeps its other fields, so it can still be read)."""
    numbers = sorted({n for n in quarantine["client_number"].to_pylist() if n is not None})
    keys.mask.add_numbers(numbers)
    mapping = keys.assign(numbers) if numbers else {}
    raws = [
        keys.mask.text(scrub_raw(t, r, mapping))
        for t, r in zip(*_columns(quarantine, "table_name", "raw"), strict=True)
    ]
    reasons = [
        keys.mask.text(scrub_reason(t, r))
        for t, r in zip(*_columns(quarantine, "table_name", "reason"), strict=True)
    ]
    return pa.Table.from_arrays(
        [
            quarantine["table_name"],
            to_keys(quarantine["client_number"], mapping),
            pa.array(reasons, pa.string()),
            pa.array(raws, pa.string()),
        ],
        schema=T.QUARANTINE_SCHEMA,
    )


def _columns(table: pa.Table, *names: str) -> list[list[Any]]:
    return [table[n].to_pylist() for n in names]


def _personal_names(table_name: str) -> frozenset[str]:
    typed = T.BY_NAME.get(table_name)
    record = (typed.record if typed is not None else None) or ""
    return catalogue.PERSONAL_FIELDS.get(record, frozenset()) | catalogue.PERSONAL_EXTRA_FIELDS


def scrub_raw(table_name: str, raw: str, mapping: Mapping[str, str]) -> str:
    """A quarantined item's JSON without personal fields, its client numbers as keys."""
    try:
        value = json.loads(raw)
    except ValueError:
        return json.dumps({"_unreadable": WITHHELD})
    typed = T.BY_NAME.get(table_name)
    keep = typed.sources if typed is not None and typed.describes_a_person else None
    if keep is not None and not isinstance(value, dict):  # a person's record that is no record
        return json.dumps({"_not_an_object": f"{type(value).__name__}: {WITHHELD}"})
    return json.dumps(_scrubbed(value, _personal_names(table_name), keep, mapping), sort_keys=True)


def _scrubbed(
    value: Any, personal: frozenset[str], keep: frozenset[str] | None, mapping: Mapping[str, str]
) -> Any:
    if isinstance(value, list):
        return [_scrubbed(v, personal, keep, mapping) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[Any, Any] = {}
    for name, item in value.items():
        if name in personal or (keep is not None and name not in keep):
            continue
        if name in catalogue.CLIENT_NUMBER_FIELDS:
            out[name] = mapping.get(item, WITHHELD) if isinstance(item, str) else WITHHELD
        else:
            out[name] = _scrubbed(item, personal, keep, mapping)
    return out


def scrub_reason(table_name: str, reason: str) -> str:
    """The reason a row was quarantined, without the value when the column is personal."""
    match = _REASON_COLUMN.match(reason)
    if match is None:
        return reason
    typed = T.BY_NAME.get(table_name)
    child = T.BY_NAME.get(match.group(1))
    owner = child or typed
    column = match.group(1) if child is None else reason[match.end() :].split(":", 1)[0]
    if owner is None:
        return reason
    withheld = {c.name for c in (*owner.personal, *owner.client_refs)}
    if column in withheld:
        prefix = reason[: match.end()] if child is None else f"{reason[: match.end()]}{column}: "
        return prefix + WITHHELD
    return reason
