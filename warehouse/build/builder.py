"""Build ``DATA_DIR/warehouse.duckdb`` from the committed nights of the landing zone, with dbt.

The SQL layer is the dbt project in ``sql/`` (staging -> marts -> reports; grain, key, tests and
column descriptions in each layer's YAML). A build:

1. reads the manifests (``landing/_manifests/``): only the files they name are ever read, so a
   night being written or an orphan left by a crash is never seen;
2. decides what to build: **incremental** (the nights the published warehouse does not hold yet,
   continuing from its state) or a **full refresh** (every night: the first build, ``--full-
   refresh``, a changed dbt project, or a night committed again or older than the newest built);
3. prepares a scratch DuckDB database (under ``DATA_DIR/warehouse/``) with views: ``landing.*``
   over the new nights' files, ``prior.*`` over the published state, ``meta.*`` from the manifests;
4. runs **one** ``dbt build`` there (every model, then its tests: keys unique and not null,
   statuses accepted (unknown ones are ``other``), references, staging reconciled with landing,
   landed rows reconciled with the manifests). A failed test raises :class:`BuildCheckError`
   naming the model and the check, and the previous warehouse stays in place;
5. writes each model's rows as new Parquet parts and a new catalog of views beside the old one
   (:mod:`membersync.warehouse.build.catalog`), and swaps it in with ``os.replace``.

Readers are never blocked: the build never opens ``warehouse.duckdb`` for writing, a reader that
holds the old catalog keeps reading it (and its parts, kept until the build after next), and sees
the new night when it reopens. A crash at any moment leaves the previous warehouse whole.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import secrets
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa
from membersync.extract.settings import Settings
from membersync.models.tables import LANDED
from membersync.warehouse.build import catalog as cat
from membersync.warehouse.build import dbt_run
from membersync.warehouse.build.errors import BuildCheckError, BuildInputError, newer_nights, stale
from membersync.warehouse.build.project import LAYERS, SQL_DIR, Model, load_models
from membersync.warehouse.build.publish import (
    TIERS,
    TMP_PREFIX,
    build_lock,
    connect,
    follow_rewritten_nights,
    swap_in_catalog,
)
from membersync.warehouse.build.verdict import raise_first_failure
from membersync.warehouse.landing.atomic import alive
from membersync.warehouse.landing.crashpoints import crashpoint
from membersync.warehouse.landing.manifest import Manifest, read_manifests
from membersync.warehouse.landing.paths import DIR_MODE, FILE_MODE, DataDir
from membersync.warehouse.landing.zone import sweep_personal_files

log = logging.getLogger(__name__)

SCRATCH_PREFIX = "scratch-"  # per-build folders of earlier versions, removed when found
SCRATCH_DIR = "scratch"


@dataclass(frozen=True)
class BuildResult:
    path: Path
    nights: tuple[dt.date, ...]  # every night the warehouse holds
    models: tuple[str, ...]
    rows: dict[str, int]  # model or landing table -> rows built by this build (its nights)
    checks: int  # checks passed, as meta.checks lists them (a model and a check: unique(key), ...)
    duplicates_dropped: dict[str, int] = field(default_factory=dict)  # staging model -> rows
    others: dict[str, dict[str, int]] = field(default_factory=dict)  # "model.column" -> raw -> rows
    seconds: float = 0.0
    built_nights: tuple[dt.date, ...] = ()  # the nights this build computed (none: up to date)
    full_refresh: bool = False
    phases: dict[str, float] = field(default_factory=dict)  # seconds: prepare, dbt, parts, catalog, publish


@dataclass(frozen=True)
class _Plan:
    manifests: list[Manifest]
    build_nights: list[dt.date]
    full_refresh: bool
    reason: str
    fingerprint: str
    prior_parts: list[cat.Part]  # what an incremental build continues from (none: full refresh)
    prior_newest: dt.date | None
    published_parts: list[cat.Part]  # the replaced catalog's: a reader may hold it, they stay


def committed_nights(data_dir: DataDir) -> list[dt.date]:
    """The committed nights of the landing zone, oldest first."""
    return [m.snapshot_date for m in read_manifests(data_dir.manifests)]


@contextlib.contextmanager
def _owner_only_files() -> Iterator[None]:
    """Files dbt and DuckDB create during the build are the owner's only (umask 077): like every
    file of the data dir, the warehouse's parts hold client data."""
    previous = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(previous)


def _make_owner_only(folder: Path) -> None:
    """Folders 0700, files 0600 under ``folder`` (what an earlier build left with looser modes)."""
    if not folder.is_dir():
        return
    for path in [folder, *folder.rglob("*")]:
        with contextlib.suppress(OSError):
            os.chmod(path, DIR_MODE if path.is_dir() else FILE_MODE)


def build_warehouse(
    data_dir: DataDir, *, sql_dir: Path | None = None, full_refresh: bool = False
) -> BuildResult:
    """Build what the warehouse lacks (or everything); swap it in only if every test passed."""
    started = time.monotonic()
    project = (sql_dir or SQL_DIR).resolve()
    manifests = read_manifests(data_dir.manifests)
    if not manifests:
        raise BuildInputError(f"no committed night in {data_dir.manifests}: run `membersync sync` first")
    data_dir.root.mkdir(parents=True, exist_ok=True)
    with build_lock(data_dir):
        _remove_stale_temporaries(data_dir)
        plan = _plan(data_dir, manifests, project, full_refresh)
        if not plan.build_nights:
            follow_rewritten_nights(data_dir, manifests)
            log.info(
                "warehouse up to date: %d night(s) up to %s", len(manifests), manifests[-1].snapshot_date
            )
            return BuildResult(
                path=data_dir.warehouse_db,
                nights=tuple(m.snapshot_date for m in manifests),
                models=tuple(m.name for m in load_models(project)),
                rows={},
                checks=0,
                seconds=round(time.monotonic() - started, 3),
            )
        log.info(
            "building %d night(s) %s..%s (%s)",
            len(plan.build_nights),
            plan.build_nights[0],
            plan.build_nights[-1],
            plan.reason,
        )
        with _owner_only_files():
            result = _build(data_dir, project, plan)
        _make_owner_only(data_dir.root / "warehouse")
    result = _with_seconds(result, time.monotonic() - started)
    log.info(
        "warehouse built: %d night(s) up to %s (%d built, %s), %d models, %d tests passed, %.1fs",
        len(result.nights),
        result.nights[-1].isoformat(),
        len(result.built_nights),
        "full refresh" if result.full_refresh else "incremental",
        len(result.models),
        result.checks,
        result.seconds,
    )
    for where, values in result.others.items():
        log.warning("%s: %d row(s) counted as other: %s", where, sum(values.values()), dict(values))
    return result


def _with_seconds(result: BuildResult, seconds: float) -> BuildResult:
    from dataclasses import replace

    return replace(result, seconds=round(seconds, 3))


# --------------------------------------------------------------------------------------------
# What to build
# --------------------------------------------------------------------------------------------


def _plan(data_dir: DataDir, manifests: list[Manifest], project: Path, full_refresh: bool) -> _Plan:
    ours = {m.snapshot_date: m.committed_at for m in manifests}
    published, facts, parts = cat.published_state(data_dir.warehouse_db)
    newer = newer_nights(published, ours)
    if newer:
        raise stale(newer)
    fingerprint = dbt_run.project_fingerprint(project)
    every_night = sorted(ours)

    def full(reason: str) -> _Plan:
        return _Plan(manifests, every_night, True, reason, fingerprint, [], None, parts)

    if full_refresh:
        return full("full refresh asked")
    if not published or not parts:
        return full("no warehouse built yet")
    if facts.get("fingerprint") != fingerprint:
        return full("the dbt project changed since the last build")
    changed = sorted(d for d, at in published.items() if ours.get(d) != at)
    if changed:
        return full(f"night(s) committed again: {', '.join(d.isoformat() for d in changed)}")
    newest = max(published)
    new = [d for d in every_night if d not in published]
    if any(d < newest for d in new):
        return full("a night older than the newest built one was committed")
    return _Plan(manifests, new, False, "incremental", fingerprint, parts, newest, parts)


# --------------------------------------------------------------------------------------------
# The build
# --------------------------------------------------------------------------------------------


def _build(data_dir: DataDir, project: Path, plan: _Plan) -> BuildResult:
    build_id = f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}-{os.getpid()}-{secrets.token_hex(3)}"
    # One fixed scratch folder (builds are serialised by the build lock): dbt hashes the
    # profile, which names the scratch database, into its partial-parse cache, and a path that
    # changed every build would make dbt parse the whole project again (seconds a night).
    # A crashed build's folder was removed by _remove_stale_temporaries, under the same lock.
    scratch_dir = cat.warehouse_dir(data_dir) / SCRATCH_DIR
    scratch_dir.mkdir(mode=0o700)
    tmps = {tier: data_dir.root / f"{TMP_PREFIX}{build_id}-{tier}" for tier in TIERS}
    phases: dict[str, float] = {}  # seconds per phase (the log and the build benchmark show them)
    try:
        scratch = scratch_dir / dbt_run.SCRATCH_DATABASE
        with _timed(phases, "prepare"):
            try:
                files = cat.landed_files(data_dir, plan.manifests)
            except cat.LandingInputError as exc:
                raise BuildInputError(str(exc)) from None
            building = set(plan.build_nights)
            _prepare_scratch(scratch, project, plan, [f for f in files if f.snapshot_date in building])
        with _timed(phases, "dbt"):
            run = _run_dbt(data_dir, project, scratch_dir, scratch, plan)
        crashpoint("during_warehouse_build")
        relations = {n.unique_id: n.relation for n in run.models()}
        with contextlib.closing(connect(scratch)) as con:
            raise_first_failure(con, run, relations)
            with _timed(phases, "parts"):
                parts = _write_parts(con, data_dir, run, plan, build_id)
                rows, duplicates, others = _tallies(con, run)
        checks = dbt_run.checks_rows(run, relations)
        with _timed(phases, "catalog"):
            for tier, tmp in tmps.items():
                _write_catalog(tmp, data_dir, plan, files, parts, run, checks, project, tier)
        crashpoint("during_warehouse_build")
        with _timed(phases, "publish"):
            _publish_catalogs(data_dir, tmps, plan, parts)
        log.info("build phases (s): %s", ", ".join(f"{k} {v:.1f}" for k, v in phases.items()))
    finally:
        _remove_temporaries(tmps.values(), scratch_dir)
    return BuildResult(
        path=data_dir.warehouse_db,
        nights=tuple(m.snapshot_date for m in plan.manifests),
        models=tuple(n.relation for n in run.models()),
        rows=rows,
        checks=len(checks),
        duplicates_dropped=duplicates,
        others=others,
        built_nights=tuple(plan.build_nights),
        full_refresh=plan.full_refresh,
        phases=phases,
    )


def _remove_temporaries(catalogs: Iterable[Path], scratch_dir: Path) -> None:
    for leftover in (p for tmp in catalogs for p in (tmp, Path(f"{tmp}.wal"))):
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()
    shutil.rmtree(scratch_dir, ignore_errors=True)


def _publish_catalogs(
    data_dir: DataDir, tmps: dict[str, Path], plan: _Plan, parts: Sequence[cat.Part]
) -> None:
    """Every tier's new catalog in place, then the parts and identity files no catalog reads."""
    nights = {m.snapshot_date: m.committed_at for m in plan.manifests}
    read_before = cat.published_landed_files(data_dir.identified_db)  # a reader may hold it
    for tier, tmp in tmps.items():
        swap_in_catalog(tmp, data_dir.catalog(tier), nights)
    removed = cat.collect_garbage(data_dir, [p.path for p in [*parts, *plan.published_parts]])
    # a replaced run's identity files, now that the catalogs read the new run's (those the
    # replaced catalog read stay until the next build, as its parts do)
    sweep_personal_files(data_dir, read_before)
    if removed:
        log.info("removed %d part(s) no catalog names any more", removed)


@contextlib.contextmanager
def _timed(phases: dict[str, float], name: str) -> Iterator[None]:
    started = time.monotonic()
    try:
        yield
    finally:
        phases[name] = round(time.monotonic() - started, 3)


def _prepare_scratch(scratch: Path, project: Path, plan: _Plan, files: Sequence[cat.LandedFile]) -> None:
    """The sources dbt reads: meta (manifests), landing (the nights built), prior (published state)."""
    building = set(plan.build_nights)
    with contextlib.closing(connect(scratch)) as con:
        for schema in ("meta", "landing", "prior", "history"):
            con.execute(f"CREATE SCHEMA {schema}")
        cat.register_table(con, "meta.nights", _nights_table(plan.manifests))
        cat.register_table(
            con, "meta.build_nights", pa.table({"snapshot_date": pa.array(plan.build_nights, pa.date32())})
        )
        cat.register_table(
            con,
            "meta.manifest_rows",
            _manifest_rows([m for m in plan.manifests if m.snapshot_date in building]),
        )
        cat.register_table(con, "meta.landed_files", cat.landed_files_table(files))
        cat.create_landing_views(con, files)
        if not plan.full_refresh:
            assert plan.prior_newest is not None
            # The tables of source `prior` are declared once, in sql/staging/_sources.yml.
            models = dbt_run.source_models(project, "prior")
            cat.create_prior_views(con, plan.prior_parts, models, plan.prior_newest)
            cat.create_history_views(con, plan.prior_parts, dbt_run.source_models(project, "history"))


def _nights_table(manifests: Sequence[Manifest]) -> pa.Table:
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


def _manifest_rows(manifests: Sequence[Manifest]) -> pa.Table:
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


def _run_dbt(
    data_dir: DataDir, project: Path, scratch_dir: Path, scratch: Path, plan: _Plan
) -> dbt_run.DbtRun:
    # dbt's target (manifest, partial-parse cache) is kept across builds: parsing the project
    # anew costs seconds. The profile is the same every build (fixed scratch path), so the
    # cache stays valid.
    state_dir = cat.warehouse_dir(data_dir) / "dbt"
    dbt_run.reset_cache_for(state_dir, project)
    # dbt runs independent models and tests side by side (MEMBERSYNC_DBT_THREADS, default 2): its
    # own per-node overhead is most of a small night's build, and DuckDB works outside the GIL.
    # More threads than cores bought no time and cost memory (each DuckDB query already uses
    # every core): 100,000 clients x 373 nights, 4 threads 682 MB, 2 threads 538 MB.
    dbt_run.write_profile(scratch_dir, scratch, threads=Settings.load().dbt_threads)
    run = dbt_run.run_build(project, scratch_dir, state_dir, {"incremental": not plan.full_refresh})
    if not run.nodes and not run.success:
        raise BuildCheckError("dbt", "parses", run.error or f"dbt failed; see {run.log_file}")
    return run


def _write_parts(
    con: duckdb.DuckDBPyConnection, data_dir: DataDir, run: dbt_run.DbtRun, plan: _Plan, build_id: str
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


def _tallies(
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


def _write_catalog(
    tmp: Path,
    data_dir: DataDir,
    plan: _Plan,
    files: Sequence[cat.LandedFile],
    parts: Sequence[cat.Part],
    run: dbt_run.DbtRun,
    checks: Sequence[tuple[str, str, str]],
    project: Path,
    tier: str = "identified",
) -> None:
    """The new catalog of ``tier``: meta tables (``checks``: every check passed, as model, check,
    detail), landing views over every night, a view per model. The analyst tier's holds no model
    of the identified tier and no view over its files (``membersync sql`` names ``--identified``
    when a query asks for them)."""
    tables = cat.tier_tables(tier)
    readable = {t.name for t in tables} | {cat.QUARANTINE}
    files = [f for f in files if f.table in readable]
    models = [n for n in run.models() if tier == "identified" or n.tier != "identified"]
    names = {n.relation for n in models}
    withheld = [n.relation for n in run.models() if n.relation not in names]
    withheld += [f"landing.{t.name}" for t in LANDED if t.name not in readable]
    with contextlib.closing(connect(tmp)) as con:
        for schema in ("meta", "landing", *(x for x in LAYERS if tier == "identified" or x != "identity")):
            con.execute(f"CREATE SCHEMA {schema}")
        cat.register_table(con, "meta.nights", _nights_table(plan.manifests))
        cat.register_table(con, "meta.landed_files", cat.landed_files_table(files))
        cat.register_table(con, "meta.parts", cat.parts_table(parts))
        known = [m for m in load_models(project) if m.name in names]
        cat.register_table(con, "meta.models", _models_table(known, project))
        cat.register_table(con, "meta.checks", _checks_table([c for c in checks if c[0] not in withheld]))
        facts = {
            "fingerprint": plan.fingerprint,
            "built_nights": f"{plan.build_nights[0]}..{plan.build_nights[-1]}",
            "full_refresh": str(plan.full_refresh).lower(),
            "tier": tier,
        }
        cat.register_table(con, "meta.build", cat.facts_table(facts))
        cat.create_landing_views(con, files, tables)
        for node in models:  # dbt's order: a view is created after what it reads
            if node.storage == cat.VIEW:
                con.execute(f"CREATE VIEW {node.relation} AS\n{node.compiled_code}")
            else:
                mine = [p for p in parts if p.model == node.relation]
                cat.create_part_view(con, node.relation, mine, node.key)
        con.execute("CHECKPOINT")


def _checks_table(checks: Sequence[tuple[str, str, str]]) -> pa.Table:
    return pa.table(
        {
            "model": pa.array([c[0] for c in checks], pa.string()),
            "check_name": pa.array([c[1] for c in checks], pa.string()),
            "detail": pa.array([c[2] for c in checks], pa.string()),
        }
    )


def _models_table(models: Sequence[Model], project: Path) -> pa.Table:
    """meta.models: what each table or view is, for analysts (``SELECT * FROM meta.models``)."""
    return pa.table(
        {
            "name": pa.array([m.name for m in models], pa.string()),
            "layer": pa.array([m.layer for m in models], pa.string()),
            "materialized": pa.array([m.storage for m in models], pa.string()),
            "grain": pa.array([m.grain for m in models], pa.string()),
            "key": pa.array([", ".join(m.key) for m in models], pa.string()),
            "file": pa.array([f"sql/{m.path.relative_to(project)}" for m in models], pa.string()),
        }
    )


def _remove_stale_temporaries(data_dir: DataDir) -> None:
    """Remove what builds whose process is gone left behind (a crash mid-build)."""
    candidates = [
        *data_dir.root.glob(f"{TMP_PREFIX}*"),
        *cat.warehouse_dir(data_dir).glob(f"{SCRATCH_PREFIX}*"),
    ]
    scratch = cat.warehouse_dir(data_dir) / SCRATCH_DIR
    if scratch.exists():  # under the build lock: no live build owns it
        log.info("removing %s, left by an interrupted build", scratch)
        shutil.rmtree(scratch)  # a folder that cannot go would fail the build's mkdir anyway
    for path in candidates:
        build_id = path.name.removeprefix(TMP_PREFIX).removeprefix(SCRATCH_PREFIX)
        pid = cat.build_id_pid(build_id.removesuffix(".wal"))
        if pid is not None and alive(pid):
            continue
        log.info("removing %s, left by an interrupted build", path)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
