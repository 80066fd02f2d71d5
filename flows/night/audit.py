"""The self-audit: re-fetch clients a night did not sync and compare them with what we hold.

An incremental night discovers clients by ``modifiedSince``, so a change the vendor makes
without bumping ``lastModified`` (an EFT draw posted by a batch job, a back-office correction)
is never synced. The audit samples clients *not* synced tonight, fetches their live state
through the night's own per-client fan-out (:func:`membersync.flows.night.batches.fetch_batch_raw`
and :func:`~membersync.flows.night.batches.type_batch`), and compares it, table by table and key by
key, with the landing zone's committed state for them. Clients that differ are queued in
``DATA_DIR/state/resync.json``; the next night (or, with ``MEMBERSYNC_AUDIT_HEAL=now``, the
same night) syncs them in full, and the queue forgets a client only when a night that synced
it commits.

What "the landing's state" of a client is mirrors the warehouse (without using its SQL):

* current-state tables (clients, memberships, ledgers, ...): the rows of the newest committed
  night that synced the client (a client synced on a night lands its whole state);
* event tables (transactions, their lines and payments, points transactions): every key the
  client ever had, each in its newest fetched version (an old night's event stays history).

Nothing here knows about Prefect; :mod:`membersync.flows.night.nightly` calls :func:`audit_clients`
for a night and :mod:`membersync.flows.cli.audit_cli` for ``membersync audit``. The reports and the
queue hold table names, row keys and surrogate client keys only: never a value, never a number.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from membersync.extract.settings import Settings
from membersync.flows.night import batches as B
from membersync.models import tables as T
from membersync.models.coerce import TimezoneLookup
from membersync.models.mask import IdentityMask
from membersync.warehouse.landing.atomic import write_json_atomic
from membersync.warehouse.landing.manifest import Manifest
from membersync.warehouse.landing.paths import DataDir
from membersync.warehouse.landing.remote import refresh_mirror

AUDITED_TABLES: tuple[str, ...] = (
    "clients",
    "memberships",
    "ledger_balances",
    "points_balances",
    "points_transactions",
    "transactions",
    "transaction_lines",
    "transaction_payments",
    "client_packages",
    "comm_prefs",
    "billing_accounts",
)
# Personal fields are compared as the digest of the newest identity held (models.privacy).
IDENTITY = T.CLIENT_IDENTITY.name
COMPARED: tuple[str, ...] = (*AUDITED_TABLES, IDENTITY)
# Columns that differ between two fetches of an unchanged client: the service stamps every
# ledger answer with today's date (``asOf``), so comparing it would flag every client.
VOLATILE_COLUMNS: dict[str, frozenset[str]] = {"ledger_balances": frozenset({"as_of"})}
# What one audited client costs: the nine per-client reads (the audit skips the affiliated
# package round: it compares none of that table, and the budget stays exact).
REQUESTS_PER_CLIENT = len(B.FANOUT_ENDPOINTS)

Key = tuple[Any, ...]
Row = tuple[Any, ...]
State = dict[str, dict[str, dict[Key, Row]]]  # table -> client -> key -> compared values


# --- options and the sample -------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditOptions:
    """How big the nightly sample is and when differing clients are re-synced."""

    share: float = 0.01  # of all known clients
    minimum: int = 20  # clients, unless the request budget is smaller
    max_requests: int = 10_000  # the audit's request budget per night (9 per client)
    heal: str = "next"  # next: the next night re-syncs them; now: this night does

    @classmethod
    def from_settings(cls, settings: Settings) -> AuditOptions:
        """``MEMBERSYNC_AUDIT_SHARE`` (0..1), ``MEMBERSYNC_AUDIT_MIN``, ``MEMBERSYNC_AUDIT_MAX_REQUESTS``
        (0 turns the nightly audit off) and ``MEMBERSYNC_AUDIT_HEAL`` (next|now)."""
        return cls(
            share=settings.audit_share,
            minimum=settings.audit_min,
            max_requests=settings.audit_max_requests,
            heal=settings.audit_heal,
        )


def sample_size(known: int, candidates: int, options: AuditOptions) -> int:
    """Clients to audit: ``share`` of the ``known`` clients, at least ``minimum``, never more
    than the request budget pays for, nor more than there are ``candidates``."""
    wanted = max(options.minimum, math.ceil(options.share * known))
    affordable = options.max_requests // REQUESTS_PER_CLIENT
    return max(0, min(wanted, affordable, candidates))


def pick_sample(candidates: Iterable[str], size: int, seed: str) -> list[str]:
    """A seeded random sample (sorted): the same night and candidates give the same sample, so a
    resumed night audits the clients its first run audited."""
    pool = sorted(set(candidates))
    return sorted(random.Random(seed).sample(pool, min(size, len(pool))))


def night_seed(night: dt.date) -> str:
    return f"membersync-audit-{night.isoformat()}"


# --- what the landing zone holds --------------------------------------------------------------------


@dataclass(frozen=True)
class Holdings:
    """Which committed nights synced each client (by surrogate key, oldest first), and the
    identity links that turn a key into the number to fetch, from the manifests only."""

    nights: dict[str, list[dt.date]]
    manifests: dict[dt.date, Manifest]
    numbers: dict[str, str] = field(default_factory=dict)  # key -> number (none once forgotten)
    digests: dict[str, str | None] = field(default_factory=dict)  # key -> newest identity digest
    mask: IdentityMask = field(default_factory=IdentityMask)  # as a night masks untrusted text

    @property
    def known(self) -> list[str]:
        """The keys that can be audited: synced, and linked to a number (not forgotten)."""
        return sorted(k for k in self.nights if k in self.numbers)

    @property
    def keys(self) -> dict[str, str]:
        return {number: key for key, number in self.numbers.items()}

    def newest(self, client: str) -> dt.date:
        return self.nights[client][-1]


def read_holdings(zone: Any) -> Holdings:
    """Every client any committed night synced, with those nights (``synced_clients`` of each
    manifest: only committed files are read, never a night being written), and the mask a
    night would land their text with."""
    from membersync.warehouse.landing.identity import erasure_key, identity_mask, read_links, read_register
    from membersync.warehouse.landing.storage import store_for

    data_dir = zone.data_dir

    # refresh_mirror: the committed nights (and, for an s3:// location, a local copy of their files)
    manifests = {m.snapshot_date: m for m in refresh_mirror(data_dir)}
    nights: dict[str, list[dt.date]] = {}
    for night in sorted(manifests):
        for key in _read_files(data_dir, manifests[night], "synced_clients", ["client_key"], None)[
            "client_key"
        ].to_pylist():
            held = nights.setdefault(key, [])
            if not held or held[-1] != night:
                held.append(night)
    links = read_links(store_for(data_dir), manifests.values()).sort_by("snapshot_date")
    numbers: dict[str, str] = {}
    digests: dict[str, str | None] = {}
    for key, number, digest in zip(
        *(links[c].to_pylist() for c in ("client_key", "client_number", "identity_digest")), strict=True
    ):
        numbers[key] = number
        digests[key] = digest if digest is not None else digests.get(key)
    register_key = erasure_key(zone, create=False) if read_register(zone.store).erasures else None
    mask = identity_mask(zone, manifests.values(), register_key, numbers.values())
    return Holdings(nights, manifests, numbers, digests, mask)


def _read_files(
    data_dir: DataDir,
    manifest: Manifest,
    table: str,
    columns: list[str] | None,
    clients: Sequence[str] | None,
) -> pa.Table:
    """One table's committed rows of one night, optionally only some columns and clients (keys)."""
    schema = T.landed(table).schema
    files = manifest.tables.get(table)
    filters = [("client_key", "in", list(clients))] if clients is not None else None
    parts = [
        pq.read_table(data_dir.landing / name, schema=schema, columns=columns, filters=filters)
        for name in (files.files if files else ())
    ]
    if not parts:
        empty = schema.empty_table()
        return empty.select(columns) if columns else empty
    return pa.concat_tables(parts)


def landed_state(data_dir: DataDir, holdings: Holdings, clients: Sequence[str]) -> State:
    """The landing zone's current state of ``clients`` (keys; see the module docstring)."""
    state: State = {name: {} for name in COMPARED}
    newest_of: dict[dt.date, list[str]] = {}
    held_on: dict[dt.date, list[str]] = {}
    for key in clients:
        newest_of.setdefault(holdings.newest(key), []).append(key)
        for night in holdings.nights[key]:
            held_on.setdefault(night, []).append(key)
    for name in AUDITED_TABLES:
        scope = T.landed(name).scope
        # Events: every night that held the client, oldest first, so the newest version wins.
        chosen = newest_of if scope == "current" else held_on
        for night in sorted(chosen):
            rows = _read_files(data_dir, holdings.manifests[night], name, None, chosen[night])
            for key, keyed in keyed_rows(name, rows).items():
                state[name].setdefault(key, {}).update(keyed)
    for key in clients:  # personal fields: the digest of the newest identity held
        state[IDENTITY][key] = {(key,): (holdings.digests.get(key),)}
    return state


def keyed_rows(table: str, rows: pa.Table) -> dict[str, dict[Key, Row]]:
    """Rows by client (key) and row key, with every compared column (all but the volatile ones)."""
    spec = T.landed(table)
    skip = VOLATILE_COLUMNS.get(table, frozenset())
    compared = [name for name in spec.schema.names if name not in skip]
    out: dict[str, dict[Key, Row]] = {}
    for row in rows.select(compared).to_pylist():
        key = tuple(row[k] for k in spec.key)
        out.setdefault(row["client_key"], {})[key] = tuple(row[c] for c in compared)
    return out


# --- the live state ---------------------------------------------------------------------------------


class _HeldKeys:
    """A key book over the links held: the live answers land as the night would land them
    (every identity digest computed, nothing assigned: a number not linked yet shows as such)."""

    def __init__(self, keys: Mapping[str, str], mask: IdentityMask) -> None:
        self.keys = keys
        self.mask = mask

    def assign(self, numbers: Iterable[str]) -> dict[str, str]:
        return {n: self.keys.get(n, f"unlinked {n}") for n in numbers}

    def wants_identity(self, number: str, digest: str) -> bool:
        return True

    def wants_link(self, number: str, synced_here: bool) -> bool:
        return False


@dataclass
class Live:
    """The sampled clients' live state, and what a night's discovery would record for them."""

    state: State
    records: dict[str, B.ClientRef]  # client key -> what a discovery would keep of it


async def fetch_live(
    client: Any,
    holdings: Holdings,
    sample: Sequence[str],
    tz: TimezoneLookup,
    window: B.Window,
    batch_size: int,
) -> Live:
    """Fetch the clients' state, ``batch_size`` clients at a time (as a night does), landed as a
    night would land it (keys for numbers, identity as its digest)."""
    from membersync.models.privacy import land_batch

    book = _HeldKeys(holdings.keys, holdings.mask)
    numbers = [holdings.numbers[k] for k in sample]
    state: State = {name: {} for name in COMPARED}
    records: dict[str, B.ClientRef] = {}
    for start in range(0, len(numbers), max(1, batch_size)):
        chunk = numbers[start : start + batch_size]
        # type_batch lands a synced_clients row per client from these discovery fields.
        records_in = tuple(B.ClientRef(n, None, None) for n in chunk)
        raw = await B.fetch_batch_raw(client, B.Batch(f"audit-{start}", records_in), window, frozenset())
        landed = land_batch(B.type_batch(raw, tz).tables, book)
        for name in AUDITED_TABLES:
            for key, keyed in keyed_rows(name, landed[name]).items():
                state[name].setdefault(key, {}).update(keyed)
        identity = landed[T.CLIENT_IDENTITY.name]
        for key, digest in zip(
            *(identity[c].to_pylist() for c in ("client_key", "identity_digest")), strict=True
        ):
            state[IDENTITY][key] = {(key,): (digest,)}
        for number, answers in raw.answers.items():
            details = answers.get("clientdetails")
            details = details if isinstance(details, dict) else {}
            key = book.assign([number])[number]
            records[key] = B.ClientRef(number, details.get("homeStore"), details.get("lastModified"))
    return Live(state, records)


# --- the comparison ---------------------------------------------------------------------------------


def key_text(table: str, key: Key) -> str:
    """A row key as people read it: its columns but the client's key, joined by ``/``."""
    spec = T.landed(table)
    parts = [str(v) for name, v in zip(spec.key, key, strict=True) if name != "client_key"]
    return "/".join(parts) if parts else "-"


def differences(landed: State, live: State, clients: Iterable[str]) -> dict[str, dict[str, list[str]]]:
    """client key -> table -> row keys whose rows differ (missing on one side, or any compared value)."""
    out: dict[str, dict[str, list[str]]] = {}
    for client_key in sorted(clients):
        for table in COMPARED:
            ours = landed[table].get(client_key, {})
            theirs = live[table].get(client_key, {})
            differing = [k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k)]
            if differing:
                keys = sorted(key_text(table, k) for k in differing)
                out.setdefault(client_key, {})[table] = keys
    return out


@dataclass
class AuditResult:
    """One audit: the clients sampled (keys) and, for those that differed, the tables and keys."""

    sampled: list[str]
    differed: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    records: dict[str, B.ClientRef] = field(default_factory=dict)  # of the clients that differed

    @property
    def tables(self) -> list[str]:
        return sorted({t for by_table in self.differed.values() for t in by_table})

    @property
    def keys(self) -> int:
        return sum(len(keys) for by_table in self.differed.values() for keys in by_table.values())

    def counts(self) -> dict[str, int]:
        return {
            "sampled": len(self.sampled),
            "differed": len(self.differed),
            "tables": len(self.tables),
            "keys": self.keys,
        }

    def report(self, label: str) -> dict[str, Any]:
        """The audit's report file body: client keys, table names and row keys, never a value."""
        return {
            "format": 2,
            "audit": label,
            **self.counts(),
            "sampled_clients": self.sampled,
            "differed": self.differed,
        }


async def audit_clients(
    client: Any,
    data_dir: DataDir,
    holdings: Holdings,
    sample: Sequence[str],
    tz: TimezoneLookup,
    window: B.Window,
    batch_size: int,
) -> AuditResult:
    """Fetch ``sample`` (keys) live and compare it with the landing zone's state of the same clients."""
    import asyncio

    live = await fetch_live(client, holdings, sample, tz, window, batch_size)
    landed = await asyncio.to_thread(landed_state, data_dir, holdings, sample)
    differed = differences(landed, live.state, sample)
    return AuditResult(list(sample), differed, {k: live.records[k] for k in differed})


# --- the re-sync queue and the reports --------------------------------------------------------------


def resync_file(data_dir: DataDir) -> Path:
    return data_dir.state_file.parent / "resync.json"


def audit_report_file(data_dir: DataDir, label: str) -> Path:
    return data_dir.state_file.parent / "audits" / f"{label}.json"


def read_queue(data_dir: DataDir) -> dict[str, dict[str, Any]]:
    """Clients waiting for a full re-sync: client key -> {homeStore, lastModified, found, tables}
    (no client number: a night finds the number through the identity links)."""
    try:
        body = json.loads(resync_file(data_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    clients = body.get("clients") if isinstance(body, dict) and body.get("format") == 2 else None
    if not isinstance(clients, dict):  # format 1 (by number) is rewritten by key on migration
        return {}
    return {n: e for n, e in clients.items() if isinstance(n, str) and isinstance(e, dict)}


def queue_for_resync(data_dir: DataDir, result: AuditResult, found: str) -> None:
    """Add the clients that differed to the queue (kept until a night that synced them commits)."""
    if not result.differed:
        return
    queue = read_queue(data_dir)
    for key, by_table in result.differed.items():
        record = result.records.get(key) or B.ClientRef("", None, None)
        fields = {k: v for k, v in record.wire().items() if k != "clientNumber"}
        queue[key] = {**fields, "found": found, "tables": sorted(by_table)}
    _write_queue(data_dir, queue)


def forget_synced(data_dir: DataDir, synced: Iterable[str]) -> int:
    """Drop the clients (keys) a committed night synced from the queue; returns how many."""
    queue = read_queue(data_dir)
    done = queue.keys() & set(synced)
    if done:
        _write_queue(data_dir, {n: e for n, e in queue.items() if n not in done})
    return len(done)


def queued_discovery(queue: Mapping[str, Mapping[str, Any]], numbers: Mapping[str, str]) -> list[B.ClientRef]:
    """The queue as discovery records for a night (``numbers``: key -> number, the identity links;
    a key linked to no one, forgotten since, is skipped)."""
    return [
        B.ClientRef(numbers[k], e.get("homeStore"), e.get("lastModified"))
        for k, e in sorted(queue.items())
        if k in numbers
    ]


def _write_queue(data_dir: DataDir, queue: Mapping[str, Any]) -> None:
    body = {"format": 2, "clients": dict(sorted(queue.items()))}  # 2: by client key
    write_json_atomic(resync_file(data_dir), body)


def write_report(data_dir: DataDir, result: AuditResult, label: str) -> Path:
    path = audit_report_file(data_dir, label)
    write_json_atomic(path, result.report(label))
    return path
