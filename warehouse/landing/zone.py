"""The landing zone: Parquet per table and night, published atomically, one sync at a time.

Layout (see :mod:`membersync.warehouse.landing.paths`)::

    landing/<table>/snapshot_date=D/part-<run_id>-<batch>.parquet     published (named by a manifest)
    landing/_quarantine/snapshot_date=D/part-<run_id>-<batch>.parquet rows that could not be typed
    landing/_manifests/D.json                                         the night's commit
    landing/_staging/D/run.json                                       the run being written (id, mode)
    landing/_staging/D/discovery.json                                 the client list of that run
    landing/_staging/D/batches/<batch>/<table>.parquet                a staged batch ...
    landing/_staging/D/batches/<batch>.done                           ... and its done marker
    state/state.json                                                  watermark, committed nights

How a night stays safe:

* **Batches are atomic.** A batch is written into a temporary folder, every file fsynced, the
  folder renamed into place, then its done marker written (temporary name, fsync, rename). A
  batch without a marker does not exist; a rerun of the same night skips batches that have one.
* **The manifest is the commit.** ``commit`` renames the staged files into their published
  paths (same file system: atomic, already fsynced), then writes the manifest last. Readers read
  only files a manifest names, so a crash before the manifest leaves the previous state intact;
  files of the earlier run of the same night are deleted only after the new manifest is in place.
* **Crash recovery.** ``recover`` (also run by ``open_night``) removes temporary files, moves the
  published files of an uncommitted run back into staging (so the run can resume), deletes
  orphans no manifest names, and drops staging areas of runs already committed.
* **State never runs ahead.** :meth:`LandingZone.state` is derived from the manifests;
  ``state.json`` is a copy written after each commit, for people and tools.
* **Owner only.** Files 0600, folders 0700, set explicitly (not left to the umask).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import re
import secrets
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pyarrow as pa
from membersync.models.tables import (
    LANDED_BY_NAME,
    QUARANTINE_SCHEMA,
)
from membersync.warehouse.landing import rewrite
from membersync.warehouse.landing.atomic import (
    TMP_MARK,
    fsync_dir,
    make_dirs,
    write_bytes_atomic,
)
from membersync.warehouse.landing.lease import AlreadyRunning as AlreadyRunning  # raised by lock()
from membersync.warehouse.landing.lease import FileLock, Lease, WriterLock
from membersync.warehouse.landing.manifest import (
    Manifest,
)
from membersync.warehouse.landing.night import (
    _RESERVED_TOP,
    PERSONAL_TABLES,
    QUARANTINE_FILE,
    STAGING_LAYOUT,
    LandingError,
    LandingWriteError,
    Night,
    _describe,
    _read_json,
    _remove,
    _resumable,
)
from membersync.warehouse.landing.paths import DIR_MODE, FILE_MODE, QUARANTINE_DIR, DataDir
from membersync.warehouse.landing.rewrite import TableRewrite
from membersync.warehouse.landing.storage import hold_fence, store_for

log = logging.getLogger(__name__)

Mode = Literal["full", "incremental"]
MODES: tuple[str, ...] = ("full", "incremental")
_NIGHT_DIR = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


@dataclass(frozen=True)
class SyncState:
    last_night: dt.date | None
    watermark: str | None
    committed: list[dt.date]

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": 1,
                "last_night": self.last_night.isoformat() if self.last_night else None,
                "watermark": self.watermark,
                "committed": [d.isoformat() for d in self.committed],
            },
            indent=2,
        )


# --- small file-system helpers (explicit modes, fsync) -------------------------------------------


def _watermark_key(value: str) -> tuple[int, str]:
    """Order watermarks as instants when they parse, else as text (after every instant)."""
    try:
        moment = dt.datetime.fromisoformat(value)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.UTC)
        return 0, moment.astimezone(dt.UTC).isoformat()
    except ValueError:
        return 1, value


def _state_of(manifests: list[Manifest]) -> SyncState:
    committed = sorted(m.snapshot_date for m in manifests)
    marks = [m.watermark for m in manifests if m.watermark]
    return SyncState(
        last_night=committed[-1] if committed else None,
        watermark=max(marks, key=_watermark_key) if marks else None,
        committed=committed,
    )


# --- the zone ------------------------------------------------------------------------------------


class LandingZone:
    """The landing zone of one data dir. Mutations happen inside ``with zone.lock():``."""

    def __init__(self, data_dir: DataDir, erasure_key_file: str | None = None) -> None:
        self.data_dir = data_dir
        self.store = store_for(data_dir)  # where published files and manifests live
        self.erasure_key_file = erasure_key_file  # MEMBERSYNC_ERASURE_KEY_FILE (warehouse.identity)
        self._writer: WriterLock | None = None

    # -- locking ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, wait: bool = False) -> Iterator[LandingZone]:
        """Hold the data location's writer lock (:mod:`.lease`: the flock of a local data dir,
        the lease of a bucket); raise :class:`AlreadyRunning` at once, naming its holder, when
        another writer holds it, or with ``wait``, wait until it is free."""
        self._ensure_root()
        writer = self._writer_lock()
        writer.acquire(wait)
        if isinstance(writer, Lease):
            hold_fence(self.data_dir, writer)
        try:
            self._writer = writer
            yield self
        finally:
            self._writer = None
            if self.data_dir.remote is not None:
                hold_fence(self.data_dir, None)
            writer.release()

    def _writer_lock(self) -> WriterLock:
        if self.data_dir.remote is None:
            return FileLock(self.data_dir.lock_file, str(self.data_dir.root), FILE_MODE)
        from membersync.extract.settings import Settings

        return Lease(self.store, self.data_dir.remote, Settings.load().lease_seconds)

    @property
    def locked(self) -> bool:
        return self._writer is not None

    def _require_lock(self, what: str) -> None:
        if self._writer is None:
            raise LandingError(f"{what} needs the data dir's lock: call it inside `with zone.lock():`")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self._writer is not None:
            yield
        else:
            with self.lock():
                yield

    # -- changing a committed night (besides a night's own commit, the only way: see rewrite) --

    def rewrite_night(
        self, night: Manifest, changes: Mapping[str, TableRewrite], layout: int | None = None
    ) -> Manifest:
        """Publish the files ``changes`` add and re-commit ``night`` naming them in place of the
        files they retire (:func:`membersync.warehouse.landing.rewrite.rewrite_night`)."""
        self._require_lock("rewriting a committed night")
        return rewrite.rewrite_night(self, night, changes, layout)

    def remove_night(self, night: Manifest) -> int:
        """Un-commit ``night``, then erase its files (:func:`.rewrite.remove_night`)."""
        self._require_lock("removing a committed night")
        return rewrite.remove_night(self, night)

    # -- reading ------------------------------------------------------------------------------

    def manifests(self) -> list[Manifest]:
        """Every committed night, oldest first."""
        return self.store.manifests()

    def manifest(self, night: dt.date) -> Manifest | None:
        return self.store.manifest(night)

    def state(self) -> SyncState:
        """Derived from the manifests (the commits), so never ahead of committed data."""
        derived = _state_of(self.manifests())
        saved = self._saved_state()
        if saved is not None and saved != derived.to_json():
            log.info("state.json differs from the committed manifests; using the manifests")
        return derived

    def read(self, table_name: str, night: dt.date) -> pa.Table:
        """The committed rows of one table on one night (only the files its manifest names)."""
        manifest = self.manifest(night)
        files = manifest.tables.get(table_name) if manifest else None
        if table_name == QUARANTINE_DIR and manifest is not None:
            files = manifest.quarantine
        schema = QUARANTINE_SCHEMA if table_name == QUARANTINE_DIR else LANDED_BY_NAME[table_name].schema
        if not files or not files.files:
            return schema.empty_table()
        parts = [self.store.read_table(f, schema) for f in files.files]
        return pa.concat_tables(parts)

    def _saved_state(self) -> str | None:
        try:
            return self.data_dir.state_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    # -- writing ------------------------------------------------------------------------------

    def open_night(self, night: dt.date, mode: str) -> Night:
        """Start the night's run, or resume an interrupted run of the same night and mode."""
        self._require_lock("open_night")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self._ensure_dirs()
        self.recover()
        folder = self.data_dir.staging / night.isoformat()
        run = _read_json(folder / "run.json")
        if _resumable(run, mode):
            log.info("night %s: resuming run %s", night, run["run_id"])
            return self._night(night, mode, run["run_id"], bytes.fromhex(run["salt"]), resumed=True)
        if folder.exists():
            log.info("night %s: discarding an interrupted run of another mode or layout", night)
            _remove(folder)
        run_id = f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(2)}"
        salt = secrets.token_bytes(16)  # new clients' keys: random, the same in every batch of the run
        try:
            make_dirs(folder / "batches", self.data_dir.root)
            body = {
                "run_id": run_id,
                "mode": mode,
                "night": night.isoformat(),
                "layout": STAGING_LAYOUT,
                "salt": salt.hex(),
            }
            write_bytes_atomic(folder / "run.json", json.dumps(body).encode())
        except OSError as exc:
            raise LandingWriteError(f"cannot start night {night} in {folder}: {_describe(exc)}") from None
        return self._night(night, mode, run_id, salt, resumed=False)

    def _night(self, night: dt.date, mode: str, run_id: str, salt: bytes, *, resumed: bool) -> Night:
        """The night, knowing which commit of it (if any) its own commit will replace."""
        base = self.store.manifest_version(night)
        replaces = self.manifest(night)
        return Night(self, night, mode, run_id, resumed=resumed, base=base, replaces=replaces, salt=salt)

    def recover(self, full: bool = False) -> None:
        """Bring the zone back to "only committed files are published" after any crash.

        Removes temporary files; moves published files of an uncommitted (resumable) run back
        into its staging area; deletes published files no manifest names; drops staging areas
        of runs that were committed. Never touches a file a manifest names.

        Only a night with a staging area can have unnamed published files (a run writes its
        ``run.json`` before anything else, and removes its staging area last), so only those
        nights' partitions are scanned, unless ``full`` (every partition of every night).
        """
        with self._locked():
            landing = self.data_dir.landing
            if not landing.exists():
                return
            manifests = self.manifests()  # a malformed manifest raises: then nothing is deleted
            named = {f for m in manifests for t in m.tables.values() for f in t.files}
            named |= {f for m in manifests for f in m.quarantine.files}
            committed_run = {m.snapshot_date: m.run_id for m in manifests}
            self._sweep_temp(self.data_dir.manifests)
            self._sweep_temp(self.data_dir.state_file.parent)
            staged_nights = self._staged_nights()
            pending = self._recover_staging(committed_run)
            self._recover_published(named, pending, None if full else staged_nights)
            self._write_state(manifests)

    # -- recovery steps -------------------------------------------------------------------------

    def _sweep_temp(self, folder: Path) -> None:
        if folder.exists():
            for entry in folder.iterdir():
                if TMP_MARK in entry.name:
                    _remove(entry)

    def _staged_nights(self) -> set[str]:
        """Partition names (``snapshot_date=D``) of the nights that have a staging area."""
        staging = self.data_dir.staging
        if not staging.exists():
            return set()
        return {f"snapshot_date={p.name}" for p in staging.iterdir() if _NIGHT_DIR.fullmatch(p.name)}

    def _recover_staging(self, committed_run: Mapping[dt.date, str]) -> dict[dt.date, tuple[str, Path]]:
        """Clean every staging area; the resumable ones, by night: (run_id, folder)."""
        pending: dict[dt.date, tuple[str, Path]] = {}
        staging = self.data_dir.staging
        if not staging.exists():
            return pending
        for folder in sorted(staging.iterdir()):
            if TMP_MARK in folder.name or not _NIGHT_DIR.fullmatch(folder.name):
                _remove(folder)
                continue
            night = dt.date.fromisoformat(folder.name)
            run = _read_json(folder / "run.json")
            run_id = run.get("run_id") if isinstance(run, dict) else None
            if not isinstance(run_id, str) or committed_run.get(night) == run_id:
                _remove(folder)  # never started, or committed and its cleanup was interrupted
                continue
            self._sweep_temp(folder)
            batches = folder / "batches"
            if batches.exists():
                for entry in batches.iterdir():
                    unmarked = entry.is_dir() and not (batches / f"{entry.name}.done").exists()
                    if TMP_MARK in entry.name or unmarked:
                        _remove(entry)
            pending[night] = (run_id, folder)
        return pending

    def _recover_published(
        self, named: set[str], pending: Mapping[dt.date, tuple[str, Path]], only: set[str] | None
    ) -> None:
        landing = self.data_dir.landing
        for top in sorted(landing.iterdir(), key=_name):
            if top.name in _RESERVED_TOP or not top.is_dir():
                continue
            # only the staged nights' partitions (a night's open looks at its own, not the history's)
            partitions = (
                sorted(top.iterdir(), key=_name)
                if only is None
                else [top / name for name in sorted(only) if os.path.lexists(top / name)]
            )
            for partition in partitions:
                if not partition.is_dir():
                    _remove(partition)
                    continue
                changed = False
                for entry in sorted(partition.iterdir(), key=_name):
                    rel = f"{top.name}/{partition.name}/{entry.name}"
                    if rel in named:
                        continue
                    changed = True
                    if not self._return_to_staging(entry, top.name, partition.name, pending):
                        log.info("recover: removing %s (no manifest names it)", rel)
                        _remove(entry)
                if not any(partition.iterdir()):
                    partition.rmdir()
                    fsync_dir(top)
                elif changed:
                    fsync_dir(partition)
            if not any(top.iterdir()):
                top.rmdir()
                fsync_dir(landing)

    def _return_to_staging(
        self, entry: Path, table: str, partition: str, pending: Mapping[dt.date, tuple[str, Path]]
    ) -> bool:
        """A published file of an interrupted commit goes back to its staged batch (True if moved)."""
        try:
            night = dt.date.fromisoformat(partition.removeprefix("snapshot_date="))
        except ValueError:
            return False
        if night not in pending:
            return False
        run_id, folder = pending[night]
        prefix = f"part-{run_id}-"
        if not (entry.name.startswith(prefix) and entry.name.endswith(".parquet")):
            return False
        batch = entry.name[len(prefix) : -len(".parquet")]
        batches = folder / "batches"
        staged = batches / batch / (QUARANTINE_FILE if table == QUARANTINE_DIR else f"{table}.parquet")
        if not (batches / f"{batch}.done").exists() or staged.exists() or not staged.parent.is_dir():
            return False
        os.rename(entry, staged)
        fsync_dir(staged.parent)
        log.info("recover: %s back to staging (run %s not committed)", entry.name, run_id)
        return True

    def _write_state(self, manifests: list[Manifest]) -> None:
        text = _state_of(manifests).to_json()
        if self._saved_state() == text:
            return
        path = self.data_dir.state_file
        make_dirs(path.parent, self.data_dir.root)
        write_bytes_atomic(path, text.encode())

    # -- setup ----------------------------------------------------------------------------------

    def _ensure_root(self) -> None:
        root = self.data_dir.root
        if not root.exists():
            root.parent.mkdir(parents=True, exist_ok=True)  # outside the data dir: not ours to chmod
            make_dirs(root, root.parent)
        os.chmod(root, DIR_MODE)

    def _ensure_dirs(self) -> None:
        self._ensure_root()
        d = self.data_dir
        for folder in (d.landing, d.manifests, d.staging, d.state_file.parent):
            make_dirs(folder, d.root)
            os.chmod(folder, DIR_MODE)


def sweep_personal_files(data_dir: DataDir, still_read: Iterable[str] = ()) -> int:
    """Delete every identity file (``client_identity``, ``client_demographics``) no manifest names,
    in the store (every version) and the local copy. Returns the files deleted.

    Called by each build once its catalogs are published (a replaced run's identity files wait
    for them, since the identified tier's reports read the landed identity files), and by an
    erasure once the catalogs read the rewritten files. ``still_read``: the landed files (paths
    ending in ``landing/...``) the catalog a build has just replaced read: a reader may still
    hold it, so they stay until the next build (as the replaced catalog's parts do); an erasure
    passes none, its files go at once."""
    store = store_for(data_dir)
    kept = {
        f"landing/{f}"
        for m in store.manifests()
        for n, t in m.tables.items()
        if n in PERSONAL_TABLES
        for f in t.files
    }
    named = set(kept)
    kept |= {
        "landing/" + p[p.rindex("/landing/") + len("/landing/") :] for p in still_read if "/landing/" in p
    }
    # what waits for the next build, listed so that a check of the landing zone knows why it is there
    waiting = sorted(
        f for f in kept - named if any(f.startswith(f"landing/{table}/") for table in PERSONAL_TABLES)
    )
    make_dirs(awaiting_sweep_file(data_dir).parent, data_dir.root)
    write_bytes_atomic(awaiting_sweep_file(data_dir), json.dumps(waiting).encode())
    remote = {f for table in sorted(PERSONAL_TABLES) for f in store.listing(f"landing/{table}")} - kept
    removed = store.erase(sorted(remote)) if remote and data_dir.remote is not None else 0
    for table in sorted(PERSONAL_TABLES):
        folder = data_dir.landing / table
        for path in sorted(folder.rglob("*")) if folder.is_dir() else ():
            if path.is_file() and path.relative_to(data_dir.root).as_posix() not in kept:
                path.unlink()
                removed += 1
    return removed


def awaiting_sweep_file(data_dir: DataDir) -> Path:
    """The identity files a build kept for readers of the catalog it replaced (a JSON list of
    paths relative to the data dir); the next build's sweep removes them."""
    return data_dir.state_file.parent / "identity_awaiting_sweep.json"


def _name(path: Path) -> str:
    return path.name
