"""One run of one night in the landing zone: its staged batches, then its one commit.

:class:`Night` is what :meth:`membersync.warehouse.landing.zone.LandingZone.open_night` returns:
it writes each batch atomically (a temporary folder, every file fsynced, renamed into place, then
its done marker), keeps what a resumed run needs (the discovery, the identity words as keyed
hashes), and commits: the staged files renamed into their published paths, the manifest last.
The zone (locking, recovery, state) is :mod:`membersync.warehouse.landing.zone`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
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
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq
from membersync.extract import redact
from membersync.models.coerce import to_json
from membersync.models.mask import hashed_tokens
from membersync.models.privacy import land_batch, land_quarantine
from membersync.models.tables import (
    BY_NAME,
    IDENTITY_TABLES,
    TYPED_QUARANTINE_SCHEMA,
)
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
from membersync.warehouse.landing.paths import QUARANTINE_DIR, DataDir
from membersync.warehouse.landing.storage import CommitConflict, Store, StoreError

log = logging.getLogger(__name__)

IDENTITY_WORDS = "identity_words.json"  # a run's discovery's identity tokens, keyed hashes
QUARANTINE_FILE = "_quarantine.parquet"  # its name inside a staged batch
COMPRESSION = "zstd"
_BATCH_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_RESERVED_TOP = frozenset({"_manifests", "_staging"})
PERSONAL_TABLES = frozenset(t.name for t in IDENTITY_TABLES)
# What a run's staged batches hold: 2 = landed tables (keys, identity apart). A staging area of
# another layout (an earlier version's, typed with client numbers) is discarded, never resumed.
STAGING_LAYOUT = 2


class LandingError(RuntimeError):
    """The landing zone cannot do what was asked; the message says what and where."""


class LandingWriteError(LandingError):
    """A write failed (disk full, file too large, permissions); nothing half-written is published."""


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


class Zone(Protocol):
    """What a night needs of its :class:`~membersync.warehouse.landing.zone.LandingZone`."""

    data_dir: DataDir
    store: Store
    erasure_key_file: str | None

    def manifests(self) -> list[Manifest]: ...

    def _require_lock(self, what: str) -> None: ...

    def _write_state(self, manifests: list[Manifest]) -> None: ...


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
        zone: Zone,
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
        tmp = tmp_name(self.batches / batch_id)
        try:
            if marker.exists():  # rewriting a done batch: it is not done until rewritten
                marker.unlink()
                fsync_dir(self.batches)
            rows = self._stage_files(batch_id, tmp, typed, quarantine)
            body: dict[str, Any] = {
                "batch": batch_id,
                "tables": rows,
                "quarantine": _count_by_table(quarantine),
            }
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

    def _stage_files(
        self, batch_id: str, tmp: Path, typed: Mapping[str, pa.Table], quarantine: pa.Table | None
    ) -> dict[str, int]:
        """A batch's files written in ``tmp``, fsynced, then renamed into place; its rows by table."""
        final = self.batches / batch_id
        if final.exists():
            _remove(final)
        make_dirs(tmp, self.zone.data_dir.root)
        rows: dict[str, int] = {}
        for name, table in typed.items():
            rows[name] = table.num_rows
            if table.num_rows:
                _write_parquet(table, tmp / f"{name}.parquet")
        if quarantine is not None and quarantine.num_rows:
            _write_parquet(quarantine, tmp / QUARANTINE_FILE)
        fsync_dir(tmp)
        os.rename(tmp, final)
        fsync_dir(self.batches)
        return rows

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
            self.zone.store.hold(f"committing night {self.night}")  # before any upload: fenced out, nothing
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
