"""The one way to change a committed night: :meth:`LandingZone.rewrite_night` and
:meth:`LandingZone.remove_night` (they call the functions here).

A night's own commit (:meth:`Night.commit`) aside, nothing else publishes a landed file or a
manifest: ``forget`` (identity files without the erased clients), ``retention`` (rows carried into
a kept night; removed nights) and the layout migration (every file of a night rewritten) say
*what* changes, as a :class:`TableRewrite` per table, and the zone does it the same way each time:

1. every added file is written atomically under a name no manifest has used, then published
   (object storage: uploaded);
2. the night's manifest is re-committed naming them, in place of the retired files, its
   ``committed_at`` kept (the rows a report reads did not change their night), conditional on
   the version read (``CommitConflict`` when another writer got there first);
3. the retired files stay until the caller has done what must come first (the catalogs repointed,
   then ``sweep``): a crash anywhere leaves either the old manifest or the new one, both whole.

``tests/house/test_one_commit_path.py`` fails when any other module publishes a file or a manifest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Protocol

import pyarrow as pa
from membersync.warehouse.landing.atomic import write_parquet_atomic
from membersync.warehouse.landing.manifest import Manifest, TableFiles
from membersync.warehouse.landing.paths import QUARANTINE_DIR, DataDir
from membersync.warehouse.landing.storage import Store


class LandingZone(Protocol):
    """What a rewrite needs of :class:`membersync.warehouse.landing.zone.LandingZone` (which calls it)."""

    data_dir: DataDir
    store: Store


QUARANTINE = QUARANTINE_DIR  # the key of a night's quarantine in a rewrite's changes: its folder


@dataclass(frozen=True)
class TableRewrite:
    """One table's change in a committed night.

    ``retire``: files (relative to ``landing/``) the night stops naming, which held
    ``retired_rows`` rows; ``add``: files to publish and name (after the ones kept, in order),
    each with its rows. A file already named is not written again (an interrupted run, retried).
    """

    retire: tuple[str, ...] = ()
    retired_rows: int = 0
    add: tuple[tuple[str, pa.Table], ...] = ()


def rewrite_night(
    zone: LandingZone,
    night: Manifest,
    changes: Mapping[str, TableRewrite],
    layout: int | None = None,
) -> Manifest:
    """Publish the added files, then re-commit ``night`` with ``changes`` (and ``layout``);
    returns the manifest now committed (``night`` itself when nothing changed)."""
    tables = dict(night.tables)
    quarantine = night.quarantine
    for table, change in sorted(changes.items()):
        before = quarantine if table == QUARANTINE else tables.get(table, TableFiles((), 0))
        after = _apply(zone, before, change)
        if table == QUARANTINE:
            quarantine = after
        else:
            tables[table] = after
    updated = replace(
        night,
        tables=dict(sorted(tables.items())),
        quarantine=quarantine,
        layout=night.layout if layout is None else layout,
    )
    if updated != night:
        zone.store.commit_manifest(updated, zone.store.manifest_version(night.snapshot_date))
    return updated


def _apply(zone: LandingZone, before: TableFiles, change: TableRewrite) -> TableFiles:
    retired = set(change.retire)
    names = [f for f in before.files if f not in retired]
    rows = before.rows - change.retired_rows
    for relative, data in change.add:
        if relative in names:
            continue  # published and named by an earlier, interrupted attempt
        path = zone.data_dir.landing / relative
        write_parquet_atomic(path, data)
        zone.store.publish(path)
        names.append(relative)
        rows += data.num_rows
    return TableFiles(tuple(names), rows)


def remove_night(zone: LandingZone, night: Manifest) -> int:
    """Un-commit a night (its manifest goes first), then erase its files, every version;
    returns how many stored objects were erased."""
    files = [f for t in night.tables.values() for f in t.files] + list(night.quarantine.files)
    zone.store.remove_manifest(night.snapshot_date)
    erased = zone.store.erase([f"landing/{f}" for f in files])
    for relative in files:
        (zone.data_dir.landing / relative).unlink(missing_ok=True)
    return erased
