"""Forget a person everywhere: ``membersync forget CLIENT_NUMBER...``.

A client's identity lives in the landed identity files only (``client_identity`` and
``client_demographics``, see :mod:`membersync.models.privacy`); every other table holds their
surrogate key. Forgetting a client therefore:

1. records the erasure in the register (:mod:`membersync.warehouse.landing.identity`), **pending**,
   before anything else: from then on the client's identity never lands again (suppression);
2. scrubs what holds their values as text (logs, the self-audit's files, interrupted nights'
   staging areas and shard areas, which are discarded) and finds the nights whose exported
   reports name them: both need the values, so both happen before the values are deleted;
3. rewrites each committed night's identity files without the client's rows (new files, the
   manifest re-committed with the same ``committed_at``);
4. points the warehouse's catalogs at the new files (no part holds per-person data, by the
   build's rules: nothing is rebuilt), then deletes every identity file no manifest names (the
   old ones: on ``s3://``, every version), and re-exports the reports that named the client:
   the top-debtors list now shows "forgotten client" and the surrogate key;
5. marks the erasure done, with what it did (rows and files per table, nights, reports).

Every step is idempotent and keyed by the surrogate keys the register holds, so a process
killed at any moment leaves the previous state or the finished one, readable either way, and
any later ``forget`` (or ``sync``, ``reports``, ``retention``) completes a pending erasure first.
Money, memberships, packages, points and transactions stay, under the key, linked to no one.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import html
import logging
import re
import secrets
import shutil
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from membersync.models import tables as T
from membersync.models.mask import MASKED_FIELDS, IdentityMask, hashed_tokens
from membersync.warehouse.landing.atomic import write_bytes_atomic
from membersync.warehouse.landing.crashpoints import crashpoint
from membersync.warehouse.landing.identity import (
    Erasure,
    client_hmac,
    erasure_key,
    identity_files,
    key_check,
    new_erasure_id,
    read_identity_values,
    read_links,
    read_register,
    write_register,
)
from membersync.warehouse.landing.manifest import Manifest
from membersync.warehouse.landing.remote import mirror_reports
from membersync.warehouse.landing.rewrite import TableRewrite
from membersync.warehouse.landing.shard_area import remove_shard_areas
from membersync.warehouse.landing.zone import sweep_personal_files

log = logging.getLogger(__name__)

FORGOTTEN = "[forgotten]"
# Personal values scrubbed from text (logs, state) and looked for in reports: the ones that
# identify on their own (models.mask.IDENTIFYING_FIELDS). Dates, cities, genders are too common.
_MIN_VALUE = 3  # a shorter value is not looked for (it would match everywhere)


class ForgetError(RuntimeError):
    """The erasure cannot go on; the message says why (the register keeps it pending)."""


@dataclass
class Outcome:
    """What one erasure did (the register's ``result``, and what the command prints)."""

    erasure: str
    clients: int
    not_held: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=dict)
    nights: list[str] = field(default_factory=list)
    reports: list[str] = field(default_factory=list)
    reports_removed: list[str] = field(default_factory=list)  # nights whose reports could not be rewritten
    logs: int = 0
    staging: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "clients": self.clients,
            "not_held": self.not_held,
            "rows": self.rows,
            "files": self.files,
            "nights": self.nights,
            "reports": self.reports,
            "reports_removed": self.reports_removed,
            "logs_scrubbed": self.logs,
            "staging_discarded": self.staging,
            "finished_at": f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H:%M:%SZ}",
        }


# --- who ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A client to forget: their number (in memory only), key and the register's hash."""

    number: str
    key: str
    hmac: str
    held: bool  # linked in the identity files (False: never synced, or forgotten before)
    lookalike: str | None = None  # not held, but a held number reads the same (see normalised)


def normalised(number: str) -> str:
    """A client number as a person may type it: blanks, case and leading zeros ignored."""
    text = "".join(number.split()).casefold()
    return text.lstrip("0") or text


def resolve(zone: Any, numbers: Sequence[str], register_key: bytes) -> list[Target]:
    """Each number's key: its link, else the register's (forgotten before), else a new random key
    (a client never synced: suppressed from now on). A number neither held nor forgotten that
    reads like a held one (``417`` for ``000417``) names it as its ``lookalike``."""
    links = read_links(zone.store, zone.manifests())
    linked = dict(zip(links["client_number"].to_pylist(), links["client_key"].to_pylist(), strict=True))
    by_reading: dict[str, str] = {}
    for held in sorted(linked):
        by_reading.setdefault(normalised(held), held)
    erased = read_register(zone.store).erased
    out = []
    for number in dict.fromkeys(numbers):
        digest = client_hmac(register_key, number)
        key = linked.get(number) or erased.get(digest) or f"k{secrets.token_hex(8)}"
        lookalike = None if number in linked or digest in erased else by_reading.get(normalised(number))
        out.append(Target(number, key, digest, number in linked, lookalike))
    return out


def refuse_unheld(targets: Sequence[Target], exact: bool) -> None:
    """Fail closed on a number that is not held: one that reads like a held one is refused
    naming it (``--exact`` does not change that); one never seen is forgotten only with
    ``exact`` (suppressed from now on, on purpose)."""
    for target in targets:
        if target.lookalike is not None:
            raise ForgetError(
                f"client number {target.number!r} is not held, but {target.lookalike!r} is: "
                "give the number exactly as the service spells it"
            )
    unseen = [t.number for t in targets if not t.held]
    if unseen and not exact:
        raise ForgetError(
            f"client number {unseen[0]!r} is not held here (no night landed it"
            f"{f', nor {len(unseen) - 1} other(s)' if len(unseen) > 1 else ''}): check it, or pass "
            "--exact to forget it as given (suppressed from now on)"
        )


def already_forgotten(zone: Any, targets: Sequence[Target]) -> set[str]:
    """The register's hashes among ``targets``: clients an earlier erasure forgot (or is forgetting)."""
    erased = read_register(zone.store).erased
    return {t.hmac for t in targets if t.hmac in erased}


# --- the plan (what a dry run lists) -----------------------------------------------------------


@dataclass
class Plan:
    """Where the clients' identity is now: files (per night and table, with rows), reports that
    name them, log and state files that hold their values."""

    files: list[tuple[Manifest, str, str, int]]  # manifest, table, file, rows of these clients
    reports: list[str]  # nights (ISO) whose report files name one of them
    texts: list[Path]  # logs and state files holding one of their values
    staging: list[Path]  # interrupted nights' staging areas and shard areas (discarded)

    @property
    def nights(self) -> list[str]:
        return sorted({m.snapshot_date.isoformat() for m, *_ in self.files})

    def rows(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, table, _, rows in self.files:
            out[table] = out.get(table, 0) + rows
        return out


def plan(zone: Any, keys: Sequence[str], values: Sequence[str]) -> Plan:
    data_dir = zone.data_dir
    wanted = pa.array(sorted(set(keys)), pa.string())
    files = []
    for manifest, table, relative in identity_files(zone.manifests()):
        found = zone.store.read_table(relative, T.landed(table).schema).select(["client_key"])
        rows = int(pc.sum(pc.is_in(found["client_key"], value_set=wanted)).as_py() or 0)
        if rows:
            files.append((manifest, table, relative, rows))
    pattern = value_pattern(values)
    reports = [night.name for night in report_nights(data_dir) if pattern and mentions(night, pattern)]
    texts = [p for p in text_files(data_dir) if pattern and file_mentions(p, pattern)]
    return Plan(files, sorted(reports), texts, staging_areas(data_dir))


def identity_values(zone: Any, keys: Sequence[str]) -> list[str]:
    """Every identifying value the identity files hold for these keys (all versions)."""
    by_key = read_identity_values(zone.store, zone.manifests(), keys)
    return sorted(v for held in by_key.values() for v in held if len(v.strip()) >= _MIN_VALUE)


def value_pattern(values: Iterable[str]) -> re.Pattern[str] | None:
    """One regex for every value (and its HTML-escaped spelling), whole words only."""
    spelled = {s for v in values for s in (v, html.escape(v, quote=True)) if len(v.strip()) >= _MIN_VALUE}
    if not spelled:
        return None
    alternatives = "|".join(re.escape(s) for s in sorted(spelled, key=len, reverse=True))
    return re.compile(rf"(?<![\w@.])(?:{alternatives})(?![\w@])")


# --- text: reports, logs, state ------------------------------------------------------------------


def report_nights(data_dir: Any) -> list[Path]:
    folder = data_dir.reports
    return sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def report_files(night: Path) -> list[Path]:
    return sorted(p for p in night.rglob("*") if p.is_file())


def readable_text(path: Path) -> str:
    """A file's text as a reader would search it: an XLSX's XML parts unzipped."""
    if path.suffix == ".xlsx":
        with contextlib.suppress(zipfile.BadZipFile, OSError), zipfile.ZipFile(path) as book:
            return "\n".join(book.read(n).decode("utf-8", "replace") for n in book.namelist())
    try:
        return path.read_bytes().decode("utf-8", "replace")
    except OSError:
        return ""


def mentions(night: Path, pattern: re.Pattern[str]) -> bool:
    return any(file_mentions(p, pattern) for p in report_files(night))


def file_mentions(path: Path, pattern: re.Pattern[str]) -> bool:
    return pattern.search(readable_text(path)) is not None


def text_files(data_dir: Any) -> list[Path]:
    """Logs and the state files (the self-audit's queue and reports, the sync state)."""
    roots = [data_dir.logs, data_dir.state_file.parent]
    return sorted(p for root in roots if root.is_dir() for p in root.rglob("*") if p.is_file())


def scrub_text(path: Path, pattern: re.Pattern[str]) -> bool:
    """Replace every value in a text file (atomically); True when the file changed."""
    text = readable_text(path)
    cleaned = pattern.sub(FORGOTTEN, text)
    if cleaned == text:
        return False
    write_bytes_atomic(path, cleaned.encode("utf-8"))
    return True


def staging_areas(data_dir: Any) -> list[Path]:
    """Interrupted nights' staging areas and shard areas: they hold client numbers (discovery)."""
    out: list[Path] = []
    for folder in (data_dir.staging, data_dir.landing / "_shards"):
        if folder.is_dir():
            out.extend(p for p in folder.iterdir() if p.is_dir())
    return sorted(out)


# --- rewriting the identity files ----------------------------------------------------------------


def rewrite_files(
    zone: Any, keys: Sequence[str], erasure_id: str, mask: IdentityMask | None = None
) -> tuple[dict[str, int], dict[str, int]]:
    """Every committed identity file without the keys' rows, and the other clients' ``extra``
    with ``mask`` applied (a household member, an emergency contact naming the forgotten
    client); one rewrite per night touched. Returns rows removed and files rewritten, per table.
    The old files go once the catalogs read the new ones (:func:`finish`: sweep)."""
    wanted = pa.array(sorted(set(keys)), pa.string())
    rows: dict[str, int] = {}
    files: dict[str, int] = {}
    for manifest in zone.manifests():
        changes: dict[str, list[TableRewrite]] = {}
        for _, table, relative in identity_files([manifest]):
            data = zone.store.read_table(relative, T.landed(table).schema)
            kept = _without_keys(data, wanted, mask)
            if kept.equals(data):
                continue
            rows[table] = rows.get(table, 0) + data.num_rows - kept.num_rows
            files[table] = files.get(table, 0) + 1
            add = ((_replacement_name(relative, erasure_id), kept),) if kept.num_rows else ()
            changes.setdefault(table, []).append(TableRewrite((relative,), data.num_rows, add))
        if changes:
            zone.rewrite_night(manifest, {t: _merged(c) for t, c in changes.items()})
            crashpoint("forget_after_recommit")
    return rows, files


def _merged(changes: list[TableRewrite]) -> TableRewrite:
    return TableRewrite(
        tuple(f for c in changes for f in c.retire),
        sum(c.retired_rows for c in changes),
        tuple(a for c in changes for a in c.add),
    )


def _without_keys(data: pa.Table, wanted: pa.Array, mask: IdentityMask | None) -> pa.Table:
    kept = data.filter(pc.invert(pc.is_in(data["client_key"], value_set=wanted)))
    if mask is None or "extra" not in kept.column_names:
        return kept
    index = kept.column_names.index("extra")
    return kept.set_column(index, kept.schema.field(index), mask.array(kept["extra"]))


def _replacement_name(relative: str, erasure_id: str) -> str:
    """The kept rows' new file, beside the old one (a name no manifest has used)."""
    old = Path(relative)
    return (old.parent / f"{old.stem}-e{erasure_id}.parquet").as_posix()


# --- one erasure, start to end --------------------------------------------------------------------


def start(zone: Any, targets: Sequence[Target], reason: str, key: bytes) -> Erasure:
    """Record the erasure, pending (suppression holds from here on); ``key``: the register's key
    the targets' hashes were made with (its check is recorded with the first erasure)."""
    register = read_register(zone.store)
    register.key_check = register.key_check or key_check(key)
    held = read_identity_values(zone.store, zone.manifests(), [t.key for t in targets], MASKED_FIELDS)
    clients = [
        {"hmac": t.hmac, "key": t.key, "words": hashed_tokens(key, held.get(t.key, ()), [t.number])}
        for t in targets
    ]
    erasure = Erasure(
        id=new_erasure_id(),
        requested_at=f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H:%M:%SZ}",
        reason=reason,
        clients=clients,
        plan={"not_held": sum(not t.held for t in targets)},
    )
    register.erasures.append(erasure)
    write_register(zone.store, register)
    crashpoint("forget_after_register")
    return erasure


def finish(zone: Any, erasure_id: str) -> Outcome:
    """Carry one pending erasure to its end (idempotent; see the module's docstring)."""
    from membersync.warehouse.build.publish import repoint_catalogs
    from membersync.warehouse.exports.reports import reexport

    register = read_register(zone.store)
    erasure = next(e for e in register.erasures if e.id == erasure_id)
    keys = erasure.keys
    if not erasure.plan.get("scrubbed"):
        scrub(zone, erasure)
        write_register(zone.store, register)
        crashpoint("forget_after_scrub")
    rows, files = rewrite_files(zone, keys, erasure.id, erasure_mask(zone, erasure))
    if rows:  # a rerun after a crash finds fewer: what the earlier run removed is kept
        erasure.result["rows"] = _merge(erasure.result.get("rows", {}), rows)
        erasure.result["files"] = _merge(erasure.result.get("files", {}), files)
        write_register(zone.store, register)
    crashpoint("forget_after_rewrite")
    repoint_catalogs(zone.data_dir)  # the catalogs read the rewritten files ...
    sweep_personal_files(zone.data_dir)  # ... so the old ones go (every version), with any leftover
    reports, removed = reexport(_built(zone.data_dir, erasure), erasure.plan.get("reports", []))
    crashpoint("forget_after_reexport")
    _republish(zone.data_dir)
    outcome = Outcome(
        erasure.id,
        len(keys),
        int(erasure.plan.get("not_held", 0)),
        rows=erasure.result.get("rows", {}),
        files=erasure.result.get("files", {}),
        nights=list(erasure.plan.get("nights", [])),
        reports=reports,
        reports_removed=removed,
        logs=int(erasure.plan.get("logs", 0)),
        staging=int(erasure.plan.get("staging", 0)),
    )
    erasure.status = "done"
    erasure.result = outcome.as_dict()
    write_register(zone.store, register)
    return outcome


def erasure_mask(zone: Any, erasure: Erasure) -> IdentityMask:
    """The forgotten clients' words as the register keeps them (keyed hashes): what the other
    clients' records must not say of them."""
    mask = IdentityMask()
    mask.add_hashed(erasure_key(zone, create=False), (w for c in erasure.clients for w in c.get("words", ())))
    return mask


def _built(data_dir: Any, erasure: Erasure) -> Any:
    """The data dir, its warehouse built first when reports must be written again and this
    machine has no catalog to write them from (a new machine, a migrated layout)."""
    from membersync.warehouse.build.builder import build_warehouse

    if erasure.plan.get("reports") and not data_dir.identified_db.is_file() and zone_has_nights(data_dir):
        build_warehouse(data_dir)
    return data_dir


def _republish(data_dir: Any) -> None:
    """``MEMBERSYNC_PUBLISH_URL``: the database made again whole from the rewritten warehouse (its
    tables' files dropped with them). If it fails the erasure stays pending, for the next command."""
    from membersync.warehouse.build.builder import build_warehouse
    from membersync.warehouse.exports import postgres

    if postgres.configured() is None:
        return
    if not data_dir.identified_db.is_file() and zone_has_nights(data_dir):
        build_warehouse(data_dir)
    postgres.publish_if_configured(data_dir, full=True)


def zone_has_nights(data_dir: Any) -> bool:
    return any(data_dir.manifests.glob("????-??-??.json"))


def scrub(zone: Any, erasure: Erasure) -> None:
    """What needs the clients' values, done while the identity files still hold them: text files
    scrubbed, staging discarded, the nights whose reports name them found (kept in the plan)."""
    mirror_reports(zone.data_dir)  # the reports other machines wrote, from the data location
    values = identity_values(zone, erasure.keys)
    found = plan(zone, erasure.keys, values)
    pattern = value_pattern(values)
    logs = sum(scrub_text(p, pattern) for p in found.texts) if pattern else 0
    staging = discard(found.staging) + (remove_shard_areas(zone.data_dir) if zone.data_dir.remote else 0)
    erasure.plan.update(
        {"scrubbed": True, "reports": found.reports, "nights": found.nights, "logs": logs, "staging": staging}
    )


def finish_pending(zone: Any) -> list[Outcome]:
    """Complete every erasure a crash left pending (the caller holds the lock)."""
    return [finish(zone, e.id) for e in read_register(zone.store).pending]


def _merge(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in sorted(a.keys() | b.keys())}


def discard(areas: Sequence[Path]) -> int:
    for area in areas:
        shutil.rmtree(area, ignore_errors=True)
    return len(areas)


__all__ = [
    "ForgetError",
    "Outcome",
    "Plan",
    "Target",
    "finish",
    "plan",
    "resolve",
    "start",
]
