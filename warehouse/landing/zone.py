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
import errno
import fcntl
import hashlib
import itertools
import json
import logging
import os
import re
import secrets
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from membersync.extract import redact
from membersync.models.coerce import to_json
from membersync.models.mask import hashed_tokens
from membersync.models.privacy import land_batch, land_quarantine
from membersync.models.tables import (
    BY_NAME,
    IDENTITY_TABLES,
    LANDED_BY_NAME,
    QUARANTINE_SCHEMA,
    TYPED_QUARANTINE_SCHEMA,
)
from membersync.warehouse.landing import rewrite
from membersync.warehouse.landing.atomic import (
    TMP_MARK,
    fsync_dir,
    make_dirs,
    open_new,
    tmp_name,
    write_bytes_atomic,
    write_chunks_atomic,
)
from membersync.warehouse.landing.crashpoints import crashpoint
from membersync.warehouse.landing.identity import ClientKeys
from membersync.warehouse.landing.manifest import (
    Manifest,
    TableFiles,
)
from membersync.warehouse.landing.paths import DIR_MODE, FILE_MODE, QUARANTINE_DIR, DataDir
from membersync.warehouse.landing.rewrite import TableRewrite
from membersync.warehouse.landing.storage import CommitConflict, StoreError, store_for

log = logging.getLogger(__name__)

Mode = Literal["full", "incremental"]
MODES: tuple[str, ...] = ("full", "incremental")
IDENTITY_WORDS = "identity_words.json"  # a run's discovery's identity tokens, keyed hashes
QUARANTINE_FILE = "_quarantine.parquet"  # its name inside a staged batch
COMPRESSION = "zstd"
_BATCH_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_NIGHT_DIR = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_RESERVED_TOP = frozenset({"_manifests", "_staging"})
PERSONAL_TABLES = frozenset(t.name for t in IDENTITY_TABLES)
# What a run's staged batches hold: 2 = landed tables (keys, identity apart). A staging area of
# another layout (an earlier version's, typed with client numbers) is discarded, never resumed.
STAGING_LAYOUT = 2


class LandingError(RuntimeError):
    """The landing zone cannot do what was asked; the message says what and where."""


class LandingWriteError(LandingError):
    """A write failed (disk full, file too large, permissions); nothing half-written is published."""


class AlreadyRunning(LandingError):
    """Another sync holds the data dir's lock."""


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


def _write_parquet(table: pa.Table, path: Path) -> None:
    fd = open_new(path)
    with os.fdopen(fd, "wb") as handle:
        pq.write_table(table, handle, compression=COMPRESSION)
        handle.flush()
        os.fsync(handle.fileno())


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        name = errno.errorcode.get(exc.errno, str(exc.errno))
        return f"{exc.strerror or name} ({name})"
    return f"{exc.__class__.__name__}: {exc}"


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
        self._lock_fd: int | None = None

    # -- locking ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, wait: bool = False) -> Iterator[LandingZone]:
        """Hold ``DATA_DIR/.lock`` (flock); raise :class:`AlreadyRunning` at once when another
        process holds it, or with ``wait``, wait until it is free."""
        self._ensure_root()
        path = self.data_dir.lock_file
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            os.fchmod(fd, FILE_MODE)
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise AlreadyRunning(
                    f"another sync is running on {self.data_dir.root} (pid {holder or 'unknown'})"
                ) from None
            raise LandingError(f"cannot lock {path}: {_describe(exc)}") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            self._lock_fd = fd
            yield self
        finally:
            self._lock_fd = None
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    @property
    def locked(self) -> bool:
        return self._lock_fd is not None

    def _require_lock(self, what: str) -> None:
        if self._lock_fd is None:
            raise LandingError(f"{what} needs the data dir's lock: call it inside `with zone.lock():`")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self._lock_fd is not None:
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
        for top in sorted(landing.iterdir()):
            if top.name in _RESERVED_TOP or not top.is_dir():
                continue
            for partition in sorted(top.iterdir()):
                if only is not None and partition.name not in only:
                    continue
                if not partition.is_dir():
                    _remove(partition)
                    continue
                changed = False
                for entry in sorted(partition.iterdir()):
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


def _read_pid(fd: int) -> str | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return text if text.isdigit() else None


# Records of a saved discovery serialized at a time. Copied and serialized all at once, the
# records of a 100,000-client night took ~35 MB more at its peak (measured), and a process
# keeps most of such a peak resident for the rest of the night.
DISCOVERY_CHUNK = 1000


def _discovery_json(clients: Iterable[Mapping[str, Any]], batch_size: int) -> Iterator[bytes]:
    """``{"batch_size": n, "clients": [...], "format": 2}`` as JSON text, a chunk of records at a
    time (the keys sorted, as :func:`to_json` sorts them)."""
    yield b'{"batch_size":%d,"clients":[' % batch_size
    records = iter(clients)
    separator = b""
    while chunk := list(itertools.islice(records, DISCOVERY_CHUNK)):
        text = to_json(chunk)
        if not text.startswith("["):  # to_json's last resort describes what it could not write
            raise ValueError(f"a client record cannot be written as JSON: {text}")
        yield separator + text[1:-1].encode()
        separator = b","
    yield b'],"format":2}'


def _resumable(run: Any, mode: str) -> bool:
    """Whether a staged run.json is a run of ``mode`` this version can resume."""
    if not isinstance(run, dict) or run.get("mode") != mode or not isinstance(run.get("run_id"), str):
        return False
    if run.get("layout") != STAGING_LAYOUT or not isinstance(run.get("salt"), str):
        return False
    try:
        return len(bytes.fromhex(run["salt"])) >= 16
    except ValueError:
        return False


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class SavedPlan:
    """A run's saved discovery: its clients (sorted) and the batch size they were cut by."""

    clients: list[dict[str, Any]]
    batch_size: int | None


def client_digest(clients: Sequence[str]) -> str:
    """A short fingerprint of a batch's client numbers (order matters: batches are sorted)."""
    return hashlib.sha256("\n".join(clients).encode()).hexdigest()[:32]


# --- a night being written --------------------------------------------------------------------------


@dataclass
class _Published:
    """What a commit published: each table's files (relative to ``landing/``; a table whose
    batches had no row has none) and rows, and the quarantine's files and rows by table."""

    tables: dict[str, list[str]] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    quarantine_files: list[str] = field(default_factory=list)
    by_table: dict[str, int] = field(default_factory=dict)

    def table_files(self) -> dict[str, TableFiles]:
        return {name: TableFiles(tuple(files), self.rows[name]) for name, files in self.tables.items()}


class Night:
    """One run of one night: staged batches, then one commit."""

    def __init__(
        self,
        zone: LandingZone,
        night: dt.date,
        mode: str,
        run_id: str,
        *,
        resumed: bool,
        base: str | None = None,
        replaces: Manifest | None = None,
        salt: bytes | None = None,
    ) -> None:
        self.zone = zone
        self.salt = salt or secrets.token_bytes(16)
        self._keys: ClientKeys | None = None
        self.base = base  # the store's version of the manifest this run's commit may replace
        self.replaces = replaces
        self.night = night
        self.mode = mode
        self.run_id = run_id
        self.resumed = resumed
        self.folder = zone.data_dir.staging / night.isoformat()
        self.batches = self.folder / "batches"
        self.committed: Manifest | None = None

    def __repr__(self) -> str:
        return f"Night({self.night}, mode={self.mode}, run_id={self.run_id}, resumed={self.resumed})"

    def expect_clients(self, numbers: Iterable[str]) -> None:
        """The clients this run syncs (its discovery): a batch that only refers to one of them
        leaves its identity to the batch that syncs it."""
        numbers = list(numbers)
        self.keys.tonight.update(numbers)
        self.keys.mask.add_numbers(numbers)  # masked in every batch's free text, whichever lands them

    @property
    def keys(self) -> ClientKeys:
        """The surrogate keys of the clients this run lands (loaded once, on first use), with
        the identity words its discovery saw (a resumed run reads them back)."""
        if self._keys is None:
            replacing = self.night if self.replaces is not None else None
            self._keys = ClientKeys.load(self.zone, self.salt, replacing)
            saved = _read_json(self.folder / IDENTITY_WORDS)
            if isinstance(saved, list):
                self._keys.mask.add_hashed(self.salt, (h for h in saved if isinstance(h, str)))
            redact.register_identity_mask(self._keys.mask.text)  # logs and errors: never a name
        return self._keys

    def remember_identity(self, values: Iterable[str]) -> None:
        """The identity values discovery saw (search hits), masked in every batch's free text
        from now on; kept for a resumed run as keyed hashes only (the run's salt), never in the
        clear."""
        self._check_open("remember_identity")
        hashes = hashed_tokens(self.salt, values)
        write_bytes_atomic(self.folder / IDENTITY_WORDS, json.dumps(hashes).encode())
        self.keys.mask.add_hashed(self.salt, hashes)

    # -- discovery ------------------------------------------------------------------------------

    def saved_discovery(self) -> SavedPlan | None:
        """The client list and batch size saved by this run (before an interruption), or None.

        A run saved before the batch size was recorded has ``batch_size`` None; its staged
        batches are then reused only when their recorded client sets match (see
        :meth:`batch_fits`).
        """
        value = _read_json(self.folder / "discovery.json")
        if isinstance(value, list) and all(isinstance(v, dict) for v in value):
            return SavedPlan(value, None)
        if (
            isinstance(value, dict)
            and isinstance(value.get("clients"), list)
            and all(isinstance(v, dict) for v in value["clients"])
            and isinstance(value.get("batch_size"), int)
            and value["batch_size"] >= 1
        ):
            return SavedPlan(value["clients"], value["batch_size"])
        if value is not None:
            log.warning("night %s: saved discovery is malformed; discovering again", self.night)
        return None

    def save_discovery(self, clients: Iterable[Mapping[str, Any]], batch_size: int) -> None:
        """Keep the client list and the batch size, so a resumed run forms the same batches,
        whatever the settings of the rerun say (secrets scrubbed)."""
        self._check_open("save_discovery")
        try:
            write_chunks_atomic(self.folder / "discovery.json", _discovery_json(clients, batch_size))
        except (OSError, ValueError) as exc:
            raise LandingWriteError(
                f"cannot save discovery of night {self.night}: {_describe(exc)}"
            ) from None

    # -- batches --------------------------------------------------------------------------------

    def done_batches(self) -> set[str]:
        if not self.batches.exists():
            return set()
        return {
            p.name.removesuffix(".done")
            for p in self.batches.iterdir()
            if p.name.endswith(".done") and TMP_MARK not in p.name
        }

    def batch_fits(self, batch_id: str, clients: Sequence[str]) -> bool:
        """Whether the staged, done batch ``batch_id`` holds exactly ``clients``."""
        body = _read_json(self.batches / f"{batch_id}.done")
        recorded = body.get("clients") if isinstance(body, dict) else None
        return (
            isinstance(recorded, dict)
            and recorded.get("count") == len(clients)
            and recorded.get("digest") == client_digest(clients)
        )

    def discard_batch(self, batch_id: str) -> None:
        """Forget a staged batch (marker first, so it is never half-counted as done)."""
        self._check_open("discard_batch")
        try:
            _remove(self.batches / f"{batch_id}.done")
            fsync_dir(self.batches)
            _remove(self.batches / batch_id)
        except OSError as exc:
            raise LandingWriteError(
                f"cannot discard batch {batch_id!r} of night {self.night}: {_describe(exc)}"
            ) from None

    def write_batch(
        self,
        batch_id: str,
        tables: Mapping[str, pa.Table],
        quarantine: pa.Table | None = None,
        clients: Sequence[str] | None = None,
    ) -> None:
        """Stage one batch atomically: all its tables (and quarantine) or none, then a done marker.

        ``tables`` are typed (:data:`membersync.models.tables.TABLES`); what is written is what
        lands (:func:`membersync.models.privacy.land_batch`: keys instead of client numbers,
        personal fields in the identity tables only). ``clients``, the batch's client numbers,
        are recorded in the marker as a digest, so a resumed run reuses the batch only for
        exactly the same clients (:meth:`batch_fits`).
        """
        self._check_open("write_batch")
        if not isinstance(batch_id, str) or not _BATCH_ID.fullmatch(batch_id) or TMP_MARK in batch_id:
            raise ValueError(f"bad batch id {batch_id!r}: use letters, digits, '.', '_', '-' (max 128)")
        typed = land_batch({name: _checked(name, table) for name, table in tables.items()}, self.keys)
        if quarantine is not None:
            quarantine = land_quarantine(
                _conform(quarantine, TYPED_QUARANTINE_SCHEMA, "quarantine"), self.keys
            )
        marker = self.batches / f"{batch_id}.done"
        final = self.batches / batch_id
        tmp = tmp_name(final)
        try:
            if marker.exists():  # rewriting a done batch: it is not done until rewritten
                marker.unlink()
                fsync_dir(self.batches)
            if final.exists():
                _remove(final)
            make_dirs(tmp, self.zone.data_dir.root)
            rows: dict[str, int] = {}
            for name, table in typed.items():
                rows[name] = table.num_rows
                if table.num_rows:
                    _write_parquet(table, tmp / f"{name}.parquet")
            by_table = _count_by_table(quarantine)
            if quarantine is not None and quarantine.num_rows:
                _write_parquet(quarantine, tmp / QUARANTINE_FILE)
            fsync_dir(tmp)
            os.rename(tmp, final)
            fsync_dir(self.batches)
            body: dict[str, Any] = {"batch": batch_id, "tables": rows, "quarantine": by_table}
            if clients is not None:
                body["clients"] = {"count": len(clients), "digest": client_digest(clients)}
            write_bytes_atomic(marker, json.dumps(body, sort_keys=True).encode())
        except OSError as exc:
            with contextlib.suppress(OSError):
                _remove(tmp)
            raise LandingWriteError(
                f"cannot write batch {batch_id!r} of night {self.night} under {self.batches}: "
                f"{_describe(exc)}"
            ) from None
        crashpoint("after_batch_landed")

    # -- commit ---------------------------------------------------------------------------------

    def commit(
        self, watermark: str | None, clients_synced: int, stats: dict[str, Any], *, tenant: str | None = None
    ) -> Manifest:
        """Publish every done batch and write the manifest (the commit); then save state, clean up.

        ``tenant``: the tenant the night ran as, recorded in the manifest (a tenants file's name)."""
        self._check_open("commit")
        try:
            json.dumps(stats)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"commit stats must be JSON: {exc}") from None
        crashpoint("before_commit")
        markers = self._markers()
        _check_complete(self.night, clients_synced, markers)
        try:
            published = self._publish_batches(markers)
            crashpoint("after_publish")
            manifest = Manifest(
                snapshot_date=self.night,
                run_id=self.run_id,
                mode=self.mode,
                committed_at=f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H:%M:%SZ}",
                watermark=watermark,
                clients_synced=clients_synced,
                tables=published.table_files(),
                quarantine=TableFiles(tuple(published.quarantine_files), sum(published.by_table.values())),
                quarantine_by_table=published.by_table,
                stats=stats,
                tenant=tenant,
            )
            self.zone.store.commit_manifest(manifest, self.base)
        except CommitConflict as exc:
            raise LandingError(str(exc)) from None
        except StoreError as exc:
            raise LandingWriteError(
                f"cannot commit night {self.night} (run {self.run_id}): {exc}; "
                "the previously committed state is unchanged"
            ) from None
        except OSError as exc:
            raise LandingWriteError(
                f"cannot commit night {self.night} (run {self.run_id}): {_describe(exc)}; "
                "the previously committed state is unchanged"
            ) from None
        self.committed = manifest
        crashpoint("after_commit")
        self._after_commit(manifest)
        return manifest

    def _publish_batches(self, markers: list[tuple[str, dict[str, Any]]]) -> _Published:
        """Move every done batch's files to their published names under ``landing/`` (a file
        already moved by an interrupted commit is taken as it is), then fsync the folders."""
        landing = self.zone.data_dir.landing
        partition = f"snapshot_date={self.night.isoformat()}"
        published = _Published()
        moved_into: set[Path] = set()
        for batch, body in markers:
            for name, count in sorted(body["tables"].items()):
                published.tables.setdefault(name, [])
                published.rows[name] = published.rows.get(name, 0) + count
                if count:
                    rel = f"{name}/{partition}/part-{self.run_id}-{batch}.parquet"
                    self._publish(self.batches / batch / f"{name}.parquet", landing / rel, moved_into)
                    published.tables[name].append(rel)
            if body["quarantine"]:
                rel = f"{QUARANTINE_DIR}/{partition}/part-{self.run_id}-{batch}.parquet"
                self._publish(self.batches / batch / QUARANTINE_FILE, landing / rel, moved_into)
                published.quarantine_files.append(rel)
                for name, count in body["quarantine"].items():
                    published.by_table[name] = published.by_table.get(name, 0) + count
        for folder in moved_into:
            fsync_dir(folder)
        return published

    def _after_commit(self, manifest: Manifest) -> None:
        """State and cleanup: a failure here loses nothing (recover() finishes the job)."""
        zone = self.zone
        try:
            zone._write_state(zone.manifests())
            crashpoint("after_state_saved")
            keep = set(manifest.quarantine.files).union(*(t.files for t in manifest.tables.values()))
            partition = f"snapshot_date={self.night.isoformat()}"
            for top in zone.data_dir.landing.iterdir():
                folder = top / partition
                # A replaced run's identity files stay (here, where readers read them) until the
                # build has published catalogs that read the new run's (sweep_personal_files):
                # the identified tier's reports read the landed identity files.
                if top.name in _RESERVED_TOP or top.name in PERSONAL_TABLES or not folder.is_dir():
                    continue
                for entry in folder.iterdir():
                    if f"{top.name}/{partition}/{entry.name}" not in keep:
                        _remove(entry)  # the replaced files of an earlier run of this night
                fsync_dir(folder)
            _remove(self.folder)
            fsync_dir(zone.data_dir.staging)
            if self.replaces is not None:  # the store's copies of the replaced run's files
                old = set(self.replaces.quarantine.files).union(
                    *(t.files for t in self.replaces.tables.values())
                )
                zone.store.retire(sorted(old - keep))
        except OSError as exc:
            log.warning(
                "night %s committed; cleanup incomplete (%s), recover() will finish it", self.night, exc
            )

    def _publish(self, staged: Path, published: Path, moved_into: set[Path]) -> None:
        if staged.exists():
            make_dirs(published.parent, self.zone.data_dir.root)
            os.rename(staged, published)
            moved_into.add(published.parent)
        elif not published.exists():  # neither staged nor moved by an interrupted commit
            raise LandingError(f"night {self.night}: staged file {staged} is missing; rerun the night")
        try:
            self.zone.store.publish(published)  # object storage: upload (local: nothing to do)
        except StoreError as exc:
            raise LandingWriteError(f"cannot commit night {self.night} (run {self.run_id}): {exc}") from None

    def _markers(self) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for batch in sorted(self.done_batches()):
            body = _read_json(self.batches / f"{batch}.done")
            if not isinstance(body, dict) or not isinstance(body.get("tables"), dict):
                raise LandingError(f"night {self.night}: done marker of batch {batch!r} is unreadable")
            body.setdefault("quarantine", {})
            out.append((batch, body))
        return out

    def _check_open(self, what: str) -> None:
        self.zone._require_lock(what)
        if self.committed is not None:
            raise LandingError(f"night {self.night} (run {self.run_id}) is already committed")


def _check_complete(night: dt.date, expected: int, markers: list[tuple[str, dict[str, Any]]]) -> None:
    """Refuse a commit whose staged batches do not hold exactly the night's discovered clients.

    Every synced client has one ``synced_clients`` row (or a quarantined one); a count that
    differs means a batch is missing or was cut from another plan, and committing would lose
    clients while saying it did not. (Landing tests that stage other tables only skip this.)
    """
    if not any("synced_clients" in body["tables"] for _, body in markers):
        return
    got = sum(
        body["tables"].get("synced_clients", 0) + body["quarantine"].get("synced_clients", 0)
        for _, body in markers
    )
    if got != expected:
        raise LandingError(
            f"night {night}: the staged batches hold {got} clients but the night discovered "
            f"{expected}; not committing (rerun the night to fetch the missing ones)"
        )


def _checked(name: str, table: pa.Table) -> pa.Table:
    declared = BY_NAME.get(name)
    if declared is None:
        raise ValueError(f"unknown typed table {name!r}")
    return _conform(table, declared.schema, name)


def _conform(table: pa.Table, schema: pa.Schema, name: str) -> pa.Table:
    if table.schema.equals(schema):
        return table
    try:
        return table.select(schema.names).cast(schema)
    except (KeyError, ValueError, pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise ValueError(f"table {name!r} does not have its declared schema: {exc}") from None


def _count_by_table(quarantine: pa.Table | None) -> dict[str, int]:
    if quarantine is None or not quarantine.num_rows:
        return {}
    counts = quarantine.group_by("table_name").aggregate([("table_name", "count")])
    return dict(zip(counts["table_name"].to_pylist(), counts["table_name_count"].to_pylist(), strict=True))
