"""The warehouse and the reports of a remote data location (``s3://``).

The warehouse (DuckDB) is built on local disk, from a local mirror of the committed files
(:func:`refresh_mirror`): ``DATA_DIR/warehouse.duckdb`` in the working dir, openable by any
DuckDB client without extensions; the report files are then uploaded (:func:`publish_reports`,
through the lease's fence). :func:`duckdb_connect` gives a DuckDB connection that reads the
bucket's Parquet directly (an fsspec filesystem registered with DuckDB, since httpfs cannot be
installed here).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from membersync.warehouse.landing.atomic import make_dirs, write_file_atomic
from membersync.warehouse.landing.manifest import Manifest, manifest_path, read_manifests
from membersync.warehouse.landing.paths import DataDir
from membersync.warehouse.landing.storage import ObjectStore, StoreError, _describe, s3_filesystem, store_for

log = logging.getLogger(__name__)


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
    items = [(path.relative_to(data_dir.root).as_posix(), path) for path in paths]
    if not items:
        return []
    store.put_fenced(f"publishing {len(items)} report file(s)", list(items))
    try:
        store.purge_old_versions([relative for relative, _ in items])
    except OSError as exc:
        raise StoreError(
            f"cannot remove older versions of the reports in {store.url}: {_describe(exc)}"
        ) from None
    return [f"{store.url}/{relative}" for relative, _ in items]


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
