"""A night's manifest: the commit record of the landing zone.

A night is committed when ``landing/_manifests/YYYY-MM-DD.json`` exists (it is written to a
temporary name, fsynced, and renamed last). It lists every published Parquet file of the
night, per table, with row counts. Readers (the warehouse build) read **only** the files a
manifest names, so a file being written, an orphan left by a crash, or a night not yet
committed is never seen.

Format (JSON)::

    {
      "format": 1,
      "snapshot_date": "2026-11-21",
      "run_id": "20261121T020000Z-3f2a",
      "mode": "full" | "incremental",
      "committed_at": "2026-11-21T02:14:03Z",          # this machine's clock, informative only
      "watermark": "2026-11-21T01:59:58Z" | null,       # max server lastModified discovered
      "clients_synced": 1234,
      "tables": {"clients": {"files": ["clients/snapshot_date=.../part-...parquet"], "rows": 1234}},
      "quarantine": {"files": [...], "rows": 0, "by_table": {"memberships": 0}},
      "stats": {...},                                    # the run summary (requests, retries, ...)
      "layout": 2,                                       # what the files hold (see LAYOUT)
      "tenant": "spa-north"                              # only when the night ran as a named tenant
    }

File paths are relative to ``DATA_DIR/landing``.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from membersync.extract.settings import env_name

FORMAT = 1
# What the night's files hold: 1, typed rows with client numbers and personal fields in every
# table (before identity was kept apart); 2, surrogate keys, identity in its own tables
# (models.tables.LANDED). warehouse.migrate brings a night of layout 1 to layout 2, once.
LAYOUT = 2
# The setting that names a night's tenant, which the night records in its manifest ("tenant")
TENANT_ENV = env_name("tenant")


class ManifestError(ValueError):
    """A manifest cannot be read; the message names the file."""


@dataclass(frozen=True)
class TableFiles:
    files: tuple[str, ...]
    rows: int


@dataclass(frozen=True)
class Manifest:
    snapshot_date: dt.date
    run_id: str
    mode: str
    committed_at: str
    watermark: str | None
    clients_synced: int
    tables: dict[str, TableFiles]
    quarantine: TableFiles = field(default_factory=lambda: TableFiles((), 0))
    quarantine_by_table: dict[str, int] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    tenant: str | None = None  # MEMBERSYNC_TENANT of the night (a tenants file's name), if any
    layout: int = LAYOUT

    def to_json(self) -> str:
        body = {
            "format": FORMAT,
            "snapshot_date": self.snapshot_date.isoformat(),
            "run_id": self.run_id,
            "mode": self.mode,
            "committed_at": self.committed_at,
            "watermark": self.watermark,
            "clients_synced": self.clients_synced,
            "tables": {k: {"files": list(v.files), "rows": v.rows} for k, v in sorted(self.tables.items())},
            "quarantine": {
                "files": list(self.quarantine.files),
                "rows": self.quarantine.rows,
                "by_table": dict(sorted(self.quarantine_by_table.items())),
            },
            "stats": self.stats,
            "layout": self.layout,
        }
        if self.tenant is not None:
            body["tenant"] = self.tenant
        return json.dumps(body, indent=2, sort_keys=False)

    @classmethod
    def from_json(cls, text: str, where: str = "<manifest>") -> Manifest:
        try:
            raw = json.loads(text)
            if raw.get("format") != FORMAT:
                raise ManifestError(f"{where}: unknown manifest format {raw.get('format')!r}")
            quarantine = raw.get("quarantine") or {}
            return cls(
                snapshot_date=dt.date.fromisoformat(raw["snapshot_date"]),
                run_id=str(raw["run_id"]),
                mode=str(raw["mode"]),
                committed_at=str(raw["committed_at"]),
                watermark=raw.get("watermark"),
                clients_synced=int(raw.get("clients_synced", 0)),
                tables={k: TableFiles(tuple(v["files"]), int(v["rows"])) for k, v in raw["tables"].items()},
                quarantine=TableFiles(tuple(quarantine.get("files", ())), int(quarantine.get("rows", 0))),
                quarantine_by_table={k: int(v) for k, v in (quarantine.get("by_table") or {}).items()},
                stats=raw.get("stats") or {},
                tenant=str(raw["tenant"]) if raw.get("tenant") is not None else None,
                layout=int(raw.get("layout", 1)),
            )
        except ManifestError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ManifestError(f"{where}: malformed manifest ({exc.__class__.__name__}: {exc})") from None


def manifest_path(manifests_dir: Path, night: dt.date) -> Path:
    return manifests_dir / f"{night.isoformat()}.json"


def read_manifests(manifests_dir: Path) -> list[Manifest]:
    """Every committed night, oldest first. Temporary files (``*.tmp``) are not commits."""
    try:
        names = sorted(e.name for e in os.scandir(manifests_dir) if _MANIFEST_NAME.fullmatch(e.name))
    except FileNotFoundError:
        return []
    return [_read(os.path.join(manifests_dir, name)) for name in names]


def read_manifest(manifests_dir: Path, night: dt.date) -> Manifest | None:
    try:
        return _read(str(manifest_path(manifests_dir, night)))
    except FileNotFoundError:
        return None


_MANIFEST_NAME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}\.json")


def _read(path: str) -> Manifest:
    """A manifest file, parsed once per version of it: a night reads every manifest several
    times (its keys, its recovery, its commit), and a history of 430 nights made that quadratic.
    A manifest is only ever replaced by a rename, so a new version is a new inode."""
    st = os.stat(path)
    return _parse(path, st.st_ino, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8192)
def _parse(path: str, inode: int, mtime_ns: int, size: int) -> Manifest:
    with open(path, encoding="utf-8") as fh:
        return Manifest.from_json(fh.read(), where=path)


def foreign_tenant(manifest_tenants: Iterable[tuple[object, str | None]], tenant: str | None) -> str | None:
    """Why a night of ``tenant`` must not write where these manifests are ((night, tenant) pairs),
    or None. Manifests without a tenant (a single-tenant setup) belong to nobody in particular."""
    for night, owner in manifest_tenants:
        if owner is not None and owner != tenant:
            who = f"tenant {tenant}" if tenant else f"a night without {TENANT_ENV}"
            return (
                f"the data location holds tenant {owner}'s nights (manifest {night}); "
                f"refusing to write {who} there (check MEMBERSYNC_DATA_DIR and {TENANT_ENV})"
            )
    return None
