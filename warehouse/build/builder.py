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
4. runs ``dbt build`` there (every model, then its tests: keys unique and not null,
   statuses accepted (unknown ones are ``other``), references, staging reconciled with landing,
   landed rows reconciled with the manifests). A failed test raises :class:`BuildCheckError`
   naming the model and the check, and the previous warehouse stays in place;
5. writes each model's rows as new Parquet parts and a new catalog of views beside the old one
   (:mod:`membersync.warehouse.build.catalog`), and swaps it in with ``os.replace``.

Steps 3 and 4 run once per batch of nights (:mod:`membersync.warehouse.build.batch`): one batch,
unless the nights' landed files do not fit the memory bound (:mod:`membersync.warehouse.build.memory`,
``MEMBERSYNC_BUILD_MEMORY``); each next batch continues from the last one's parts, as a night
continues from the published ones. Nothing is published before the last batch.

Readers are never blocked: the build never opens ``warehouse.duckdb`` for writing, a reader that
holds the old catalog keeps reading it (and its parts, kept until the build after next), and sees
the new night when it reopens. A crash at any moment leaves the previous warehouse whole.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from membersync.models.tables import LANDED
from membersync.warehouse.build import catalog as cat
from membersync.warehouse.build import dbt_run
from membersync.warehouse.build.batch import (
    SCRATCH_DIR,
    Batch,
    Plan,
    batch_plan,
    build_batch,
    merged_tallies,
    night_batches,
    nights_table,
    timed,
)
from membersync.warehouse.build.errors import BuildInputError, newer_nights, stale
from membersync.warehouse.build.memory import sweep_spill
from membersync.warehouse.build.project import LAYERS, SQL_DIR, Model, load_models
from membersync.warehouse.build.publish import (
    TIERS,
    TMP_PREFIX,
    build_lock,
    connect,
    follow_rewritten_nights,
    swap_in_catalog,
)
from membersync.warehouse.landing.atomic import alive
from membersync.warehouse.landing.crashpoints import crashpoint
from membersync.warehouse.landing.manifest import Manifest, read_manifests
from membersync.warehouse.landing.paths import DIR_MODE, FILE_MODE, DataDir
from membersync.warehouse.landing.zone import sweep_personal_files

log = logging.getLogger(__name__)

SCRATCH_PREFIX = "scratch-"  # per-build folders of earlier versions, removed when found


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
    batches: int = 0  # dbt builds this build ran (more than one: its nights did not fit the memory bound)


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


Progress = Callable[[int, int], None]  # nights built so far, nights to build


def build_warehouse(
    data_dir: DataDir,
    *,
    sql_dir: Path | None = None,
    full_refresh: bool = False,
    progress: Progress | None = None,
) -> BuildResult:
    """Build what the warehouse lacks (or everything); swap it in only if every test passed.
    ``progress`` is told after each batch of nights (a full refresh of a long history has several)."""
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
            result = _build(data_dir, project, plan, progress)
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


def _plan(data_dir: DataDir, manifests: list[Manifest], project: Path, full_refresh: bool) -> Plan:
    ours = {m.snapshot_date: m.committed_at for m in manifests}
    published, facts, parts = cat.published_state(data_dir.warehouse_db)
    newer = newer_nights(published, ours)
    if newer:
        raise stale(newer)
    fingerprint = dbt_run.project_fingerprint(project)
    every_night = sorted(ours)

    def full(reason: str) -> Plan:
        return Plan(manifests, every_night, True, reason, fingerprint, [], None, parts)

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
    return Plan(manifests, new, False, "incremental", fingerprint, parts, newest, parts)


# --------------------------------------------------------------------------------------------
# The build
# --------------------------------------------------------------------------------------------


def _build(data_dir: DataDir, project: Path, plan: Plan, progress: Progress | None) -> BuildResult:
    """The plan's nights in batches (one, unless they do not fit the memory bound), each a dbt
    build continuing from the last; then the catalogs over the last batch's parts, swapped in."""
    build_id = cat.new_build_id()
    # One fixed scratch folder (builds are serialised by the build lock): dbt hashes the
    # profile, which names the scratch database, into its partial-parse cache, and a path that
    # changed every build would make dbt parse the whole project again (seconds a night).
    # A crashed build's folder was removed by _remove_stale_temporaries, under the same lock.
    scratch_dir = cat.warehouse_dir(data_dir) / SCRATCH_DIR
    tmps = {tier: data_dir.root / f"{TMP_PREFIX}{build_id}-{tier}" for tier in TIERS}
    phases: dict[str, float] = {}  # seconds per phase (the log and the build benchmark show them)
    try:
        with timed(phases, "prepare"):
            try:
                files = cat.landed_files(data_dir, plan.manifests)
            except cat.LandingInputError as exc:
                raise BuildInputError(str(exc)) from None
        batches = _built_batches(data_dir, project, plan, files, phases, progress)
        last = batches[-1]
        with timed(phases, "catalog"):
            for tier, tmp in tmps.items():
                _write_catalog(tmp, data_dir, plan, files, last.parts, last.run, last.checks, project, tier)
        crashpoint("during_warehouse_build")
        with timed(phases, "publish"):
            _publish_catalogs(data_dir, tmps, plan, last.parts)
        log.info("build phases (s): %s", ", ".join(f"{k} {v:.1f}" for k, v in phases.items()))
    finally:
        _remove_temporaries(tmps.values(), scratch_dir)
    rows, duplicates, others = merged_tallies(batches)
    return BuildResult(
        path=data_dir.warehouse_db,
        nights=tuple(m.snapshot_date for m in plan.manifests),
        models=tuple(n.relation for n in last.run.models()),
        rows=rows,
        checks=len(last.checks),
        duplicates_dropped=duplicates,
        others=others,
        built_nights=tuple(plan.build_nights),
        full_refresh=plan.full_refresh,
        phases=phases,
        batches=len(batches),
    )


def _built_batches(
    data_dir: DataDir,
    project: Path,
    plan: Plan,
    files: Sequence[cat.LandedFile],
    phases: dict[str, float],
    progress: Progress | None,
) -> list[Batch]:
    """Each batch is the build its nights would have had as nights of their own: the first
    continues from the plan's prior state (none: a full refresh), each next one from the last's
    parts, so a batched build is the incremental chain (equal to a full refresh byte for byte)."""
    groups = night_batches(data_dir, plan, files)
    if len(groups) > 1:
        log.info("building %d night(s) in %d batches (the memory bound)", len(plan.build_nights), len(groups))
    batches: list[Batch] = []
    parts, newest, done = plan.prior_parts, plan.prior_newest, 0
    for nights in groups:
        step = batch_plan(plan, nights, parts, newest, first=not batches)
        batches.append(build_batch(data_dir, project, step, files, phases))
        parts, newest, done = batches[-1].parts, nights[-1], done + len(nights)
        log.info("built %d of %d night(s), up to %s", done, len(plan.build_nights), nights[-1])
        if progress is not None:
            progress(done, len(plan.build_nights))
        if done < len(plan.build_nights):
            crashpoint("after_refresh_batch")
    return batches


def _remove_temporaries(catalogs: Iterable[Path], scratch_dir: Path) -> None:
    for leftover in (p for tmp in catalogs for p in (tmp, Path(f"{tmp}.wal"))):
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()
    shutil.rmtree(scratch_dir, ignore_errors=True)


def _publish_catalogs(
    data_dir: DataDir, tmps: dict[str, Path], plan: Plan, parts: Sequence[cat.Part]
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


def _write_catalog(
    tmp: Path,
    data_dir: DataDir,
    plan: Plan,
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
    with contextlib.closing(connect(tmp, data_dir)) as con:
        for schema in ("meta", "landing", *(x for x in LAYERS if tier == "identified" or x != "identity")):
            con.execute(f"CREATE SCHEMA {schema}")
        cat.register_table(con, "meta.nights", nights_table(plan.manifests))
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
    sweep_spill(data_dir, alive)
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
