"""Bring a data dir of the earlier layout to today's, once: identity apart, keys everywhere.

Before identity was kept apart (manifest ``layout`` 1), every landed file held client numbers and
the client records' personal fields. :func:`migrate_layout` rewrites each such night, oldest
first, through the same landing as a night today (:func:`membersync.models.privacy.land_batch`:
its key book assigns each client a surrogate key the first night it appears, and lands their
identity apart):

1. each batch's files of the night are read as typed rows (what the old layout held), landed
   anew under new names (never an old name), published;
2. the night's manifest is re-committed naming them, ``layout`` 2, ``committed_at`` kept;
3. the old files are deleted (every version, on ``s3://``): they held identity outside its tier.

A crash leaves each night either old (whole) or migrated (whole); a rerun, or any later command
that holds the lock (:func:`membersync.warehouse.lifecycle.upkeep.upkeep`), migrates what is left, then
sweeps the files no manifest names. When every night is migrated, the warehouse (whose parts held
personal data) is removed, to be built again in full, and the self-audit's files are rewritten
by key. The reports already exported stay as they are: the new layout exports them byte for byte
(``tests/unit/warehouse/test_migrate.py``).
"""

from __future__ import annotations

import logging
import secrets
import shutil
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
from membersync.models import tables as T
from membersync.models.privacy import land_batch, land_quarantine
from membersync.warehouse.landing.atomic import write_json_atomic
from membersync.warehouse.landing.crashpoints import crashpoint
from membersync.warehouse.landing.identity import ClientKeys
from membersync.warehouse.landing.manifest import LAYOUT, Manifest
from membersync.warehouse.landing.rewrite import QUARANTINE, TableRewrite

log = logging.getLogger(__name__)


def migrate_layout(zone: Any) -> int:
    """Migrate every night of the earlier layout (the caller holds the lock); returns how many."""
    old = [m for m in zone.manifests() if m.layout < LAYOUT]
    if not old:
        return 0
    log.info("migrating %d night(s) to the layout with identity apart", len(old))
    for manifest in sorted(old, key=lambda m: m.snapshot_date):
        migrate_night(zone, manifest)
    sweep_orphans(zone)
    drop_warehouse(zone.data_dir)
    rekey_audit_files(zone)
    log.info("migrated %d night(s); the warehouse is built again in full", len(old))
    return len(old)


def _batches(manifest: Manifest) -> dict[str, dict[str, str]]:
    """Batch (the file's name) -> table -> file, over the night's tables and its quarantine."""
    out: dict[str, dict[str, str]] = defaultdict(dict)
    named = [*manifest.tables.items(), (QUARANTINE, manifest.quarantine)]
    for table, files in named:
        for relative in files.files:
            out[Path(relative).name][table] = relative
    return dict(sorted(out.items()))


def migrate_night(zone: Any, manifest: Manifest) -> None:
    """One night of the earlier layout, rewritten and re-committed (see the module's docstring)."""
    keys = ClientKeys.load(zone, secrets.token_bytes(16), replacing=None)
    keys.tonight.update(_synced_numbers(zone, manifest))
    added: dict[str, list[tuple[str, pa.Table]]] = defaultdict(list)
    for name, files in _batches(manifest).items():
        typed = {t: zone.store.read_table(f, T.table(t).schema) for t, f in files.items() if t != QUARANTINE}
        for table, data in land_batch(typed, keys).items():
            added[table] += [(_new_name(manifest, table, name), data)] if data.num_rows else []
        if QUARANTINE in files:
            bad = land_quarantine(zone.store.read_table(files[QUARANTINE], T.TYPED_QUARANTINE_SCHEMA), keys)
            added[QUARANTINE].append((_new_name(manifest, QUARANTINE, name), bad))
    before = {**manifest.tables, QUARANTINE: manifest.quarantine}
    changes = {
        table: TableRewrite(files.files, files.rows, tuple(added.get(table, ())))
        for table, files in before.items()
    }
    changes.update({t: TableRewrite(add=tuple(a)) for t, a in added.items() if t not in before})
    zone.rewrite_night(manifest, changes, layout=LAYOUT)
    crashpoint("migrate_after_night")
    _erase(zone, [f for files in _batches(manifest).values() for f in files.values()])


def _synced_numbers(zone: Any, manifest: Manifest) -> list[str]:
    files = manifest.tables.get("synced_clients")
    schema = T.table("synced_clients").schema
    numbers: list[str] = []
    for relative in files.files if files else ():
        numbers += zone.store.read_table(relative, schema)["client_number"].to_pylist()
    return [n for n in numbers if n is not None]


def _new_name(manifest: Manifest, table: str, old_name: str) -> str:
    """A migrated file's name beside the old one, relative to landing (a name never used before)."""
    night = manifest.snapshot_date.isoformat()
    return f"{table}/snapshot_date={night}/{old_name.removesuffix('.parquet')}-v{LAYOUT}.parquet"


def _erase(zone: Any, relatives: Iterable[str]) -> None:
    relatives = list(relatives)
    zone.store.erase([f"landing/{r}" for r in relatives])
    for relative in relatives:
        (zone.data_dir.landing / relative).unlink(missing_ok=True)


def sweep_orphans(zone: Any) -> int:
    """Every landed file no manifest names (a migration or erasure cut short), in the store and
    the local copy, erased."""
    named = {
        f"landing/{f}"
        for m in zone.manifests()
        for f in [*(f for t in m.tables.values() for f in t.files), *m.quarantine.files]
    }
    tops = [*(t.name for t in T.LANDED), QUARANTINE]
    orphans = sorted({f for top in tops for f in zone.store.listing(f"landing/{top}")} - named)
    removed = zone.store.erase(orphans) if orphans else 0
    zone.recover(full=True)  # the local copies
    return removed


def drop_warehouse(data_dir: Any) -> None:
    """The warehouse built from the earlier layout goes (its parts held personal data)."""
    from membersync.warehouse.build import catalog as cat

    for tier in ("analyst", "identified"):
        data_dir.catalog(tier).unlink(missing_ok=True)
    shutil.rmtree(cat.parts_dir(data_dir), ignore_errors=True)


def rekey_audit_files(zone: Any) -> None:
    """The self-audit's queue (``state/resync.json``) and reports (``state/audits/``), which
    named clients by number, rewritten by key; a number no identity links is dropped."""
    from membersync.warehouse.landing.identity import read_links

    links = read_links(zone.store, zone.manifests())
    keys = dict(zip(links["client_number"].to_pylist(), links["client_key"].to_pylist(), strict=True))
    state = zone.data_dir.state_file.parent
    queue = _read_json(state / "resync.json")
    if isinstance(queue, dict) and queue.get("format") == 1 and isinstance(queue.get("clients"), dict):
        clients = {
            keys[n]: {k: v for k, v in entry.items() if k != "clientNumber"}
            for n, entry in queue["clients"].items()
            if n in keys and isinstance(entry, dict)
        }
        write_json_atomic(state / "resync.json", {"format": 2, "clients": dict(sorted(clients.items()))})
    for path in sorted((state / "audits").glob("*.json")):
        report = _read_json(path)
        if isinstance(report, dict) and report.get("format") == 1:
            write_json_atomic(path, _rekeyed_report(report, keys))


def _rekeyed_report(report: dict[str, Any], keys: dict[str, str]) -> dict[str, Any]:
    sampled = [keys[n] for n in report.get("sampled") or [] if isinstance(n, str) and n in keys]
    differed = {keys[n]: t for n, t in (report.get("differed") or {}).items() if n in keys}
    return {
        **{k: v for k, v in report.items() if k not in ("sampled", "differed")},
        "format": 2,
        "sampled": len(sampled),
        "sampled_clients": sampled,
        "differed": differed,
    }


def _read_json(path: Path) -> Any:
    import json

    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
