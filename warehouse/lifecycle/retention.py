"""Retention by business date: ``MEMBERSYNC_RETENTION=daily=400d,monthly=7y,identity=3y``.

Horizons count back from the newest committed night (a business date, not the clock):

* ``daily``: nights older than it are **thinned** to month-end nights (each month keeps its
  newest committed night);
* ``monthly``: nights older than it are **removed**;
* ``identity``: a client with no activity for that long (``marts.client_activity``: no
  membership running, no balance, no sale, payment or points movement since) is **forgotten**
  (:mod:`membersync.warehouse.lifecycle.forget`).

Unset (the default), everything is kept. Applied after each committed night and by
``membersync retention [--dry-run]``.

Removing a night must not change what the nights kept say. A client's state as of a night is
their newest snapshot at or before it, and an event's is its newest fetched version, so the rows
of a removed night that a later night still relies on are **carried** into the next night kept
(one file per table, named by the run of retention) before the removed night goes: the kept
nights' state is then whole on its own, and a full rebuild from the landing zone finds it. Then
the removed nights' manifests, files (every version, on ``s3://``) and report folders go, and the
warehouse drops their rows from its parts (:func:`membersync.warehouse.build.publish.prune_nights`):
every report of a night kept stays as it was built, and the monthly figures
(``reports.membership_roll_forward_mtd``) of a thinned month outlive its daily nights.

A run is recorded in ``privacy/retention.json`` (pending first, so a crash is finished by the
next run; every step is idempotent) with what it removed, and where the history now starts.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa
from membersync.extract.settings import RetentionPolicy
from membersync.models import tables as T
from membersync.warehouse.build.memory import bound_connection
from membersync.warehouse.exports import open_tables, postgres
from membersync.warehouse.landing.manifest import Manifest
from membersync.warehouse.landing.remote import remove_reports
from membersync.warehouse.landing.rewrite import TableRewrite

log = logging.getLogger(__name__)

JOURNAL = "privacy/retention.json"
JOURNAL_FORMAT = 1


# A night's business date may run ahead of the UTC date by the stores' offset (at most a day).
FUTURE_SLACK = dt.timedelta(days=1)


class RetentionRefused(RuntimeError):
    """Retention cannot be applied safely; the message says why (nothing was changed)."""


# --- which nights ------------------------------------------------------------------------------


@dataclass(frozen=True)
class NightPlan:
    """The nights a policy keeps and removes, and where each kind of history starts."""

    newest: dt.date
    removed: list[dt.date]
    kept: list[dt.date]
    daily_from: dt.date | None  # nights before it are month-end nights only
    monthly_from: dt.date | None  # nights before it are gone

    def runs(self) -> list[tuple[list[dt.date], dt.date]]:
        """Each stretch of removed nights with the kept night right after it (which inherits
        what they still hold); the newest night is always kept."""
        out: list[tuple[list[dt.date], dt.date]] = []
        pending: list[dt.date] = []
        removed = set(self.removed)
        for night in sorted([*self.kept, *self.removed]):
            if night in removed:
                pending.append(night)
            elif pending:
                out.append((pending, night))
                pending = []
        return out


def plan_nights(nights: Sequence[dt.date], policy: RetentionPolicy) -> NightPlan:
    """Which committed nights ``policy`` keeps (by business date; see the module's docstring)."""
    ordered = sorted(set(nights))
    newest = ordered[-1]
    daily_from = policy.daily.before(newest) if policy.daily else None
    monthly_from = policy.monthly.before(newest) if policy.monthly else None
    month_ends = {max(n for n in ordered if (n.year, n.month) == (d.year, d.month)) for d in ordered}
    removed = [
        n
        for n in ordered
        if (monthly_from is not None and n < monthly_from)
        or (daily_from is not None and n < daily_from and n not in month_ends)
    ]
    kept = [n for n in ordered if n not in set(removed)]
    return NightPlan(newest, removed, kept, daily_from, monthly_from)


# --- which clients -------------------------------------------------------------------------------


def inactive_clients(data_dir: Any, policy: RetentionPolicy, newest: dt.date, linked: set[str]) -> list[str]:
    """Keys of the clients still identified whose last activity is older than the identity horizon."""
    if policy.identity is None or not data_dir.warehouse_db.is_file():
        return []
    cutoff = policy.identity.before(newest)
    with contextlib.closing(bound_connection(data_dir, str(data_dir.warehouse_db), read_only=True)) as con:
        rows = con.execute(
            "SELECT client_key FROM marts.client_activity "
            "WHERE NOT active_now AND coalesce(last_activity_date, DATE '0001-01-01') < ?",
            [cutoff],
        ).fetchall()
    return sorted(k for (k,) in rows if k in linked)


# --- carrying what a kept night still needs ------------------------------------------------------


def read_night(zone: Any, manifest: Manifest, table: T.LandedTable) -> pa.Table:
    """One table of one night as landed, with the night and each row's order (file, row)."""
    files = manifest.tables.get(table.name)
    parts = []
    for index, relative in enumerate(files.files if files else ()):
        part = zone.store.read_table(relative, table.schema)
        part = part.append_column("_night", pa.array([manifest.snapshot_date] * part.num_rows, pa.date32()))
        part = part.append_column("_file", pa.array([index] * part.num_rows, pa.int32()))
        parts.append(part.append_column("_row", pa.array(range(part.num_rows), pa.int64())))
    if not parts:
        empty = table.schema.empty_table()
        for name, kind in (("_night", pa.date32()), ("_file", pa.int32()), ("_row", pa.int64())):
            empty = empty.append_column(name, pa.array([], kind))
        return empty
    return pa.concat_tables(parts)


def carried_rows(zone: Any, run: Sequence[Manifest], kept: Manifest) -> dict[str, pa.Table]:
    """Rows of the removed nights ``run`` that the kept night after them still relies on: each
    client's newest snapshot among them (unless the kept night synced the client again), each
    event's and identity's newest version (unless the kept night holds that key)."""
    synced = T.landed("synced_clients")
    con = bound_connection(zone.data_dir)
    try:
        con.register("run_synced", pa.concat_tables([read_night(zone, m, synced) for m in run]))
        con.register("kept_synced", read_night(zone, kept, synced))
        con.execute(
            "CREATE TEMP TABLE newest_snapshot AS SELECT client_key, max(_night) AS _night FROM run_synced "
            "WHERE client_key NOT IN (SELECT client_key FROM kept_synced) GROUP BY client_key"
        )
        out = {}
        for table in T.LANDED:
            if table.scope == "config":
                continue
            rows = _carried_of(con, zone, run, kept, table)
            if rows.num_rows:
                out[table.name] = rows
        return out
    finally:
        con.close()


def _carried_of(
    con: duckdb.DuckDBPyConnection, zone: Any, run: Sequence[Manifest], kept: Manifest, table: T.LandedTable
) -> pa.Table:
    con.register("run_rows", pa.concat_tables([read_night(zone, m, table) for m in run]))
    columns = ", ".join(f'"{c}"' for c in table.schema.names)
    if table.scope == "current":
        query = (
            f"SELECT {columns} FROM run_rows JOIN newest_snapshot USING (client_key, _night) "
            "ORDER BY _night, _file, _row"
        )
    else:
        con.register("kept_rows", read_night(zone, kept, table))
        key = ", ".join(table.key)
        query = (
            f"SELECT {columns} FROM run_rows "
            f"WHERE ({key}) NOT IN (SELECT ({key}) FROM kept_rows) "
            f"QUALIFY row_number() OVER (PARTITION BY {key} ORDER BY _night DESC, _file DESC, _row DESC) = 1 "
            "ORDER BY _night, _file, _row"
        )
    found: pa.Table = con.execute(query).to_arrow_table()
    return found.cast(table.schema)


def carry_into(zone: Any, kept: Manifest, rows: dict[str, pa.Table], run_id: str) -> Manifest:
    """The carried rows as files of the kept night (its ``committed_at`` kept: what the night
    says did not change). Idempotent by ``run_id``: the files' names hold it."""
    name = f"part-retained-{run_id}.parquet"
    night = kept.snapshot_date.isoformat()
    changes = {
        table: TableRewrite(add=((f"{table}/snapshot_date={night}/{name}", data),))
        for table, data in rows.items()
    }
    return zone.rewrite_night(kept, changes)  # type: ignore[no-any-return]


def drop_night(zone: Any, manifest: Manifest) -> int:
    """A removed night: its manifest (the commit goes first), its files, then its report folder."""
    erased: int = zone.remove_night(manifest)
    remove_reports(zone.data_dir, manifest.snapshot_date.isoformat())
    return erased


# --- the journal -----------------------------------------------------------------------------------


@dataclass
class Journal:
    pending: dict[str, Any] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    version: str | None = None

    def to_json(self) -> bytes:
        body = {"format": JOURNAL_FORMAT, "pending": self.pending, "history": self.history}
        return json.dumps(body, indent=1, sort_keys=True).encode()


def read_journal(store: Any) -> Journal:
    data, version = store.read_doc(JOURNAL)
    if data is None:
        return Journal(version=version)
    body = json.loads(data)
    return Journal(body.get("pending"), list(body.get("history") or []), version)


def write_journal(store: Any, journal: Journal) -> None:
    journal.version = store.write_doc(JOURNAL, journal.to_json(), journal.version)


# --- one run ----------------------------------------------------------------------------------------


@dataclass
class RetentionOutcome:
    policy: str
    removed: list[str] = field(default_factory=list)
    kept: int = 0
    carried: dict[str, int] = field(default_factory=dict)
    forgotten: int = 0
    starts: dict[str, str | None] = field(default_factory=dict)


def apply_retention(
    zone: Any, policy: RetentionPolicy, *, dry_run: bool = False, today: dt.date | None = None
) -> RetentionOutcome:
    """Apply ``policy`` to the zone (the caller holds the lock); with ``dry_run`` only say what
    would go. A run a crash left pending is finished first. Refused (:class:`RetentionRefused`)
    when the newest night is after ``today`` (default: the clock's UTC date): the horizons count
    back from it, so one night dated wrongly would remove, and forget, nearly everything."""
    journal = read_journal(zone.store)
    if journal.pending and not dry_run:
        _finish(zone, journal)
        journal = read_journal(zone.store)
    manifests = zone.manifests()
    outcome = RetentionOutcome(str(policy))
    if not manifests or policy.keeps_everything:
        return outcome
    check_clock(manifests, today)
    nights = plan_nights([m.snapshot_date for m in manifests], policy)
    outcome.removed = [n.isoformat() for n in nights.removed]
    outcome.kept = len(nights.kept)
    outcome.starts = _starts(nights)
    forgotten = _inactive(zone, policy, nights.newest)
    outcome.forgotten = len(forgotten)
    if dry_run or (not nights.removed and not forgotten):
        return outcome
    journal.pending = {
        "id": f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}",
        "policy": str(policy),
        "removed": outcome.removed,
        "forget": forgotten,
        "starts": outcome.starts,
    }
    write_journal(zone.store, journal)
    outcome.carried = _finish(zone, journal)
    return outcome


def check_clock(manifests: Sequence[Manifest], today: dt.date | None = None) -> None:
    """Raise :class:`RetentionRefused` when the newest night is after ``today`` (default: the
    clock's UTC date, with a day's slack for the stores' offsets)."""
    if not manifests:
        return
    newest = max(m.snapshot_date for m in manifests)
    today = today or dt.datetime.now(dt.UTC).date()
    if newest > today + FUTURE_SLACK:
        raise RetentionRefused(
            f"retention refused: the newest committed night {newest.isoformat()} is after today "
            f"({today.isoformat()}); a night dated wrongly would make the horizons remove recent "
            "history: check the clock, remove that night, then run it again"
        )


def finish_pending_retention(zone: Any) -> None:
    """Finish a retention run a crash left pending (the caller holds the lock)."""
    journal = read_journal(zone.store)
    if journal.pending:
        _finish(zone, journal)


def _starts(nights: NightPlan) -> dict[str, str | None]:
    kept = sorted(nights.kept)
    daily = [n for n in kept if nights.daily_from is None or n >= nights.daily_from]
    return {"history": kept[0].isoformat(), "daily": daily[0].isoformat() if daily else None}


def _inactive(zone: Any, policy: RetentionPolicy, newest: dt.date) -> list[str]:
    from membersync.warehouse.landing.identity import read_links

    if policy.identity is None:
        return []
    links = read_links(zone.store, zone.manifests())
    return inactive_clients(zone.data_dir, policy, newest, set(links["client_key"].to_pylist()))


def _finish(zone: Any, journal: Journal) -> dict[str, int]:
    """Carry, remove, prune, forget: the pending run to its end (idempotent)."""
    from membersync.warehouse.build.publish import prune_nights

    pending = journal.pending or {}
    removed = {dt.date.fromisoformat(n) for n in pending.get("removed", [])}
    by_night = {m.snapshot_date: m for m in zone.manifests()}
    carried: dict[str, int] = {}
    plan = NightPlan(
        max(by_night), sorted(removed & set(by_night)), sorted(set(by_night) - removed), None, None
    )
    for run, kept in plan.runs():
        rows = carried_rows(zone, [by_night[n] for n in run], by_night[kept])
        by_night[kept] = carry_into(zone, by_night[kept], rows, str(pending["id"]))
        for table, data in rows.items():
            carried[table] = carried.get(table, 0) + data.num_rows
        for night in run:
            drop_night(zone, by_night[night])
    zone.recover(full=True)
    prune_nights(zone.data_dir, sorted(removed))
    open_tables.remove_nights(zone.data_dir, sorted(removed))  # no version of a Delta table keeps them
    _forget_inactive(zone, pending)
    postgres.publish_if_configured(zone.data_dir)  # the removed nights leave the BI tools' database too
    journal.history.append(
        {**pending, "carried": carried, "finished_at": f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H:%M:%SZ}"}
    )
    journal.pending = None
    write_journal(zone.store, journal)
    return carried


def _forget_inactive(zone: Any, pending: dict[str, Any]) -> None:
    """The identity horizon: the inactive clients forgotten like ``membersync forget`` does."""
    from membersync.warehouse.landing.identity import client_hmac, erasure_key, read_links
    from membersync.warehouse.lifecycle import forget as F

    keys = set(pending.get("forget") or [])
    if not keys:
        return
    links = read_links(zone.store, zone.manifests())
    numbers = {
        k: n for k, n in zip(links["client_key"].to_pylist(), links["client_number"].to_pylist(), strict=True)
    }
    register_key = erasure_key(zone, create=True)
    targets = [
        F.Target(numbers[k], k, client_hmac(register_key, numbers[k]), True)
        for k in sorted(keys)
        if k in numbers
    ]
    if targets:
        erasure = F.start(
            zone, targets, f"retention: no activity within {pending.get('policy')}", register_key
        )
        F.finish(zone, erasure.id)
