"""Where membersync writes: everything lives under one data dir.

``MEMBERSYNC_DATA_DIR`` (default: ``warehouse/data`` inside the repository, git-ignored)::

    DATA_DIR/
      landing/<table>/snapshot_date=YYYY-MM-DD/part-*.parquet   published Parquet
      landing/_manifests/YYYY-MM-DD.json                         a night's commit
      landing/_staging/YYYY-MM-DD/...                            a night being written
      state/state.json                                           watermark, committed nights
      warehouse.duckdb                                           the analyst tier's catalog (no identity)
      identified.duckdb                                          the identified tier's catalog
      reports/YYYY-MM-DD/<report>_YYYY-MM-DD.csv                 the morning's CSVs
      logs/                                                      run logs
      .lock                                                      one sync at a time

Everything written there is readable by its owner only (files 0600, folders 0700).

``MEMBERSYNC_DATA_DIR=s3://bucket/prefix`` puts the published landing zone (parts and manifests)
and the report files in object storage, same layout under the prefix (see
:mod:`membersync.warehouse.landing.storage`); ``root`` is then a local working dir
(``MEMBERSYNC_CACHE_DIR``, default ``~/.cache/membersync/s3/<bucket>/<prefix>``) holding the
staging area, the lock, the logs, a mirror of the committed files and the DuckDB warehouse.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from membersync.extract.settings import Settings, SettingsError

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[1] / "data"  # warehouse/data
FILE_MODE = 0o600
DIR_MODE = 0o700
QUARANTINE_DIR = "_quarantine"  # under landing/: published like a table, but not one of the landed tables


@dataclass(frozen=True)
class Place:
    """Where under the data dir (or the bucket's prefix) something lives, and who may read it."""

    path: str  # relative to the data dir; a folder ends with "/"
    tier: str  # "analyst": no identity; "identified": may hold a person's identity; "none": neither
    holds: str


# Every place membersync writes, and its tier: the grant list of docs/personal-data.md (generated)
# and what `membersync sql` lets an analyst read (tests fail when either drifts from this).
PLACES: tuple[Place, ...] = (
    Place(
        "warehouse.duckdb",
        "analyst",
        "the analyst tier's catalog: views over the parts and the analyst landing",
    ),
    Place(
        "warehouse/parts/",
        "analyst",
        "the models' stored rows (no part holds per-person data: the build refuses one)",
    ),
    Place(
        "landing/<analyst table>/",
        "analyst",
        "every landed table but the identity: surrogate keys, masked free text",
    ),
    Place(
        f"landing/{QUARANTINE_DIR}/",
        "analyst",
        "rows that could not be typed: keys, personal fields dropped, text masked",
    ),
    Place("landing/_manifests/", "analyst", "each committed night's manifest: file names, row counts"),
    Place(
        "landing/client_identity/",
        "identified",
        "the only link from a key to a client number, names, contact",
    ),
    Place(
        "identified.duckdb",
        "identified",
        "the identified tier's catalog (identity.clients, identity.top_debtors)",
    ),
    Place("reports/", "identified", "the managers' reports: the top debtors by number and name"),
    Place(
        "landing/_staging/",
        "identified",
        "an interrupted night: staged identity, its discovery's client numbers, its key salt",
    ),
    Place(
        "landing/_shards/",
        "identified",
        "a sharded night's batches as fetched (numbers, names) until it commits",
    ),
    Place("logs/", "identified", "run logs: a vendor's error text may name a client"),
    Place(
        "state/", "identified", "the sync state, the self-audit's queue and reports (client keys and numbers)"
    ),
    Place("warehouse/dbt/", "identified", "dbt's target and logs: a failing test's rows"),
    Place(
        "warehouse/spill/",
        "identified",
        "DuckDB's pages spilled past MEMBERSYNC_BUILD_MEMORY while a build or export runs "
        "(gone when it ends; a killed one's at the next build)",
    ),
    Place(
        "lease/pending/",
        "identified",
        "with s3://: a write under way through the lease's fence (a manifest, the reports), erased "
        "once in place",
    ),
    Place(
        "lease/",
        "none",
        "with s3://: the writer's lease and its log (machine, pid, command, token; no client data)",
    ),
    Place(
        "privacy/",
        "none",
        "the erasure register and retention journal: keyed hashes, surrogate keys, no identity",
    ),
)


@dataclass(frozen=True)
class DataDir:
    root: Path
    remote: str | None = None  # "s3://bucket/prefix" when the data location is object storage

    @classmethod
    def from_settings(cls, settings: Settings) -> DataDir:
        """``MEMBERSYNC_DATA_DIR`` (a path or s3://bucket/prefix, with ``MEMBERSYNC_CACHE_DIR``)."""
        raw = settings.data_dir
        if raw and "://" in raw:
            return cls.remote_location(raw, settings.cache_dir)
        return cls(Path(raw).expanduser().resolve() if raw else DEFAULT_DATA_DIR)

    @classmethod
    def remote_location(cls, url: str, cache_dir: str | None = None) -> DataDir:
        """``s3://bucket/prefix`` with its local working dir (a bad URL: SettingsError naming it)."""
        scheme, _, rest = url.partition("://")
        bucket, _, prefix = rest.strip("/").partition("/")
        prefix = prefix.strip("/")
        parts = [p for p in prefix.split("/") if p]
        if scheme != "s3" or not bucket or any(p in (".", "..") for p in parts):
            raise SettingsError(f"MEMBERSYNC_DATA_DIR: {url!r} is not a local path or s3://bucket/prefix")
        remote = f"s3://{bucket}/{'/'.join(parts)}".rstrip("/")
        if cache_dir:
            root = Path(cache_dir).expanduser().resolve()
        else:
            root = Path("~/.cache/membersync/s3").expanduser().resolve() / bucket / Path(*parts)
        return cls(root, remote)

    @property
    def location(self) -> str:
        """Where the published data lives: the s3:// URL, or the local data dir."""
        return self.remote or str(self.root)

    @property
    def landing(self) -> Path:
        return self.root / "landing"

    @property
    def manifests(self) -> Path:
        return self.landing / "_manifests"

    @property
    def staging(self) -> Path:
        return self.landing / "_staging"

    @property
    def rate_file(self) -> Path:
        """The server's rate the last night found (where the next night's client starts)."""
        return self.state_file.parent / "rate.json"

    @property
    def state_file(self) -> Path:
        return self.root / "state" / "state.json"

    @property
    def warehouse_db(self) -> Path:
        """The analyst tier's catalog: no personal data, no view over the identity files."""
        return self.root / "warehouse.duckdb"

    @property
    def identified_db(self) -> Path:
        """The identified tier's catalog: every model, the identity ones included."""
        return self.root / "identified.duckdb"

    def catalog(self, tier: str) -> Path:
        return self.identified_db if tier == "identified" else self.warehouse_db

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def lock_file(self) -> Path:
        return self.root / ".lock"

    def ensure(self) -> None:
        """Create the data dir (owner-only) or raise OSError naming it."""
        for path in (
            self.root,
            self.landing,
            self.manifests,
            self.staging,
            self.state_file.parent,
            self.reports,
            self.logs,
        ):
            path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        os.chmod(self.root, DIR_MODE)
