"""Where the landing zone publishes: the local data dir, or S3-compatible object storage.

The landing zone (:mod:`membersync.warehouse.landing.zone`) always stages a night on local disk
(``DATA_DIR/landing/_staging``, for S3 the local working dir of :class:`DataDir`) and publishes
it through a :class:`Store`:

:class:`LocalStore` (the default)
    a staged part is published by a rename inside the data dir, the manifest by an atomic
    rename (:mod:`membersync.warehouse.landing.atomic`); nothing else.

:class:`ObjectStore` (``MEMBERSYNC_DATA_DIR=s3://bucket/prefix``, through fsspec/s3fs)
    the same layout under the prefix (``landing/<table>/snapshot_date=D/part-*.parquet``,
    ``landing/_manifests/D.json``, ``reports/<night>/...``). Staging stays on local disk: a
    staged batch is a rename away from published locally, resuming after a crash needs no
    listing of the bucket, and an interrupted run leaves nothing half-made in the bucket. At
    the commit every part is uploaded under a name that carries the run id (a part is
    immutable: no other run ever writes that name), then the manifest is written with a
    **conditional put**: ``If-None-Match: *`` when the night had no manifest when the run
    started, ``If-Match: <etag>`` of the manifest it replaces otherwise. Two writers can never
    both commit a night: the second put fails (HTTP 412) and its run fails with
    :class:`CommitConflict`. Readers read only the files a manifest names, and the manifest is
    the last object written, so a reader never sees half a night.

The warehouse (DuckDB) is built on local disk, from a local mirror of the committed files
(:func:`refresh_mirror`): ``DATA_DIR/warehouse.duckdb`` in the working dir, openable by any
DuckDB client without extensions; the report files are then uploaded (:func:`publish_reports`).
:func:`duckdb_connect` gives a DuckDB connection that reads the bucket's Parquet directly (an
fsspec filesystem registered with DuckDB, since httpfs cannot be installed here).

Credentials come from the standard AWS variables (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL`` for S3-compatible
endpoints) or any other source botocore knows; they are never written anywhere by us.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq
from membersync.warehouse.landing.atomic import make_dirs, write_bytes_atomic, write_file_atomic
from membersync.warehouse.landing.manifest import Manifest, manifest_path, read_manifest, read_manifests
from membersync.warehouse.landing.paths import DataDir

log = logging.getLogger(__name__)

_MANIFEST_NAME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}\.json")


class StoreError(RuntimeError):
    """The object store cannot do what was asked; the message names the object (never a secret)."""


class CommitConflict(StoreError):
    """Another writer committed the same night first: this run's commit was refused."""


class Store(Protocol):
    """What the landing zone needs from where it publishes (paths relative to the data root)."""

    def manifests(self) -> list[Manifest]: ...

    def manifest(self, night: dt.date) -> Manifest | None: ...

    def manifest_version(self, night: dt.date) -> str | None: ...

    def publish(self, local: Path) -> None: ...

    def commit_manifest(self, manifest: Manifest, base: str | None) -> None: ...

    def retire(self, files: Iterable[str]) -> None: ...

    def read_table(self, relative: str, schema: pa.Schema) -> pa.Table: ...

    def read_doc(self, relative: str) -> tuple[bytes | None, str | None]: ...

    def write_doc(self, relative: str, data: bytes, base: str | None) -> str | None: ...

    def erase(self, relative_to_root: Iterable[str]) -> int: ...

    def listing(self, prefix: str) -> list[str]: ...

    def remove_manifest(self, night: dt.date) -> None: ...


def store_for(data_dir: DataDir) -> Store:
    """The store of a data dir: local unless its location is ``s3://``."""
    if data_dir.remote is None:
        return LocalStore(data_dir)
    return ObjectStore(data_dir)


class LocalStore:
    """The local data dir: the landing zone's own renames publish; nothing more to do."""

    def __init__(self, data_dir: DataDir) -> None:
        self.data_dir = data_dir

    def manifests(self) -> list[Manifest]:
        return read_manifests(self.data_dir.manifests)

    def manifest(self, night: dt.date) -> Manifest | None:
        return read_manifest(self.data_dir.manifests, night)

    def manifest_version(self, night: dt.date) -> str | None:
        return None  # one machine, one lock: no version to compare

    def publish(self, local: Path) -> None:
        return None  # renamed into place by the landing zone already

    def commit_manifest(self, manifest: Manifest, base: str | None) -> None:
        path = manifest_path(self.data_dir.manifests, manifest.snapshot_date)
        write_bytes_atomic(path, manifest.to_json().encode())

    def retire(self, files: Iterable[str]) -> None:
        return None  # the landing zone's cleanup removes replaced local files

    def read_table(self, relative: str, schema: pa.Schema) -> pa.Table:
        return pq.read_table(self.data_dir.landing / relative, schema=schema)

    def read_doc(self, relative: str) -> tuple[bytes | None, str | None]:
        """A small document of the data location (the erasure register), and its version."""
        try:
            return (self.data_dir.root / relative).read_bytes(), None
        except FileNotFoundError:
            return None, None

    def write_doc(self, relative: str, data: bytes, base: str | None) -> str | None:
        path = self.data_dir.root / relative
        make_dirs(path.parent, self.data_dir.root)
        write_bytes_atomic(path, data)
        return None

    def remove_manifest(self, night: dt.date) -> None:
        """Un-commit a night (retention removes it): its manifest goes, atomically."""
        manifest_path(self.data_dir.manifests, night).unlink(missing_ok=True)

    def listing(self, prefix: str) -> list[str]:
        """Every file under ``prefix`` (relative to the root), as paths relative to the root."""
        folder = self.data_dir.root / prefix
        if not folder.is_dir():
            return []
        return sorted(p.relative_to(self.data_dir.root).as_posix() for p in folder.rglob("*") if p.is_file())

    def erase(self, relative_to_root: Iterable[str]) -> int:
        """Delete files of the data dir for good (the local copies are the only ones)."""
        removed = 0
        for relative in relative_to_root:
            try:
                (self.data_dir.root / relative).unlink()
                removed += 1
            except FileNotFoundError:
                continue
        return removed


def s3_filesystem() -> Any:
    """An s3fs filesystem from the standard AWS variables (no listing cache: manifests change)."""
    import s3fs

    client_kwargs: dict[str, Any] = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        client_kwargs["endpoint_url"] = endpoint
    region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION")
    if region:
        client_kwargs["region_name"] = region
    return s3fs.S3FileSystem(client_kwargs=client_kwargs, use_listings_cache=False, skip_instance_cache=True)


def _describe(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{exc.__class__.__name__}: {text}"[:300]


class ObjectStore:
    """``s3://bucket/prefix``: parts uploaded at the commit, the manifest put conditionally."""

    def __init__(self, data_dir: DataDir, fs: Any = None) -> None:
        if data_dir.remote is None:
            raise ValueError("ObjectStore needs an s3:// data location")
        self.data_dir = data_dir
        self.url = data_dir.remote
        self.base = self.url.removeprefix("s3://")
        self._fs = fs

    @property
    def fs(self) -> Any:
        if self._fs is None:
            self._fs = s3_filesystem()
        return self._fs

    def key(self, relative_to_root: str) -> str:
        return f"{self.base}/{relative_to_root}"

    def _manifest_key(self, night: dt.date) -> str:
        return self.key(f"landing/_manifests/{night.isoformat()}.json")

    # -- reading -------------------------------------------------------------------------------

    def manifests(self) -> list[Manifest]:
        folder = self.key("landing/_manifests")
        try:
            names = sorted(
                p for p in self.fs.ls(folder, detail=False) if _MANIFEST_NAME.fullmatch(p.rsplit("/", 1)[-1])
            )
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreError(f"cannot list s3://{folder}: {_describe(exc)}") from None
        out = []
        for name in names:
            try:
                text = self.fs.cat_file(name).decode("utf-8")
            except FileNotFoundError:
                continue  # replaced between the listing and the read: the next listing sees it
            except OSError as exc:
                raise StoreError(f"cannot read s3://{name}: {_describe(exc)}") from None
            out.append(Manifest.from_json(text, where=f"s3://{name}"))
        return out

    def manifest(self, night: dt.date) -> Manifest | None:
        name = self._manifest_key(night)
        try:
            text = self.fs.cat_file(name).decode("utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read s3://{name}: {_describe(exc)}") from None
        return Manifest.from_json(text, where=f"s3://{name}")

    def manifest_version(self, night: dt.date) -> str | None:
        """The ETag of the night's manifest (None: no manifest): what a commit may replace."""
        name = self._manifest_key(night)
        try:
            info = self.fs.info(name)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read s3://{name}: {_describe(exc)}") from None
        etag = info.get("ETag") or info.get("etag")
        return str(etag) if etag else None

    def read_table(self, relative: str, schema: pa.Schema) -> pa.Table:
        local = self.data_dir.landing / relative
        if local.is_file():  # a part is immutable: the mirror's copy is the object
            return pq.read_table(local, schema=schema)
        with self.fs.open(self.key(f"landing/{relative}"), "rb") as handle:
            return pq.read_table(handle, schema=schema)

    # -- writing -------------------------------------------------------------------------------

    def publish(self, local: Path) -> None:
        """Upload a part the landing zone published locally (same relative name)."""
        relative = local.relative_to(self.data_dir.root).as_posix()
        try:
            self.fs.put_file(str(local), self.key(relative))
        except OSError as exc:
            raise StoreError(f"cannot upload {relative} to {self.url}: {_describe(exc)}") from None

    def commit_manifest(self, manifest: Manifest, base: str | None) -> None:
        """Put the manifest only if the night's manifest is still ``base`` (None: still absent)."""
        name = self._manifest_key(manifest.snapshot_date)
        body = manifest.to_json().encode()
        condition = {"IfNoneMatch": "*"} if base is None else {"IfMatch": base}
        try:
            self.fs.pipe_file(name, body, **condition)
        except (FileExistsError, FileNotFoundError, PermissionError, OSError) as exc:
            # A 412 (or a retried put whose first try got through): whose manifest is there now?
            try:
                current = self.manifest(manifest.snapshot_date)
            except (StoreError, ValueError):
                current = None
            if current is not None and current.run_id == manifest.run_id:
                log.info("night %s: the manifest put was retried; it is ours", manifest.snapshot_date)
            elif current is not None and current.run_id != manifest.run_id:
                raise CommitConflict(
                    f"night {manifest.snapshot_date} was committed by another writer (run "
                    f"{current.run_id}, at {current.committed_at}) while run {manifest.run_id} was "
                    f"writing it; not committing (s3://{name} is unchanged; rerun the night to replace it)"
                ) from None
            elif base is not None and isinstance(exc, FileNotFoundError):
                raise CommitConflict(
                    f"night {manifest.snapshot_date}: its manifest s3://{name} was removed while run "
                    f"{manifest.run_id} was writing it; not committing"
                ) from None
            else:
                raise StoreError(f"cannot write s3://{name}: {_describe(exc)}") from None
        # The commit is in the bucket; keep the local mirror in step (readers of this machine).
        write_file_atomic(manifest_path(self.data_dir.manifests, manifest.snapshot_date), body)

    def read_doc(self, relative: str) -> tuple[bytes | None, str | None]:
        """A small document of the data location (the erasure register), and its ETag."""
        name = self.key(relative)
        try:
            info = self.fs.info(name)
            return self.fs.cat_file(name), str(info.get("ETag") or info.get("etag") or "") or None
        except FileNotFoundError:
            return None, None
        except OSError as exc:
            raise StoreError(f"cannot read s3://{name}: {_describe(exc)}") from None

    def write_doc(self, relative: str, data: bytes, base: str | None) -> str | None:
        """Put a document only if it is still ``base`` (None: still absent), like a manifest."""
        name = self.key(relative)
        condition = {"IfNoneMatch": "*"} if base is None else {"IfMatch": base}
        try:
            self.fs.pipe_file(name, data, **condition)
        except OSError as exc:
            raise CommitConflict(
                f"s3://{name} changed while this command wrote it ({_describe(exc)}); run it again"
            ) from None
        _, version = self.read_doc(relative)
        return version

    def erase(self, relative_to_root: Iterable[str]) -> int:
        """Delete objects for good: every version of each, where the bucket keeps versions
        (a versioned bucket's plain delete only hides the object behind a delete marker)."""
        keys = [self.key(r) for r in relative_to_root]
        removed = 0
        for name in keys:
            bucket, _, key = name.partition("/")
            try:
                versions = self._versions(bucket, key)
                for version in versions:
                    self.fs.call_s3("delete_object", Bucket=bucket, Key=key, VersionId=version)
                removed += bool(versions)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise StoreError(f"cannot delete s3://{name}: {_describe(exc)}") from None
        return removed

    def remove_manifest(self, night: dt.date) -> None:
        """Un-commit a night (retention removes it): its manifest object goes (every version),
        then the mirror's copy."""
        self.erase([f"landing/_manifests/{night.isoformat()}.json"])
        manifest_path(self.data_dir.manifests, night).unlink(missing_ok=True)

    def listing(self, prefix: str) -> list[str]:
        """Every object under ``prefix`` that has any version (a deleted one whose older versions
        a versioned bucket keeps included), as paths relative to the root."""
        bucket, _, key = self.key(prefix).partition("/")
        base = self.base.partition("/")[2]
        found: set[str] = set()
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": key.rstrip("/") + "/"}
        while True:
            try:
                page = self.fs.call_s3("list_object_versions", **kwargs)
            except OSError as exc:
                raise StoreError(f"cannot list s3://{bucket}/{key}: {_describe(exc)}") from None
            for item in [*page.get("Versions", []), *page.get("DeleteMarkers", [])]:
                name = str(item.get("Key", ""))
                found.add(name.removeprefix(f"{base}/") if base else name)
            if not page.get("IsTruncated"):
                return sorted(found)
            kwargs["KeyMarker"] = page.get("NextKeyMarker")
            kwargs["VersionIdMarker"] = page.get("NextVersionIdMarker")

    def purge_old_versions(self, relative_to_root: Iterable[str]) -> int:
        """Delete every version of each object but the newest (a rewritten report's old content)."""
        removed = 0
        for relative in relative_to_root:
            bucket, _, key = self.key(relative).partition("/")
            page = self.fs.call_s3("list_object_versions", Bucket=bucket, Prefix=key)
            for item in [*page.get("Versions", []), *page.get("DeleteMarkers", [])]:
                if item.get("Key") == key and not item.get("IsLatest") and item.get("VersionId"):
                    self.fs.call_s3("delete_object", Bucket=bucket, Key=key, VersionId=item["VersionId"])
                    removed += 1
        return removed

    def _versions(self, bucket: str, key: str) -> list[str]:
        """Every version id of one object, delete markers included ("null": written while the
        bucket kept no versions); [] when there is no such object."""
        out: list[str] = []
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": key}
        while True:
            page = self.fs.call_s3("list_object_versions", **kwargs)
            for item in [*page.get("Versions", []), *page.get("DeleteMarkers", [])]:
                if item.get("Key") == key and item.get("VersionId"):
                    out.append(item["VersionId"])
            if not page.get("IsTruncated"):
                return out
            kwargs["KeyMarker"] = page.get("NextKeyMarker")
            kwargs["VersionIdMarker"] = page.get("NextVersionIdMarker")

    def retire(self, files: Iterable[str]) -> None:
        """Delete the parts of the manifest a commit replaced (never a file of another run), every
        version of each (a replaced run's identity files must not stay in a bucket's history)."""
        relatives = [f"landing/{f}" for f in files]
        if not relatives:
            return
        try:
            self.erase(relatives)
        except StoreError as exc:
            log.warning("could not delete %d replaced part(s) in %s: %s", len(relatives), self.url, exc)


# --- the warehouse and the reports of a remote data location ---------------------------------------


def refresh_mirror(data_dir: DataDir) -> list[Manifest]:
    """Bring the local working dir's ``landing/`` in step with the bucket's committed nights.

    Manifests are copied whole (the bucket's set replaces the local one); parts are downloaded
    once (immutable), only those a manifest names. Returns the manifests. A local data dir: a no-op.
    """
    if data_dir.remote is None:
        return read_manifests(data_dir.manifests)
    store = ObjectStore(data_dir)
    manifests = store.manifests()
    make_dirs(data_dir.manifests)
    wanted = {f"{m.snapshot_date.isoformat()}.json": m for m in manifests}
    for path in data_dir.manifests.glob("????-??-??.json"):
        if path.name not in wanted:
            path.unlink()
    downloaded = 0
    for manifest in manifests:
        files = [f for t in manifest.tables.values() for f in t.files] + list(manifest.quarantine.files)
        for relative in files:
            local = data_dir.landing / relative
            if local.is_file():
                continue
            make_dirs(local.parent, data_dir.root)
            try:
                data = store.fs.cat_file(store.key(f"landing/{relative}"))
            except OSError as exc:
                raise StoreError(
                    f"manifest {manifest.snapshot_date} names {relative}, which cannot be read from "
                    f"{store.url}: {_describe(exc)}"
                ) from None
            write_file_atomic(local, data)
            downloaded += 1
        path = manifest_path(data_dir.manifests, manifest.snapshot_date)
        text = manifest.to_json()
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            write_file_atomic(path, text.encode())
    log.info("mirror of %s: %d night(s), %d part(s) downloaded", store.url, len(manifests), downloaded)
    return manifests


def publish_reports(data_dir: DataDir, paths: Sequence[Path]) -> list[str]:
    """Upload report files written under the working dir's ``reports/`` to the bucket (same
    relative names); return their URLs. A local data dir: nothing to do, the paths as given.

    A report written again replaces its object, and where the bucket keeps versions the older
    ones are deleted: a report names clients, and one forgotten since must not stay readable in
    an old version."""
    if data_dir.remote is None:
        return [str(p) for p in paths]
    store = ObjectStore(data_dir)
    out = []
    for path in paths:
        relative = path.relative_to(data_dir.root).as_posix()
        try:
            store.fs.put_file(str(path), store.key(relative))
            store.purge_old_versions([relative])
        except OSError as exc:
            raise StoreError(f"cannot upload {relative} to {store.url}: {_describe(exc)}") from None
        out.append(f"{store.url}/{relative}")
    return out


def mirror_reports(data_dir: DataDir) -> int:
    """Bring every report file of the data location into the working dir (a forget on this
    machine must find the reports another machine wrote); returns the files downloaded. A local
    data dir: nothing to do."""
    if data_dir.remote is None:
        return 0
    store = ObjectStore(data_dir)
    downloaded = 0
    for relative in store.listing("reports"):
        try:
            data = store.fs.cat_file(store.key(relative))
        except FileNotFoundError:
            continue  # only older versions or a delete marker: erased below, with every version
        except OSError as exc:
            raise StoreError(f"cannot read {relative} from {store.url}: {_describe(exc)}") from None
        local = data_dir.root / relative
        if local.is_file() and local.read_bytes() == data:
            continue
        make_dirs(local.parent, data_dir.root)
        write_file_atomic(local, data)
        downloaded += 1
    return downloaded


def remove_reports(data_dir: DataDir, night: str) -> int:
    """Delete a night's report folder for good: in the data location (every version) and the
    working dir. Returns the objects (or files) deleted."""
    folder = f"reports/{night}"
    store = store_for(data_dir)
    erased = store.erase(store.listing(folder)) if data_dir.remote is not None else 0
    local = data_dir.root / folder
    count = sum(1 for p in local.rglob("*") if p.is_file()) if local.is_dir() else 0
    shutil.rmtree(local, ignore_errors=True)
    return erased + count


def duckdb_connect(data_dir: DataDir, database: str = ":memory:") -> Any:
    """A DuckDB connection that reads ``s3://`` paths of the data location through fsspec
    (``SELECT * FROM read_parquet('s3://bucket/prefix/landing/...')``)."""
    import duckdb

    con = duckdb.connect(database)
    if data_dir.remote is not None:
        con.register_filesystem(s3_filesystem())
    return con
