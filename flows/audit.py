"""The self-audit: re-fetch clients a night did not sync and compare them with what we hold.

An incremental night discovers clients by ``modifiedSince``, so a change the vendor makes
without bumping ``lastModified`` (an EFT draw posted by a batch job, a back-office correction)
is never synced. The audit samples clients *not* synced tonight, fetches their live state
through the night's own per-client fan-out (:func:`membersync.flows.batches.fetch_batch_raw`
and :func:`~membersync.flows.batches.type_batch`), and compares it, table by table and key by
key, with the landing zone's committed state for them. Clients that differ are queued in
``DATA_DIR/state/resync.json``; the next night (or, with ``MEMBERSYNC_AUDIT_HEAL=now``, the
same night) syncs them in full, and the queue forgets a client only when a night that synced
it commits.

What "the landing's state" of a client is mirrors the warehouse (without using its SQL):

* current-state tables (clients, memberships, ledgers, ...): the rows of the newest committed
  night that synced the client (a client synced on a night lands its whole state);
* event tables (transactions, their lines and payments, points transactions): every key the
  client ever had, each in its newest fetched version (an old night's event stays history).

Nothing here knows about Prefect; :mod:`membersync.flows.nightly` calls :func:`audit_clients`
for a night and :mod:`membersync.flows.audit_cli` for ``membersync audit``. The reports hold
table names, keys and client numbers only, never a value.
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
from membersync.flows import batches as B
from membersync.models import tables as T
from membersync.models.coerce import TimezoneLookup
from membersync.warehouse.atomic import write_json_atomic
from membersync.warehouse.manifest import Manifest
from membersync.warehouse.paths import DataDir
from membersync.warehouse.storage import refresh_mirror

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
    """Which committed nights synced each client (oldest first), from the manifests only."""

    nights: dict[str, list[dt.date]]
    manifests: dict[dt.date, Manifest]

    @property
    def known(self) -> list[str]:
        return sorted(self.nights)

    def newest(self, client: str) -> dt.date:
        return self.nights[client][-1]


def read_holdings(data_dir: DataDir) -> Holdings:
    """Every client any committed night synced, with those nights (``synced_clients`` of each
    manifest: only committed files are read, never a night being written)."""
    # refresh_mirror: the committed nights (and, for an s3:// location, a local copy of their files)
    manifests = {m.snapshot_date: m for m in refresh_mirror(data_dir)}
    nights: dict[str, list[dt.date]] = {}
    for night in sorted(manifests):
        for number in _read_files(data_dir, manifests[night], "synced_clients", ["client_number"], None)[
            "client_number"
        ].to_pylist():
            held = nights.setdefault(number, [])
            if not held or held[-1] != night:
                held.append(night)
    return Holdings(nights, manifests)


def _read_files(
    data_dir: DataDir,
    manifest: Manifest,
    table: str,
    columns: list[str] | None,
    clients: Sequence[str] | None,
) -> pa.Table:
    """One table's committed rows of one night, optionally only some columns and clients."""
    schema = T.table(table).schema
    files = manifest.tables.get(table)
    filters = [("client_number", "in", list(clients))] if clients is not None else None
    parts = [
        pq.read_table(data_dir.landing / name, schema=schema, columns=columns, filters=filters)
        for name in (files.files if files else ())
    ]
    if not parts:
        empty = schema.empty_table()
        return empty.select(columns) if columns else empty
    return pa.concat_tables(parts)


def landed_state(data_dir: DataDir, holdings: Holdings, clients: Sequence[str]) -> State:
    """The landing zone's current state of ``clients`` (see the module docstring)."""
    state: State = {name: {} for name in AUDITED_TABLES}
    newest_of: dict[dt.date, list[str]] = {}
    held_on: dict[dt.date, list[str]] = {}
    for number in clients:
        newest_of.setdefault(holdings.newest(number), []).append(number)
        for night in holdings.nights[number]:
            held_on.setdefault(night, []).append(number)
    for name in AUDITED_TABLES:
        scope = T.table(name).scope
        # Events: every night that held the client, oldest first, so the newest version wins.
        chosen = newest_of if scope == "current" else held_on
        for night in sorted(chosen):
            rows = _read_files(data_dir, holdings.manifests[night], name, None, chosen[night])
            for number, keyed in keyed_rows(name, rows).items():
                state[name].setdefault(number, {}).update(keyed)
    return state


def keyed_rows(table: str, rows: pa.Table) -> dict[str, dict[Key, Row]]:
    """Rows by client and key, with every compared column (all but the volatile ones)."""
    spec = T.table(table)
    skip = VOLATILE_COLUMNS.get(table, frozenset())
    compared = [name for name in spec.schema.names if name not in skip]
    out: dict[str, dict[Key, Row]] = {}
    for row in rows.select(compared).to_pylist():
        key = tuple(row[k] for k in spec.key)
        out.setdefault(row["client_number"], {})[key] = tuple(row[c] for c in compared)
    return out


# --- the live state ---------------------------------------------------------------------------------


@dataclass
class Live:
    """The sampled clients' live state, and what a night's discovery would record for them."""

    state: State
    records: dict[str, B.ClientRef]  # clientNumber -> what a discovery would keep of it


async def fetch_live(
    client: Any, numbers: Sequence[str], tz: TimezoneLookup, window: B.Window, batch_size: int
) -> Live:
    """Fetch and type the clients' state, ``batch_size`` clients at a time (as a night does)."""
    state: State = {name: {} for name in AUDITED_TABLES}
    records: dict[str, B.ClientRef] = {}
    for start in range(0, len(numbers), max(1, batch_size)):
        chunk = numbers[start : start + batch_size]
        # type_batch lands a synced_clients row per client from these discovery fields.
        records_in = tuple(B.ClientRef(n, None, None) for n in chunk)
        raw = await B.fetch_batch_raw(client, B.Batch(f"audit-{start}", records_in), window, frozenset())
        typed = B.type_batch(raw, tz)
        for name in AUDITED_TABLES:
            for number, keyed in keyed_rows(name, typed.tables[name]).items():
                state[name].setdefault(number, {}).update(keyed)
        for number, answers in raw.answers.items():
            details = answers.get("clientdetails")
            details = details if isinstance(details, dict) else {}
            records[number] = B.ClientRef(number, details.get("homeStore"), details.get("lastModified"))
    return Live(state, records)


# --- the comparison ---------------------------------------------------------------------------------


def key_text(table: str, key: Key) -> str:
    """A key as people read it: its columns but the client number, joined by ``/``."""
    spec = T.table(table)
    parts = [str(v) for name, v in zip(spec.key, key, strict=True) if name != "client_number"]
    return "/".join(parts) if parts else str(key[0])


def differences(landed: State, live: State, clients: Iterable[str]) -> dict[str, dict[str, list[str]]]:
    """client -> table -> keys whose rows differ (missing on one side, or any compared value)."""
    out: dict[str, dict[str, list[str]]] = {}
    for number in sorted(clients):
        for table in AUDITED_TABLES:
            ours = landed[table].get(number, {})
            theirs = live[table].get(number, {})
            differing = [k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k)]
            if differing:
                keys = sorted(key_text(table, k) for k in differing)
                out.setdefault(number, {})[table] = keys
    return out


@dataclass
class AuditResult:
    """One audit: the clients sampled and, for those that differed, the tables and keys."""

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
        """The audit's report file body: client numbers, table names and keys, never a value."""
        return {
            "format": 1,
            "audit": label,
            **self.counts(),
            "sampled": self.sampled,
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
    """Fetch ``sample`` live and compare it with the landing zone's state of the same clients."""
    import asyncio

    live = await fetch_live(client, sample, tz, window, batch_size)
    landed = await asyncio.to_thread(landed_state, data_dir, holdings, sample)
    differed = differences(landed, live.state, sample)
    return AuditResult(list(sample), differed, {n: live.records[n] for n in differed})


# --- the re-sync queue and the reports --------------------------------------------------------------


def resync_file(data_dir: DataDir) -> Path:
    return data_dir.state_file.parent / "resync.json"


def audit_report_file(data_dir: DataDir, label: str) -> Path:
    return data_dir.state_file.parent / "audits" / f"{label}.json"


def read_queue(data_dir: DataDir) -> dict[str, dict[str, Any]]:
    """Clients waiting for a full re-sync: clientNumber -> {discovery fields, found, tables}."""
    try:
        body = json.loads(resync_file(data_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    clients = body.get("clients") if isinstance(body, dict) else None
    if not isinstance(clients, dict):
        return {}
    return {n: e for n, e in clients.items() if isinstance(n, str) and isinstance(e, dict)}


def queue_for_resync(data_dir: DataDir, result: AuditResult, found: str) -> None:
    """Add the clients that differed to the queue (kept until a night that synced them commits)."""
    if not result.differed:
        return
    queue = read_queue(data_dir)
    for number, by_table in result.differed.items():
        record = result.records.get(number) or B.ClientRef(number, None, None)
        queue[number] = {**record.wire(), "found": found, "tables": sorted(by_table)}
    _write_queue(data_dir, queue)


def forget_synced(data_dir: DataDir, synced: Iterable[str]) -> int:
    """Drop the clients a committed night synced from the queue; returns how many were dropped."""
    queue = read_queue(data_dir)
    done = queue.keys() & set(synced)
    if done:
        _write_queue(data_dir, {n: e for n, e in queue.items() if n not in done})
    return len(done)


def queued_discovery(queue: Mapping[str, Mapping[str, Any]]) -> list[B.ClientRef]:
    """The queue as discovery records for a night."""
    return [B.ClientRef(n, e.get("homeStore"), e.get("lastModified")) for n, e in sorted(queue.items())]


def _write_queue(data_dir: DataDir, queue: Mapping[str, Any]) -> None:
    body = {"format": 1, "clients": dict(sorted(queue.items()))}
    write_json_atomic(resync_file(data_dir), body)


def write_report(data_dir: DataDir, result: AuditResult, label: str) -> Path:
    path = audit_report_file(data_dir, label)
    write_json_atomic(path, result.report(label))
    return path
