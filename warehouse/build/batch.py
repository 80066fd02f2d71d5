"""One dbt build over a batch of nights, in a scratch database: what a build runs once, or, for a
history that does not fit the memory bound, once per batch (:mod:`membersync.warehouse.build.memory`).

A batch reads the landed files of its nights (``landing.*``), the manifests up to its last night
(``meta.*``) and the state it continues from (``prior.*``, ``history.*``: the published parts, or
the last batch's), runs ``dbt build``, raises on the first failed check, and writes each stored
model's rows as new Parquet parts. Nothing is published here: the builder writes the catalogs
over the last batch's parts and swaps them in.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
from membersync.extract.settings import Settings
from membersync.models.tables import LANDED
from membersync.warehouse.build import catalog as cat
from membersync.warehouse.build import dbt_run
from membersync.warehouse.build.errors import BuildCheckError
from membersync.warehouse.build.memory import batch_nights, build_memory
from membersync.warehouse.build.publish import connect
from membersync.warehouse.build.verdict import raise_first_failure
from membersync.warehouse.landing.crashpoints import crashpoint
from membersync.warehouse.landing.manifest import Manifest
from membersync.warehouse.landing.paths import DIR_MODE, DataDir

log = logging.getLogger(__name__)

SCRATCH_DIR = "scratch"


@dataclass(frozen=True)
class Plan:
    manifests: list[Manifest]
    build_nights: list[dt.date]
    full_refresh: bool
    reason: str
    fingerprint: str
    prior_parts: list[cat.Part]  # what an incremental build continues from (none: full refresh)
    prior_newest: dt.date | None
    published_parts: list[cat.Part]  # the replaced catalog's: a reader may hold it, they stay


@dataclass(frozen=True)
class Batch:
    """What the dbt build of one batch of nights left: every part so far, its checks and tallies."""

    run: dbt_run.DbtRun
    parts: list[cat.Part]
    checks: Sequence[tuple[str, str, str]]
    rows: dict[str, int]
    duplicates: dict[str, int]
    others: dict[str, dict[str, int]]


def batch_plan(
    plan: Plan, nights: list[dt.date], parts: list[cat.Part], newest: dt.date | None, *, first: bool
) -> Plan:
    """The plan of one batch: the nights committed up to its last (a later night is not yet there
    for it, as it was not for the night's own build), continuing from ``parts``."""
    return Plan(
        manifests=[m for m in plan.manifests if m.snapshot_date <= nights[-1]],
        build_nights=nights,
        full_refresh=plan.full_refresh and first,
        reason=plan.reason,
        fingerprint=plan.fingerprint,
        prior_parts=parts,
        prior_newest=newest,
        published_parts=plan.published_parts,
    )


def night_batches(data_dir: DataDir, plan: Plan, files: Sequence[cat.LandedFile]) -> list[list[dt.date]]:
    """The plan's nights cut into batches that fit the memory bound (their landed bytes)."""
    landed: dict[dt.date, int] = dict.fromkeys(plan.build_nights, 0)
    for f in files:
        if f.snapshot_date in landed:
            with contextlib.suppress(OSError):
                landed[f.snapshot_date] += os.stat(f.absolute).st_size
    sizes = batch_nights(
        [landed[d] for d in plan.build_nights], build_memory(data_dir), Settings.load().build_batch_nights
    )
    groups, start = [], 0
    for size in sizes:
        groups.append(plan.build_nights[start : start + size])
        start += size
    return groups


def build_batch(
    data_dir: DataDir, project: Path, plan: Plan, files: Sequence[cat.LandedFile], phases: dict[str, float]
) -> Batch:
    """One dbt build of the plan's nights in a fresh scratch database; its parts written."""
    scratch_dir = cat.warehouse_dir(data_dir) / SCRATCH_DIR
    scratch_dir.mkdir(mode=0o700)
    try:
        scratch = scratch_dir / dbt_run.SCRATCH_DATABASE
        building = set(plan.build_nights)
        with timed(phases, "prepare"):
            prepare_scratch(
                scratch, data_dir, project, plan, [f for f in files if f.snapshot_date in building]
            )
        with timed(phases, "dbt"):
            run = run_dbt(data_dir, project, scratch_dir, scratch, plan)
        crashpoint("during_warehouse_build")
        relations = {n.unique_id: n.relation for n in run.models()}
        with contextlib.closing(connect(scratch, data_dir)) as con:
            raise_first_failure(con, run, relations)
            with timed(phases, "parts"):
                parts = write_parts(con, data_dir, run, plan, cat.new_build_id())
                rows, duplicates, others = tallies(con, run)
        return Batch(run, parts, dbt_run.checks_rows(run, relations), rows, duplicates, others)
    finally:
        shutil.rmtree(scratch_dir, ignore_errors=True)


def merged_tallies(
    batches: Sequence[Batch],
) -> tuple[dict[str, int], dict[str, int], dict[str, dict[str, int]]]:
    """The build's tallies over its batches: rows of a batch's nights add up; a merged model's
    table (and a view) is the whole history in each batch, the last one's counts."""
    whole = {n.relation for n in batches[-1].run.models() if n.storage in (cat.MERGED, cat.VIEW)}
    rows: dict[str, int] = {}
    duplicates: dict[str, int] = {}
    others: dict[str, dict[str, int]] = {}
    for batch in batches:
        for name, count in batch.rows.items():
            rows[name] = count if name in whole else rows.get(name, 0) + count
        for name, count in batch.duplicates.items():
            duplicates[name] = duplicates.get(name, 0) + count
        for where, values in batch.others.items():
            into = others.setdefault(where, {})
            for raw, count in values.items():
                into[raw] = into.get(raw, 0) + count
    return rows, duplicates, others


@contextlib.contextmanager
def timed(phases: dict[str, float], name: str) -> Iterator[None]:
    """Add the block's seconds to ``phases[name]`` (a batched build passes each phase per batch)."""
    started = time.monotonic()
    try:
        yield
    finally:
        phases[name] = round(phases.get(name, 0.0) + time.monotonic() - started, 3)


def prepare_scratch(
    scratch: Path, data_dir: DataDir, project: Path, plan: Plan, files: Sequence[cat.LandedFile]
) -> None:
    """The sources dbt reads: meta (manifests), landing (the nights built), prior (published state)."""
    building = set(plan.build_nights)
    with contextlib.closing(connect(scratch, data_dir)) as con:
        for schema in ("meta", "landing", "prior", "history"):
            con.execute(f"CREATE SCHEMA {schema}")
        cat.register_table(con, "meta.nights", nights_table(plan.manifests))
        cat.register_table(
            con, "meta.build_nights", pa.table({"snapshot_date": pa.array(plan.build_nights, pa.date32())})
        )
        cat.register_table(
            con,
            "meta.manifest_rows",
            manifest_rows([m for m in plan.manifests if m.snapshot_date in building]),
        )
        cat.register_table(con, "meta.landed_files", cat.landed_files_table(files))
        cat.create_landing_views(con, files)
        if not plan.full_refresh:
            assert plan.prior_newest is not None
            # The tables of source `prior` are declared once, in sql/staging/_sources.yml.
            models = dbt_run.source_models(project, "prior")
            cat.create_prior_views(con, plan.prior_parts, models, plan.prior_newest)
            cat.create_history_views(con, plan.prior_parts, dbt_run.source_models(project, "history"))


def nights_table(manifests: Sequence[Manifest]) -> pa.Table:
    return pa.table(
        {
            "snapshot_date": pa.array([m.snapshot_date for m in manifests], pa.date32()),
            "run_id": pa.array([m.run_id for m in manifests], pa.string()),
            "mode": pa.array([m.mode for m in manifests], pa.string()),
            "committed_at": pa.array([m.committed_at for m in manifests], pa.string()),
            "watermark": pa.array([m.watermark for m in manifests], pa.string()),
            "clients_synced": pa.array([m.clients_synced for m in manifests], pa.int64()),
        }
    )


def manifest_rows(manifests: Sequence[Manifest]) -> pa.Table:
    """Rows per landed table and night as the manifests record them (every known table, 0 too)."""
    out: list[tuple[str, dt.date, int]] = []
    for m in manifests:
        for table in LANDED:
            out.append(
                (table.name, m.snapshot_date, m.tables[table.name].rows if table.name in m.tables else 0)
            )
        out.append((cat.QUARANTINE, m.snapshot_date, m.quarantine.rows))
        unknown = sorted(set(m.tables) - {t.name for t in LANDED})
        if unknown:
            log.warning(
                "manifest %s names tables this build does not know (ignored): %s", m.snapshot_date, unknown
            )
    return pa.table(
        {
            "table_name": pa.array([r[0] for r in out], pa.string()),
            "snapshot_date": pa.array([r[1] for r in out], pa.date32()),
            "rows": pa.array([r[2] for r in out], pa.int64()),
        }
    )


def run_dbt(data_dir: DataDir, project: Path, scratch_dir: Path, scratch: Path, plan: Plan) -> dbt_run.DbtRun:
    # dbt's target (manifest, partial-parse cache) is kept across builds: parsing the project
    # anew costs seconds. The profile is the same every build (fixed scratch path), so the
    # cache stays valid.
    state_dir = cat.warehouse_dir(data_dir) / "dbt"
    dbt_run.reset_cache_for(state_dir, project)
    # dbt runs independent models and tests side by side (MEMBERSYNC_DBT_THREADS, default 2): its
    # own per-node overhead is most of a small night's build, and DuckDB works outside the GIL.
    # More threads than cores bought no time and cost memory (each DuckDB query already uses
    # every core): 100,000 clients x 373 nights, 4 threads 682 MB, 2 threads 538 MB.
    bound = build_memory(data_dir)
    bound.spill_dir.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    dbt_run.write_profile(scratch_dir, scratch, Settings.load().dbt_threads, bound.settings())
    run = dbt_run.run_build(project, scratch_dir, state_dir, {"incremental": not plan.full_refresh})
    if not run.nodes and not run.success:
        raise BuildCheckError("dbt", "parses", run.error or f"dbt failed; see {run.log_file}")
    return run


def write_parts(
    con: duckdb.DuckDBPyConnection, data_dir: DataDir, run: dbt_run.DbtRun, plan: Plan, build_id: str
) -> list[cat.Part]:
    """New parts of every stored model; the published parts this build keeps (nightly history)."""
    parts: list[cat.Part] = []
    for node in run.models():
        where = "true"
        if node.storage in (cat.NIGHTLY, cat.LATEST):
            parts.extend(p for p in plan.prior_parts if p.model == node.relation)  # history stays
            nights = (plan.build_nights[0], plan.build_nights[-1])
            if node.storage == cat.LATEST:  # the versions first fetched in the nights built
                where = "snapshot_date IN (SELECT snapshot_date FROM meta.build_nights)"
        elif node.storage == cat.MERGED:
            nights = (plan.manifests[0].snapshot_date, plan.build_nights[-1])  # the whole table
        else:
            continue
        parts.append(cat.write_part(con, data_dir, node.relation, node.storage, build_id, nights, where))
        crashpoint("during_warehouse_build")
    return parts


def tallies(
    con: duckdb.DuckDBPyConnection, run: dbt_run.DbtRun
) -> tuple[dict[str, int], dict[str, int], dict[str, dict[str, int]]]:
    """Rows built, landed duplicates dropped by staging, and values counted as ``other``."""
    rows: dict[str, int] = {}
    for table in [*cat.landed_tables(), *(n.relation for n in run.models())]:
        found = con.execute(f"SELECT count(*) FROM {table}").fetchone()
        rows[table] = int(found[0]) if found else 0
    duplicates = {}
    others: dict[str, dict[str, int]] = {}
    for node in run.models():
        if not node.relation.startswith("staging."):
            continue
        landed = f"landing.{node.relation.removeprefix('staging.')}"
        if rows.get(landed, 0) > rows[node.relation]:
            duplicates[node.relation] = rows[landed] - rows[node.relation]
            log.warning(
                "%s: %d duplicate landed row(s) dropped (same key, same night)",
                node.relation,
                duplicates[node.relation],
            )
        columns = {d[0] for d in con.execute(f"SELECT * FROM {node.relation} LIMIT 0").description or []}
        for raw in sorted(c for c in columns if c.endswith("_raw") and c.removesuffix("_raw") in columns):
            column = raw.removesuffix("_raw")
            counted = con.execute(
                f"SELECT coalesce(CAST({raw} AS VARCHAR), '<null>'), count(*) FROM {node.relation} "
                f"WHERE {column} = 'other' GROUP BY 1 ORDER BY 1"
            ).fetchall()
            if counted:
                others[f"{node.relation}.{column}"] = {str(k): int(n) for k, n in counted}
    return rows, duplicates, others
