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

Every write that changes what a reader of the bucket sees passes the fence of the lease this
process holds (:mod:`membersync.warehouse.landing.lease`): a writer whose lease was taken over
writes nothing. The warehouse and the reports of a bucket: :mod:`.remote`.

Credentials come from the standard AWS variables (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL`` for S3-compatible
endpoints) or any other source botocore knows; they are never written anywhere by us.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
import time
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq
from membersync.warehouse.landing.atomic import make_dirs, write_bytes_atomic, write_file_atomic
from membersync.warehouse.landing.manifest import Manifest, manifest_path, read_manifest, read_manifests
from membersync.warehouse.landing.paths import DataDir

log = logging.getLogger(__name__)

_REFUSED_PUT = ("PreconditionFailed", "ConditionalRequestConflict")  # S3's codes: a condition not met
_MANIFEST_NAME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}\.json")


class StoreError(RuntimeError):
    """The object store cannot do what was asked; the message names the object (never a secret)."""


class CommitConflict(StoreError):
    """Another writer committed the same night first: this run's commit was refused."""


class LeaseLost(StoreError):
    """This process does not hold the data location's lease (never had it, or it was taken
    over): its write was refused, nothing a reader sees changed."""


class Fence(Protocol):
    """The writer lock this process holds on a data location (:mod:`.lease`)."""

    token: int

    def fenced(
        self, what: str, intents: Sequence[dict[str, list[str]]] = ()
    ) -> AbstractContextManager[None]: ...

    def pending_prefix(self) -> str: ...

    def charge(self, seconds: float) -> None: ...

    def verify(self, what: str) -> None: ...


# (data location, working dir) -> the lease this process holds there (a test's "machines" are
# working dirs of one process)
_FENCES: dict[tuple[str, str], Fence] = {}


def hold_fence(data_dir: DataDir, fence: Fence | None) -> None:
    """Record (or, with None, forget) the lease this process holds on ``data_dir``'s location:
    every write of an :class:`ObjectStore` of that location passes its fence."""
    where = (str(data_dir.remote), str(data_dir.root))
    if fence is None:
        _FENCES.pop(where, None)
    else:
        _FENCES[where] = fence


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

    def hold(self, what: str) -> None: ...


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

    def hold(self, what: str) -> None:
        return None  # the flock: the kernel keeps it for as long as this process lives

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


S3_MAX_ATTEMPTS = 8  # attempts of one S3 call in all (botocore's standard retry mode)


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
    # botocore's standard retry mode: a 500, 502, 503 or 504 (or throttling) is retried with
    # exponential backoff and jitter. The legacy default gave up on a burst of 500s that a
    # threaded S3 (moto's server, busy) answers now and then, and failed a committed night's build.
    config = {"retries": {"mode": "standard", "max_attempts": S3_MAX_ATTEMPTS}}
    return s3fs.S3FileSystem(
        client_kwargs=client_kwargs,
        config_kwargs=config,
        use_listings_cache=False,
        skip_instance_cache=True,
    )


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
        self._fence(f"uploading {relative}")  # held by this process (a fenced manifest names it)
        try:
            self.fs.put_file(str(local), self.key(relative))
        except OSError as exc:
            raise StoreError(f"cannot upload {relative} to {self.url}: {_describe(exc)}") from None

    def commit_manifest(self, manifest: Manifest, base: str | None) -> None:
        """Put the manifest only if the night's manifest is still ``base`` (None: still absent),
        through the lease's fence (this holder's lease not taken over)."""
        night = manifest.snapshot_date
        name = self._manifest_key(night)
        current = self.manifest_version(night)
        if current != base:
            self._refuse_commit(manifest, base, current)
            return
        body = manifest.to_json().encode()
        self.put_fenced(f"committing night {night} (run {manifest.run_id})", [(self.relative(name), body)])
        # The commit is in the bucket; keep the local mirror in step (readers of this machine).
        write_file_atomic(manifest_path(self.data_dir.manifests, night), body)

    def _refuse_commit(self, manifest: Manifest, base: str | None, current: str | None) -> None:
        """The night's manifest is not the one this run started from: whose is there now?"""
        name = self._manifest_key(manifest.snapshot_date)
        there = self.manifest(manifest.snapshot_date) if current is not None else None
        if there is not None and there.run_id == manifest.run_id and there.to_json() == manifest.to_json():
            log.info("night %s: the manifest is already ours", manifest.snapshot_date)
            return
        if there is not None:
            raise CommitConflict(
                f"night {manifest.snapshot_date} was committed by another writer (run "
                f"{there.run_id}, at {there.committed_at}) while run {manifest.run_id} was "
                f"writing it; not committing (s3://{name} is unchanged; rerun the night to replace it)"
            )
        raise CommitConflict(
            f"night {manifest.snapshot_date}: its manifest s3://{name} was removed while run "
            f"{manifest.run_id} was writing it; not committing"
        )

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
        _, current = self.read_doc(relative)
        if current != base:
            raise CommitConflict(f"{self.url}/{relative} changed while this command wrote it; run it again")
        return self.put_fenced(f"writing {relative}", [(relative, data)])[relative]

    def erase(self, relative_to_root: Iterable[str]) -> int:
        """Delete objects for good: every version of each, where the bucket keeps versions
        (a versioned bucket's plain delete only hides the object behind a delete marker)."""
        keys = [self.key(r) for r in relative_to_root]
        if keys:
            self.hold(f"deleting {len(keys)} object(s) of {self.url}")
        return self._erase_keys(keys)

    def _erase_keys(self, keys: Sequence[str]) -> int:
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
        """Un-commit a night (retention removes it): its manifest object goes (every version,
        each named in the lease's fence first), then the mirror's copy."""
        relative = f"landing/_manifests/{night.isoformat()}.json"
        bucket, _, key = self.key(relative).partition("/")
        versions = self._versions(bucket, key)
        with self._fence(f"removing night {night}").fenced(
            f"removing night {night}", [{"delete": [relative, v]} for v in versions]
        ):
            for version in versions:
                self.delete_version(relative, version)
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

    # -- the lease's fence, and the raw operations the lease itself is made of ---------------------

    def relative(self, name: str) -> str:
        return name.removeprefix(f"{self.base}/")

    def _fence(self, what: str) -> Fence:
        fence = _FENCES.get((self.url, str(self.data_dir.root)))
        if fence is None:
            raise LeaseLost(f"{what}: refused, this process does not hold the lease of {self.url}")
        return fence

    def hold(self, what: str) -> None:
        """Make sure, with one read of the lease, that this process still holds it."""
        self._fence(what).verify(what)

    def put_fenced(self, what: str, items: Sequence[tuple[str, bytes | Path]]) -> dict[str, str | None]:
        """Write objects (relative name -> content or a local file) through the lease's fence:
        staged under the lease's pending prefix, named in the fence, then copied into place.
        Refused (:class:`LeaseLost`): the staged objects go again and nothing a reader sees changed."""
        fence = self._fence(what)
        prefix = fence.pending_prefix()
        staged = [(f"{prefix}/{relative}", relative) for relative, _ in items]
        try:
            for (pending, _), (_, content) in zip(staged, items, strict=True):
                if isinstance(content, Path):
                    self.fs.put_file(str(content), self.key(pending))
                else:
                    self.fs.pipe_file(self.key(pending), content)
            with fence.fenced(what, [{"copy": [p, r]} for p, r in staged]):
                started = time.perf_counter()
                etags = {r: self.copy_and_erase(p, r) for p, r in staged}
                fence.charge(time.perf_counter() - started)  # the copies: what the fence adds
                return etags
        except LeaseLost:
            self._erase_keys([self.key(p) for p, _ in staged])
            raise
        except OSError as exc:
            raise StoreError(f"{what}: cannot write to {self.url}: {_describe(exc)}") from None

    def get(self, relative: str) -> tuple[bytes | None, str | None]:
        return self.read_doc(relative)

    def put(self, relative: str, data: bytes) -> None:
        self.fs.pipe_file(self.key(relative), data)

    def put_if(self, relative: str, data: bytes, base: str | None) -> str | None:
        """A conditional put (None: absent); the new ETag, or None when the object is not ``base``."""
        condition = {"IfNoneMatch": "*"} if base is None else {"IfMatch": base}
        bucket, _, key = self.key(relative).partition("/")
        try:
            out = self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, **condition)
        except (FileExistsError, FileNotFoundError, PermissionError) as exc:
            log.debug("conditional put of %s refused: %s", relative, _describe(exc))
            return None
        except OSError as exc:
            code = getattr(exc.__cause__, "response", {}).get("Error", {}).get("Code", "")
            if code in _REFUSED_PUT or "pre-conditions you specified did not hold" in str(exc):
                return None
            raise StoreError(f"cannot write {self.url}/{relative}: {_describe(exc)}") from None
        return str(out.get("ETag"))

    def copy_and_erase(self, pending: str, relative: str) -> str | None:
        """Copy a pending object into place, then erase it (every version); None when it is gone
        (carried out already, by this holder or the next)."""
        bucket, _, key = self.key(relative).partition("/")
        _, _, source = self.key(pending).partition("/")
        try:
            out = self.fs.call_s3(
                "copy_object", Bucket=bucket, Key=key, CopySource={"Bucket": bucket, "Key": source}
            )
        except FileNotFoundError:
            return None
        self._erase_keys([self.key(pending)])
        return str(out.get("CopyObjectResult", {}).get("ETag") or "") or None

    def delete_version(self, relative: str, version: str) -> None:
        bucket, _, key = self.key(relative).partition("/")
        try:
            self.fs.call_s3("delete_object", Bucket=bucket, Key=key, VersionId=version)
        except FileNotFoundError:
            return

    def etag(self, relative: str) -> str | None:
        """The ETag of an object (None: absent), with one HEAD."""
        try:
            info = self.fs.info(self.key(relative))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read s3://{self.key(relative)}: {_describe(exc)}") from None
        return str(info.get("ETag") or info.get("etag") or "") or None

    def drop_older_versions(self, relative: str, etag: str) -> None:
        """Keep only the newest version of a small object rewritten often (the lease)."""
        self.purge_old_versions([relative])

    def sweep(self, prefix: str) -> int:
        """Erase every object under ``prefix`` (every version), needing no lease: staging no
        reader reads (a shard area, what a writer refused by the fence left)."""
        return self._erase_keys([self.key(r) for r in self.listing(prefix)])
