"""The published catalogs: one build or edit at a time (the build lock), a new catalog swapped in
atomically and never over a newer warehouse, and the edits a lifecycle change makes without a
rebuild (the landing views pointed at a rewritten night's files, retention's nights pruned from
the parts).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import logging
import os
import secrets
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import duckdb
from membersync.warehouse.build import catalog as cat
from membersync.warehouse.build.errors import newer_nights, stale
from membersync.warehouse.build.memory import apply_bound, build_memory
from membersync.warehouse.build.project import load_models
from membersync.warehouse.landing.manifest import Manifest, read_manifests
from membersync.warehouse.landing.paths import FILE_MODE, DataDir
from membersync.warehouse.landing.zone import sweep_personal_files

log = logging.getLogger(__name__)

TIERS = ("identified", "analyst")  # the catalogs a build publishes (the identified one first)


TMP_PREFIX = "warehouse.duckdb.building-"


@contextlib.contextmanager
def build_lock(data_dir: DataDir) -> Iterator[None]:
    """One build at a time per data dir (they share dbt's target folder); released by a crash too."""
    folder = cat.warehouse_dir(data_dir)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(folder / ".build.lock", os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def connect(path: Path | str, data_dir: DataDir) -> duckdb.DuckDBPyConnection:
    """A connection of a writer holding the build lock: held to the build's memory bound, spilling
    to the build's folder."""
    # No progress bar: a long COPY would draw one on the terminal of `membersync reports`.
    con = duckdb.connect(str(path))
    con.execute("SET enable_progress_bar = false")
    con.execute("SET TimeZone = 'UTC'")
    apply_bound(con, build_memory(data_dir))
    return con


def swap_in_catalog(tmp: Path, target: Path, nights: Mapping[dt.date, str]) -> None:
    """Swap the new catalog in atomically; readers holding the old one keep it.

    Never backwards: a build that read the manifests before a newer night was committed (and
    built by someone else) must not replace that newer warehouse with its older one. Writers
    hold the data dir's lock, so this is the last line of defence for a caller who does not.
    """
    published, _, _ = cat.published_state(target)
    newer = newer_nights(published, nights)
    if newer:
        raise stale(newer)
    os.chmod(tmp, FILE_MODE)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    # A write-ahead log left beside the old file (someone opened it read-write and crashed)
    # would be replayed into the new file on its next open: it belongs to the old file, drop it.
    stale_wal = Path(f"{target}.wal")
    if stale_wal.exists():
        log.warning("removing a stale write-ahead log %s (it belongs to the replaced warehouse)", stale_wal)
        stale_wal.unlink()
    os.replace(tmp, target)
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def edit_catalogs(data_dir: DataDir, edit: Callable[[duckdb.DuckDBPyConnection, str], None]) -> list[Path]:
    """Apply ``edit(con, tier)`` to a copy of each published catalog and swap the copy in (an
    atomic rename, as a build publishes); returns the catalogs edited. The caller holds the build
    lock. No model is rebuilt: an erasure or retention changes which files the views name."""
    done = []
    for tier in TIERS:
        target = data_dir.catalog(tier)
        if not target.is_file():
            continue
        tmp = data_dir.root / f"{TMP_PREFIX}{os.getpid()}-edit-{secrets.token_hex(3)}-{tier}"
        try:
            shutil.copyfile(target, tmp)
            with contextlib.closing(connect(tmp, data_dir)) as con:
                edit(con, tier)
                con.execute("CHECKPOINT")
            os.chmod(tmp, FILE_MODE)
            os.replace(tmp, target)
            done.append(target)
        finally:
            for leftover in (tmp, Path(f"{tmp}.wal")):
                leftover.unlink(missing_ok=True)
    return done


def follow_rewritten_nights(data_dir: DataDir, manifests: Sequence[Manifest]) -> None:
    """A night rewritten in place (an erasure, retention, on this machine or another) keeps its
    ``committed_at``: nothing to build, but a catalog still naming the files it replaced is
    pointed at the new ones, and the replaced identity files go. The caller holds the build lock."""
    files = cat.landed_files(data_dir, manifests)
    named = {f.absolute for f in files}
    stale = [
        tier
        for tier in TIERS
        if data_dir.catalog(tier).is_file()
        and set(cat.published_landed_files(data_dir.catalog(tier))) - named
    ]
    if stale:
        log.info("catalog(s) %s read files no manifest names: pointed at the current ones", stale)
        edit_catalogs(data_dir, lambda con, tier: _replace_landing_views(con, files, tier))
        sweep_personal_files(data_dir)


def repoint_catalogs(data_dir: DataDir) -> list[Path]:
    """Point each published catalog's landing views at the files the manifests name now."""
    files = cat.landed_files(data_dir, read_manifests(data_dir.manifests))
    with build_lock(data_dir):
        return edit_catalogs(data_dir, lambda con, tier: _replace_landing_views(con, files, tier))


def _replace_part_views(con: duckdb.DuckDBPyConnection, parts: Sequence[cat.Part], models: set[str]) -> None:
    """The catalog's views of ``models`` (those it holds) over ``parts``."""
    keys = {m.name: m.key for m in load_models()}
    held = {
        f"{s}.{v}" for s, v in con.execute("SELECT schema_name, view_name FROM duckdb_views()").fetchall()
    }
    for model in sorted(models & held):
        con.execute(f"DROP VIEW {model}")
        cat.create_part_view(con, model, [p for p in parts if p.model == model], keys.get(model, ()))


def prune_nights(data_dir: DataDir, removed: Sequence[dt.date]) -> int:
    """Retention removed ``removed`` from the landing zone: drop their rows from every part that
    holds rows per night, forget them in ``meta.nights``, point the landing views at the files
    now named; no model is rebuilt (the nights kept are as they were built). Returns the parts
    rewritten; the parts they replace are deleted at once."""
    published, _, parts = cat.published_state(data_dir.warehouse_db)
    gone = sorted(set(removed) & set(published))
    if not gone:
        repoint_catalogs(data_dir)
        return 0
    keys = {m.name: m.key for m in load_models()}
    build_id = cat.new_build_id()
    with build_lock(data_dir), contextlib.closing(connect(":memory:", data_dir)) as con:
        rewritten = {
            p.path: _pruned_part(con, data_dir, p, keys.get(p.model, ()), gone, build_id) for p in parts
        }
    kept = [rewritten.get(p.path) or p for p in parts]
    changed = {p.model for p in parts if rewritten.get(p.path)}
    _swap_pruned(data_dir, kept, changed, gone)
    for old, new in rewritten.items():
        if new is not None:
            Path(old).unlink(missing_ok=True)
    return sum(1 for p in rewritten.values() if p is not None)


def _pruned_part(
    con: duckdb.DuckDBPyConnection,
    data_dir: DataDir,
    part: cat.Part,
    key: Sequence[str],
    gone: Sequence[dt.date],
    build_id: str,
) -> cat.Part | None:
    """``part`` without the rows of the nights ``gone`` (None: it holds none of them, or has no
    rows per night: events, revenue by business date)."""
    if part.storage == cat.LATEST or part.last_night < gone[0] or part.first_night > gone[-1]:
        return None
    scan = f"read_parquet('{part.path}')"
    columns = {d[0] for d in con.execute(f"SELECT * FROM {scan} LIMIT 0").description or []}
    column = "as_of_date" if "as_of_date" in columns else "snapshot_date" if "snapshot_date" in key else None
    if column is None:
        return None
    nights = ", ".join(f"DATE '{n.isoformat()}'" for n in gone)
    held = con.execute(f"SELECT count(*) FROM {scan} WHERE {column} IN ({nights})").fetchone()
    if not held or not held[0]:
        return None
    folder = Path(part.path).parent
    path = folder / f"{build_id}-pruned-{secrets.token_hex(2)}.parquet"
    con.execute(
        f"COPY (SELECT * FROM {scan} WHERE {column} NOT IN ({nights})) TO '{path}' "
        "(FORMAT parquet, COMPRESSION zstd)"
    )
    os.chmod(path, FILE_MODE)
    return cat.Part(part.model, part.storage, str(path), part.first_night, part.last_night)


def _swap_pruned(
    data_dir: DataDir, parts: Sequence[cat.Part], changed: set[str], gone: Sequence[dt.date]
) -> None:
    """Each tier's catalog with the pruned parts, ``meta.nights`` without ``gone`` and landing
    views over the files named now, swapped in like a build's."""
    files = cat.landed_files(data_dir, read_manifests(data_dir.manifests))
    nights = ", ".join(f"DATE '{n.isoformat()}'" for n in gone)

    def edit(con: duckdb.DuckDBPyConnection, tier: str) -> None:
        con.execute(f"DELETE FROM meta.nights WHERE snapshot_date IN ({nights})")
        con.execute("DROP TABLE meta.parts")
        cat.register_table(con, "meta.parts", cat.parts_table(parts))
        _replace_part_views(con, list(parts), changed)
        _replace_landing_views(con, files, tier)

    with build_lock(data_dir):
        edit_catalogs(data_dir, edit)


def _replace_landing_views(
    con: duckdb.DuckDBPyConnection, files: Sequence[cat.LandedFile], tier: str
) -> None:
    tables = cat.tier_tables(tier)
    readable = {t.name for t in tables} | {cat.QUARANTINE}
    for name in sorted(readable):
        con.execute(f"DROP VIEW IF EXISTS landing.{name}")
    con.execute("DROP TABLE meta.landed_files")
    mine = [f for f in files if f.table in readable]
    cat.register_table(con, "meta.landed_files", cat.landed_files_table(mine))
    cat.create_landing_views(con, mine, tables)
