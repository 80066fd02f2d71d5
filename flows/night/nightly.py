"""One night of sync: configuration, discovery, per-client fan-out, land, commit, build.

Two ways to run the same steps:

* :func:`run_night` — a plain function (no Prefect), for tests, the benchmark and embedding.
* ``nightly_sync`` — the Prefect 3 flow (in :mod:`membersync.flows.night.prefect_flow`): one task for
  configuration, one for discovery, one task **per batch** of clients (a few hundred clients
  each, so 100,000 clients are a few hundred task runs), one for the self-audit, one for the
  commit and one for the warehouse build.

Both drive a :class:`NightRun` through :func:`drive`, whose steps are NightRun's methods, called
by name through a step runner: directly (:func:`direct_steps`) or as task runs
(``prefect_flow.task_steps``). The run holds the one
:class:`~membersync.extract.client.ServiceClient` of the night (one connection pool, one
rate limiter); Prefect tasks reach it through the module-level run registry by a run key,
never as a parameter, so credentials and data never become Prefect parameters or results
(every task uses ``NO_CACHE`` and persists nothing).

Order of a night (the landing zone makes it restartable):

1. Configuration lists, written as batch ``"config"``; the store list's timezones type local
   datetimes and its store codes drive discovery.
2. Discovery (saved with the night, so a resumed run syncs the same clients in the same batches).
3. Batches of sorted client numbers; batches already written by an interrupted run of the same
   night are skipped; each batch is written atomically.
4. The self-audit of an incremental night (:mod:`membersync.flows.night.audit`): a sample of the
   clients *not* synced tonight is fetched live and compared with the landing zone; those that
   differ are queued for a full re-sync (the next night's discovery adds them), or synced at
   once in extra batches (``MEMBERSYNC_AUDIT_HEAL=now``).
5. Commit (the manifest is written last; the re-sync queue then forgets the clients the night
   synced), then the warehouse build and the report CSVs.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from membersync.extract.settings import ServiceSettings, SettingsError
from membersync.flows.night import audit as A
from membersync.flows.night import batches as B
from membersync.flows.night import nightgc
from membersync.flows.night.options import SyncOptions
from membersync.flows.night.progress import NullProgress, Progress
from membersync.flows.night.summary import RunSummary
from membersync.models.coerce import TimezoneLookup
from membersync.warehouse.landing.atomic import write_json_atomic
from membersync.warehouse.landing.manifest import foreign_tenant
from membersync.warehouse.landing.paths import DataDir
from membersync.warehouse.landing.shard_area import add_counts, request_counts, status_counts

log = logging.getLogger(__name__)

CONFIG_BATCH = "config"


# --- the lock (re-entrant within a process) ------------------------------------------------------------

_held: dict[Path, tuple[Any, int]] = {}  # data dir -> (the LandingZone holding its lock, depth)
_held_guard = threading.Lock()


@contextlib.contextmanager
def holding_lock(data_dir: DataDir, wait: bool = False) -> Iterator[Any]:
    """The data dir's sync lock, taken once per process; yields the locked ``LandingZone``.

    ``membersync sync`` takes the lock *before* it starts Prefect (so a second sync says
    "already running" at once, not after the ephemeral server's start); the flow then asks
    again in the same process and gets the same, already locked, zone.
    """
    from membersync.warehouse.landing.zone import LandingZone

    key = data_dir.root.resolve()
    with _held_guard:
        held = _held.get(key)
        if held is not None:
            _held[key] = (held[0], held[1] + 1)
    if held is not None:
        try:
            yield held[0]
        finally:
            with _held_guard:
                zone, depth = _held[key]
                _held[key] = (zone, depth - 1)
        return
    zone = LandingZone(data_dir)
    with zone.lock(wait):
        with _held_guard:
            _held[key] = (zone, 1)
        try:
            yield zone
        finally:
            with _held_guard:
                del _held[key]


# --- one night -------------------------------------------------------------------------------------


def needs_full_night(night: dt.date, last_night: dt.date | None) -> bool:
    """Whether a night must list every client even without ``--full``.

    The first night, obviously. Also a night that is not after the last committed one (a
    rerun of today, a backfill): its commit *replaces* that night's files, and an
    incremental listing would leave the clients that did not change with no row on that night.
    """
    return last_night is None or night <= last_night


class NightRun:
    """The state of one night between its steps: the client, the open night, the batches."""

    def __init__(
        self,
        settings: ServiceSettings,
        data_dir: DataDir,
        night: dt.date,
        *,
        full: bool = False,
        options: SyncOptions | None = None,
        progress: Progress | None = None,
        zone: Any = None,
    ) -> None:
        self.settings = settings
        self.data_dir = data_dir
        self.night_date = night
        self.full = full
        self.options = options or SyncOptions()
        self.progress: Progress = progress or NullProgress()
        self.zone = zone  # the locked LandingZone (see holding_lock), set before open()
        self.summary = RunSummary(night=night)
        self.client: Any = None
        self.night: Any = None
        self.tz = TimezoneLookup()
        self.affiliated: frozenset[str] = frozenset()
        self.storecodes: list[str] = []
        self.stores: list[dict[str, Any]] = []  # the storelist as fetched (a shard plan carries it)
        self.batches: dict[str, B.Batch] = {}
        # How the pending batches are fetched when not here, batch by batch: a large tenant's
        # night fans out to shards on a work pool (flows/night/shards.py, set by flows/pool/tenant_flow.py).
        self.fan_out: Callable[[NightRun, list[str]], Awaitable[None]] | None = None
        self.shard_stats: dict[str, int] = {}  # what the shards asked of the service (summed)
        self.shard_statuses: dict[str, int] = {}  # the shards' answers by HTTP status (summed)
        self.window: B.Window | None = None
        self.previous_watermark: str | None = None
        self.healed: list[str] = []  # clients the self-audit had synced tonight (heal=now)
        self._discovery: B.Discovery | None = None
        self._started = time.perf_counter()
        self._cpu_started = time.process_time()

    # -- lifecycle ----------------------------------------------------------------------------------

    def claim_data_dir(self) -> None:
        """The data dir made if new; one of another tenant refused before anything changes in it."""
        self.data_dir.ensure()
        self.tenant = self.settings.tenant
        refusal = foreign_tenant(((m.snapshot_date, m.tenant) for m in self.zone.manifests()), self.tenant)
        if refusal is not None:
            raise SettingsError(refusal)

    def upkeep(self) -> None:
        """Before anything lands: the earlier layout migrated, what a crash left of an erasure or a
        retention run finished (:func:`membersync.warehouse.lifecycle.upkeep.upkeep`)."""
        from membersync.warehouse.lifecycle.upkeep import upkeep

        upkeep(self.zone)

    async def open(self) -> None:
        """Open (or resume) the night and the client. The caller holds the data dir's lock."""
        from membersync.extract.client import ServiceClient

        state = self.zone.state()
        self.previous_watermark = state.watermark
        full = self.full or needs_full_night(self.night_date, state.last_night)
        mode = "full" if full else "incremental"
        self.night = self.zone.open_night(self.night_date, mode)
        self.window = B.Window.for_night(
            self.night_date,
            None if full else state.last_night,
            full=full,
            lookback_days=self.options.lookback_days,
            points_start=self.options.points_start,
            whole_history=self.options.whole_history,
        )
        self.summary.run_id = self.night.run_id
        self.summary.mode = mode
        if full:
            self.summary.audit = "not run (full night)"
        self.summary.resumed = bool(self.night.resumed)
        self.summary.window = self.window.describe()
        self.client = ServiceClient.from_settings(self.settings, self._client_options())
        await self.client.__aenter__()
        self.progress.attach(lambda: self.client.stats)
        log.info(
            "night %s: %s run %s%s, window %s",
            self.night_date,
            mode,
            self.night.run_id,
            " (resuming)" if self.night.resumed else "",
            self.summary.window,
        )

    async def close(self) -> None:
        if self.client is not None:
            self._collect_stats()
            remember_rate(self.data_dir, self.client.rate.found, self.client.rate.unrefused)
            await self.client.aclose()
            self.client = None

    def _client_options(self) -> Any:
        """The client's options, starting from the rate a previous night found (if any)."""
        from membersync.extract.client import ClientOptions

        options = self.options.client_options or ClientOptions()
        if options.initial_rate is not None or options.start_rate is not None:
            return options
        remembered = remembered_rate(self.data_dir)
        if remembered is not None:
            log.info("starting at %.1f requests/s, the rate the server accepted last night", remembered)
            return replace(options, initial_rate=remembered)
        start = remembered_rate(self.data_dir, "start")
        if start is not None:
            log.info("slow-starting from %.1f requests/s, what the server took last night unrefused", start)
            return replace(options, start_rate=start)
        return options

    # -- steps ----------------------------------------------------------------------------------------

    async def land_config(self) -> int:
        """Fetch every configuration list (always: stores, timezones and packages drive the
        rest of the night); write them as batch "config" unless a resumed run already did."""
        self.progress.phase("configuration")
        typed, stores = await B.fetch_config(self.client)
        self.stores = stores
        self.tz = TimezoneLookup.from_stores(stores)
        self.storecodes = B.store_codes(stores)
        packages = typed.tables["sellable_packages"]
        self.affiliated = frozenset(
            packages.filter(packages["affiliated"].fill_null(False))["package_id"].to_pylist()
        )
        if CONFIG_BATCH not in self.night.done_batches():
            await asyncio.to_thread(
                self.night.write_batch, CONFIG_BATCH, typed.tables, typed.quarantine_table
            )
        return sum(typed.rows.values())

    async def discover(self) -> list[str]:
        """The night's clients and its pending batch ids.

        The discovery is saved with the batch size it was cut by, so a resumed run syncs
        exactly the clients its first run discovered, in the same batches, whatever the
        rerun's settings say; a staged batch is reused only if it holds exactly its planned
        clients, and any other staged batch is discarded (it would publish the wrong clients).
        """
        self.progress.phase("discovery")
        saved = self.night.saved_discovery()
        if saved is not None:
            discovery = B.summarize_discovery(saved.clients, self.previous_watermark)
            batch_size = saved.batch_size or self.options.batch_size
        else:
            discovery = await self._discover_afresh()
            batch_size = self.options.batch_size
            records = (c.wire() for c in discovery.clients)
            await asyncio.to_thread(self.night.remember_identity, discovery.identity)
            await asyncio.to_thread(self.night.save_discovery, records, batch_size)
        self._discovery = discovery
        await asyncio.to_thread(self.night.expect_clients, discovery.client_numbers)
        self.summary.clients = len(discovery.clients)
        self.summary.watermark = discovery.watermark
        # No client changed: one empty batch still records every client table (0 rows) for the night.
        planned = B.plan_batches(discovery.clients, batch_size) or [B.Batch("00000", ())]
        self.batches = {b.id: b for b in planned}
        reused = await asyncio.to_thread(self._reusable_batches)
        pending = [b.id for b in planned if b.id not in reused]
        self.summary.batches = len(planned)
        self.summary.batches_skipped = len(reused)
        done_clients = sum(len(self.batches[b].clients) for b in reused)
        self.progress.start_clients(len(discovery.clients), done_clients)
        log.info(
            "night %s: %d clients in %d batches of %d (%d already written)",
            self.night_date,
            len(discovery.clients),
            len(planned),
            batch_size,
            len(reused),
        )
        return pending

    async def _discover_afresh(self) -> B.Discovery:
        """Who changed since the watermark (everyone on a full night), with the audit's queue."""
        since = (
            None
            if self.summary.mode == "full"
            else B.modified_since(self.previous_watermark, self.options.watermark_overlap)
        )
        discovery = await B.discover(self.client, self.storecodes, since, self.previous_watermark)
        if since is None:  # a full night lists everyone anyway
            return discovery
        queue = await asyncio.to_thread(A.read_queue, self.data_dir)
        if not queue:
            return discovery
        links = await asyncio.to_thread(lambda: self.night.keys.links)
        numbers = {key: number for number, key in links.items()}
        return with_queued(discovery, A.queued_discovery(queue, numbers))

    def _reusable_batches(self) -> set[str]:
        """Staged batches that hold exactly their planned clients; every other one is discarded."""
        reusable = set()
        for batch_id in sorted(self.night.done_batches() - {CONFIG_BATCH}):
            batch = self.batches.get(batch_id)
            if batch is not None and self.night.batch_fits(batch_id, B.client_numbers(batch)):
                reusable.add(batch_id)
                continue
            log.warning(
                "night %s: staged batch %s does not fit tonight's plan; fetching again",
                self.night_date,
                batch_id,
            )
            self.night.discard_batch(batch_id)
        return reusable

    async def land_batch(self, batch_id: str) -> int:
        """Fetch, type and write one batch of clients; returns its client count."""
        batch = self.batches[batch_id]
        assert self.window is not None
        try:
            raw = await B.fetch_batch_raw(
                self.client, batch, self.window, self.affiliated, self.progress.advance
            )
        except B.BatchFailed as exc:  # named by key: the message reaches logs, notifications, Prefect
            raise exc.naming(lambda number: self.night.keys.assign([number])[number]) from None
        # Typing and Parquet writing in a thread: the loop keeps the other batch's requests going.
        await asyncio.to_thread(self._type_and_write, raw)
        return len(batch.clients)

    async def land_by_shards(self, pending: list[str]) -> int:
        """Fetch the pending batches through :attr:`fan_out` (shards elsewhere), staged here;
        returns their client count."""
        assert self.fan_out is not None
        await self.fan_out(self, pending)
        return sum(len(self.batches[b].clients) for b in pending)

    def _type_and_write(self, raw: B.RawBatch) -> None:
        typed = B.type_batch(raw, self.tz)
        self.night.write_batch(
            raw.batch.id, typed.tables, typed.quarantine_table, clients=B.client_numbers(raw.batch)
        )

    async def audit(self) -> list[str]:
        """The self-audit of an incremental night; returns the ids of extra batches to land now.

        Samples clients not synced tonight, compares their live state with the landing zone's,
        writes the audit's report (``state/audits/<night>.json``) and queues the clients that
        differed for a full re-sync; with ``heal=now`` they are synced tonight in extra batches.
        A full night syncs every client: nothing to audit.
        """
        if self.summary.mode == "full":
            self.summary.audit = "not run (full night)"
            return []
        self.progress.phase("self-audit")
        assert self._discovery is not None
        options = self.options.audit
        holdings = await asyncio.to_thread(A.read_holdings, self.zone)
        keys = holdings.keys
        tonight = {keys.get(n) for n in self._discovery.client_numbers}
        candidates = [k for k in holdings.known if k not in tonight]
        size = A.sample_size(len(holdings.known), len(candidates), options)
        sample = A.pick_sample(candidates, size, A.night_seed(self.night_date))
        window = self._audit_window()
        result = await A.audit_clients(
            self.client, self.data_dir, holdings, sample, self.tz, window, self.options.batch_size
        )
        await asyncio.to_thread(self._record_audit, result)
        heal = self._plan_heal(result) if options.heal == "now" else []
        self.summary.audit_counts["healed"] = len(self.healed)
        self.summary.audit = f"ok (heal: {options.heal})"
        log.info(
            "night %s: self-audit of %d clients: %d differed (%d keys), heal %s",
            self.night_date,
            len(sample),
            len(result.differed),
            result.keys,
            options.heal,
        )
        return heal

    def _audit_window(self) -> B.Window:
        # Whole histories: the landing's events of a client are the union of every night's.
        return B.Window.for_night(
            self.night_date,
            None,
            full=True,
            lookback_days=self.options.lookback_days,
            points_start=self.options.points_start,
        )

    def _record_audit(self, result: A.AuditResult) -> None:
        A.write_report(self.data_dir, result, self.night_date.isoformat())
        A.queue_for_resync(self.data_dir, result, self.night_date.isoformat())
        self.summary.audit_counts = result.counts()
        self.summary.audit_differed = result.differed

    def _plan_heal(self, result: A.AuditResult) -> list[str]:
        """Extra batches for the clients that differed; the commit then expects them too."""
        records = [result.records[n] for n in sorted(result.differed)]
        planned = [
            B.Batch(f"heal-{b.id}", b.clients) for b in B.plan_batches(records, self.options.batch_size)
        ]
        self.batches.update({b.id: b for b in planned})
        self.healed = [r.number for r in records]
        self.night.expect_clients(self.healed)
        self.summary.clients += len(records)
        self.summary.batches += len(planned)
        return [b.id for b in planned]

    async def commit(self) -> None:
        """Record the night as committed (the manifest is written last).

        The landing zone refuses to commit unless the staged batches hold exactly the
        discovered clients; the summary's counts are then read from what was committed.
        """
        self.progress.phase("commit")
        self._collect_stats()
        manifest = await asyncio.to_thread(
            self.night.commit,
            self.summary.watermark,
            self.summary.clients,
            self.summary.stats(),
            tenant=self.tenant,
        )
        self.summary.rows = {name: files.rows for name, files in manifest.tables.items()}
        self.summary.clients = manifest.clients_synced
        self.summary.quarantined = manifest.quarantine.rows
        self.summary.status = "committed"
        await asyncio.to_thread(self._forget_synced)

    def _forget_synced(self) -> None:
        """The re-sync queue forgets the clients this committed night synced (never earlier)."""
        synced = [*(self._discovery.client_numbers if self._discovery else ()), *self.healed]
        links = self.night.keys.links
        try:
            A.forget_synced(self.data_dir, [links[n] for n in synced if n in links])
        except OSError as exc:  # the night is committed; the queue only re-syncs them once more
            log.warning("night %s committed; could not update the re-sync queue: %s", self.night_date, exc)

    async def build(self) -> None:
        """Hand the committed night over to the warehouse build and the report export."""
        if not self.options.build:
            self.summary.build = "skipped (disabled)"
            return
        self.progress.phase("warehouse build")
        from membersync.warehouse.build.builder import build_warehouse
        from membersync.warehouse.exports import open_tables, postgres
        from membersync.warehouse.exports.reports import export_night
        from membersync.warehouse.landing.remote import refresh_mirror

        await asyncio.to_thread(refresh_mirror, self.data_dir)  # s3:// location: the committed files
        built = await asyncio.to_thread(build_warehouse, self.data_dir)
        await asyncio.to_thread(open_tables.publish_build, self.data_dir, built)
        exported = await asyncio.to_thread(
            export_night, self.data_dir, self.night_date, stores=self.options.store_reports
        )
        self.summary.reports = exported.published
        paths = exported.paths
        csvs = sum(1 for p in paths if p.suffix == ".csv" and p.parent.name == self.night_date.isoformat())
        stores = f", {len(exported.store_reports)} stores' own" if exported.store_reports else ""
        self.summary.build = f"ok ({csvs} reports, their workbook and the morning report{stores})"
        if self.options.store_notify is not None:
            await asyncio.to_thread(self.options.store_notify.send, self.night_date, exported.store_reports)
        # MEMBERSYNC_PUBLISH_URL, after the managers' files: a database down costs them nothing
        database = await asyncio.to_thread(postgres.publish_if_configured, self.data_dir)
        if database is not None and database.changed:
            self.summary.build += f"; PostgreSQL: {len(database.nights)} night(s) published"
        await asyncio.to_thread(self._apply_retention)

    def _apply_retention(self) -> None:
        """``MEMBERSYNC_RETENTION`` after the committed night (nothing when unset)."""
        policy = self.options.retention
        if policy is None or policy.keeps_everything:
            return
        from membersync.warehouse.lifecycle.retention import apply_retention

        outcome = apply_retention(self.zone, policy)
        self.summary.retention = (
            f"{policy}: {len(outcome.removed)} night(s) removed, {outcome.forgotten} client(s) forgotten"
        )

    def _collect_stats(self) -> None:
        self.summary.duration_s = time.perf_counter() - self._started
        self.summary.cpu_s = time.process_time() - self._cpu_started
        if self.client is not None:
            stats = self.client.stats
            for name, count in request_counts(stats).items():  # a sharded night: its shards' too
                setattr(self.summary, name, count + self.shard_stats.get(name, 0))
            self.summary.by_status = add_counts(status_counts(stats), self.shard_statuses)


def remembered_rate(data_dir: DataDir, key: str = "rate") -> float | None:
    """What a previous night kept in ``state/rate.json``, or None: the server's rate it found
    (``rate``), or, meeting no 429, what the server took from it over a window (``start``)."""
    try:
        body = json.loads(data_dir.rate_file.read_text(encoding="utf-8"))
        rate = float(body[key])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return rate if rate > 0 and rate != float("inf") else None


def remember_rate(data_dir: DataDir, rate: float | None, start: float | None = None) -> None:
    """Keep the server's rate this night found, so the next night starts at it (no probing); or,
    none found, what it took unrefused, so the next night's slow start begins there (a short
    night slow-starting from the floor each time spent most of its seconds paced below it)."""
    if rate is None and start is None:
        return
    kept = {"rate": round(rate, 3)} if rate is not None else {"start": round(start or 0.0, 3)}
    body = {**kept, "found_at": f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H:%M:%SZ}"}
    try:
        write_json_atomic(data_dir.rate_file, body)
    except OSError as exc:  # a lost hint costs the next night some probing, nothing else
        log.warning("could not remember the rate in %s: %s", data_dir.rate_file, exc)


class BuildFailed(RuntimeError):
    """The night is committed (its data is safe), but the warehouse build or export failed."""


# How drive() runs each step: a step is one of NightRun's step methods, named; the runner calls
# it directly (:func:`direct_steps`) or as a Prefect task run (prefect_flow.task_steps).
StepRunner = Callable[..., Awaitable[Any]]


def direct_steps(run: NightRun) -> StepRunner:
    """Run each step as a plain method call of ``run``."""

    async def step(name: str, *args: Any) -> Any:
        return await getattr(run, name)(*args)

    return step


async def _land_clients(run: NightRun, step: StepRunner, pending: list[str]) -> None:
    """The discovered batches (``batches_in_flight`` at a time, or through the shards), then the
    self-audit (incremental nights), whose heal=now batches land before the commit too."""
    slots = asyncio.Semaphore(run.options.batches_in_flight)

    async def one(batch_id: str) -> None:
        async with slots:
            await step("land_batch", batch_id)

    run.progress.phase("clients")
    if run.fan_out is not None and pending:
        await step("land_by_shards", pending)
    else:
        async with asyncio.TaskGroup() as group:
            for batch_id in pending:
                group.create_task(one(batch_id))
    healing = await step("audit") if run.summary.mode == "incremental" else []
    async with asyncio.TaskGroup() as group:
        for batch_id in healing:
            group.create_task(one(batch_id))


async def drive(run: NightRun, step: StepRunner) -> RunSummary:
    """The night's steps in order; batches ``batches_in_flight`` at a time. The caller holds the lock.

    The first failing batch cancels the others (a TaskGroup) and fails the night; what was
    written stays in staging, and the next run of the same night resumes from there.
    """
    gc_thresholds = nightgc.tune()  # a night allocates per request: fewer, larger young collections
    try:
        run.claim_data_dir()
        run.upkeep()
        await run.open()
        await step("land_config")
        await _land_clients(run, step, await step("discover"))
        await step("commit")
    except BaseException as exc:
        run.summary.status = "failed"
        run.summary.error = one_line(exc)
        raise
    finally:
        nightgc.restore(gc_thresholds)
        run.progress.close()
        await run.close()
    try:
        await step("build")
    except Exception as exc:
        run.summary.build = f"failed: {one_line(exc)}"
        raise BuildFailed(
            f"night {run.night_date} is committed, but the warehouse build failed: {one_line(exc)}"
        ) from exc
    finally:
        run._collect_stats()
    return run.summary


def one_line(exc: BaseException) -> str:
    """An error as one line (the first real error of exception groups): for a terminal, a
    summary, a notification."""
    text = str(unwrap(exc)).strip()
    return text.splitlines()[0] if text else type(unwrap(exc)).__name__


def unwrap(exc: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups from the TaskGroup."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


async def arun_night(
    settings: ServiceSettings,
    data_dir: DataDir,
    night: dt.date,
    *,
    full: bool = False,
    options: SyncOptions | None = None,
    progress: Progress | None = None,
) -> RunSummary:
    """:func:`run_night` for callers already on an event loop."""
    with holding_lock(data_dir) as zone:
        run = NightRun(settings, data_dir, night, full=full, options=options, progress=progress, zone=zone)
        try:
            return await drive(run, direct_steps(run))
        except BaseExceptionGroup as group:
            raise unwrap(group) from None


def run_night(
    settings: ServiceSettings,
    data_dir: DataDir,
    night: dt.date,
    *,
    full: bool = False,
    options: SyncOptions | None = None,
    progress: Progress | None = None,
) -> RunSummary:
    """Sync one night without Prefect. Raises on failure (nothing is committed then).

    Takes the data dir's lock (``AlreadyRunning`` if another sync holds it), resumes an
    interrupted run of the same night, commits, then builds the warehouse (unless
    ``options.build`` is off).
    """
    return asyncio.run(arun_night(settings, data_dir, night, full=full, options=options, progress=progress))


# --- what the Prefect flow (membersync.flows.night.prefect_flow) needs from here -------------------------
# Importing Prefect takes seconds: `membersync sync` checks settings, the lock and the service
# before it pays that, so this module never imports it.

# Runs of this process, by key: how Prefect tasks reach their NightRun (and its client, which
# holds the credentials) without either becoming a task parameter. Prefect forces this one
# global: a task's parameters are recorded by its server, so the run itself cannot be one.
RUNS: dict[str, NightRun] = {}

# Prefect defaults for a batch job on a busy machine, unless the user set them: the ephemeral
# server gets longer to start (its default, 20 s, is not enough on a loaded 2-core machine) and
# sends no telemetry (a sync talks to the service and nothing else).
PREFECT_ENV_DEFAULTS = {
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
}


def prepare_prefect_env() -> None:
    """Apply :data:`PREFECT_ENV_DEFAULTS` to the environment; call before importing Prefect."""
    for key, value in PREFECT_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)


def with_queued(discovery: B.Discovery, queued: list[B.ClientRef]) -> B.Discovery:
    """Tonight's discovery plus the clients the self-audit queued for a re-sync (sorted, unique).

    The watermark stays the discovered one: a queued client was not found by ``modifiedSince``.
    """
    if not queued:
        return discovery
    by_number = {c.number: c for c in queued}
    by_number.update({c.number: c for c in discovery.clients})
    return B.Discovery([by_number[n] for n in sorted(by_number)], discovery.watermark)


def summary_from_flow_result(result: Mapping[str, Any]) -> RunSummary:
    """Rebuild a :class:`RunSummary` from the flow's returned dict."""
    data = dict(result)
    data.pop("requests_per_s", None)
    data["night"] = dt.date.fromisoformat(data["night"])
    return replace(RunSummary(night=data["night"]), **data)
