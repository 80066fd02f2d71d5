"""A large tenant's night, fetched by shards on a work pool, committed once.

The night's own run (:class:`~membersync.flows.night.nightly.NightRun`, on one worker, holding the data
dir's lock) opens the night, fetches the configuration and discovers the clients as always. With
``shards = N`` in the tenants file, its pending batches are then cut into N contiguous ranges of
clients, the plan is written to the shard area (:mod:`membersync.warehouse.landing.shard_area`) and each
range is fetched by a **shard**: a run of the tenant's shard deployment, on any worker of the
pool (:func:`fan_out`, through ``launch``: Prefect's ``run_deployment``). Every shard's requests
take the tenant's shared rate-limit slots, so the shards together hold the tenant's limit.

A shard that fails, crashes or is lost with its worker (a killed worker's run stops sending
heartbeats and Prefect's automation marks it ``Crashed``; see ``flows/pool/tenant_flow.py``) is
launched again, up to :data:`SHARD_ATTEMPTS` times: the batches it had finished (their markers
are in the area) are kept, the others fetched again. Then the run copies every batch into its
staging, checked against the planned clients, and the night goes on as usual (self-audit,
**one** commit, build): a night fetched by shards commits exactly like one fetched in one process.

The pieces without Prefect (:func:`plan_for`, :func:`land_shard`, :func:`collect`) are plain
functions; ``tests/scenarios/test_shards.py`` runs them on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from typing import Any

from membersync.extract.settings import ServiceSettings
from membersync.flows.night import batches as B
from membersync.models.coerce import TimezoneLookup
from membersync.warehouse.landing.shard_area import (
    ShardArea,
    ShardPlan,
    assign,
    request_counts,
    status_counts,
)

log = logging.getLogger(__name__)

SHARD_ATTEMPTS = 3  # launches of one shard before the night fails
PROGRESS_POLL = 5.0  # seconds between looks at the shard area while a shard runs
SHARD_BEAT = 5.0  # seconds between a running shard's beats (its proof of life in the area)

# Before its run starts (a worker took it and its process runs), a launch may wait this many
# times the stall for a worker: runs queue when workers are busy, or their server is slow.
START_PATIENCE = 3

# launch(plan, shard, started) -> whether the shard's run completed (False: failed, crashed,
# cancelled); the launcher sets ``started`` once its run is running.
Launch = Callable[[ShardPlan, int, asyncio.Event], Coroutine[Any, Any, bool]]


class ShardFailed(RuntimeError):
    """A shard did not complete after :data:`SHARD_ATTEMPTS` launches (the night is not committed;
    its staged batches and the shard area are kept, and a rerun resumes)."""


def plan_for(run: Any, pending: list[str], shards: int) -> ShardPlan:
    """The plan of a night's pending batches over ``shards`` shards (``run``: a NightRun after discovery)."""
    assert run.window is not None
    return ShardPlan(
        tenant=run.settings.tenant,
        night=run.night_date,
        run_id=run.night.run_id,
        window={k: (v.isoformat() if v is not None else None) for k, v in asdict(run.window).items()},
        stores=list(run.stores),
        affiliated=sorted(run.affiliated),
        batches={b: [c.wire() for c in run.batches[b].clients] for b in pending},
        shard_of=assign(pending, shards),
    )


def window_of(plan: ShardPlan) -> B.Window:
    import datetime as dt

    def day(key: str) -> dt.date | None:
        value = plan.window.get(key)
        return dt.date.fromisoformat(value) if value else None

    points_start, end = day("points_start"), day("end")
    assert points_start is not None and end is not None
    return B.Window(points_start=points_start, end=end, history_start=day("history_start"))


async def fan_out(run: Any, pending: list[str], shards: int, launch: Launch, stall: float) -> None:
    """Fetch ``pending`` batches through shards, then stage them in ``run``'s night.

    A running shard beats in the area every :data:`SHARD_BEAT` s. A launch whose run shows no
    life (no beat, no finished batch) for ``stall`` seconds once it runs, or that does not start
    within :data:`START_PATIENCE` x ``stall``, is given up (its launch is cancelled: the launcher
    marks its run ``Crashed``) and launched again: a run lost before it started is not waited on
    forever. A run Prefect calls ended while its shard still beats is waited for."""
    area = ShardArea(run.data_dir, run.night_date, run.night.run_id)
    plan = plan_for(run, pending, shards)
    await asyncio.to_thread(area.write_plan, plan)
    log.info(
        "night %s: %d batches over %d shards (%s)", run.night_date, len(pending), len(plan.shards), area.where
    )
    watch = _ShardWatch(run, plan, area, launch, stall)
    async with asyncio.TaskGroup() as group:
        for shard in plan.shards:
            group.create_task(watch.until_done(shard))
    await asyncio.to_thread(collect, run, plan, area)
    run.shard_stats, run.shard_statuses = await asyncio.to_thread(area.launch_totals)
    await asyncio.to_thread(area.remove)


@dataclass
class _ShardWatch:
    """The night's side of its shards: each launched, watched through the area, launched again
    until its batches are all there (at most :data:`SHARD_ATTEMPTS` launches)."""

    run: Any
    plan: ShardPlan
    area: ShardArea
    launch: Launch
    stall: float
    attempts: dict[int, int] = field(init=False)

    def __post_init__(self) -> None:
        self.attempts = dict.fromkeys(self.plan.shards, 0)

    async def until_done(self, shard: int) -> None:
        while True:
            done = await asyncio.to_thread(self.area.done_batches)
            if set(self.plan.batches_of(shard)) <= done:
                return
            if self.attempts[shard] >= SHARD_ATTEMPTS:
                raise ShardFailed(
                    f"night {self.run.night_date}: shard {shard} did not complete after "
                    f"{self.attempts[shard]} launches; its finished batches are kept, "
                    "rerun the night to resume"
                )
            self.attempts[shard] += 1
            completed = await self.watched(shard)
            if not completed:
                log.warning(
                    "night %s: shard %d (launch %d) did not complete",
                    self.run.night_date,
                    shard,
                    self.attempts[shard],
                )

    async def progress(self, shard: int) -> tuple[int, int]:
        """The shard's signs of life: (its batches in the area, its beats)."""
        done = len(set(self.plan.batches_of(shard)) & await asyncio.to_thread(self.area.done_batches))
        return done, await asyncio.to_thread(self.area.beats, shard)

    async def watched(self, shard: int) -> bool:
        """One launch of ``shard``, until its run ends or shows no life: whether it completed."""
        started = asyncio.Event()
        launched: asyncio.Task[bool] = asyncio.create_task(self.launch(self.plan, shard, started))
        seen, since, running = await self.progress(shard), time.monotonic(), False
        while True:
            if launched.done():
                await asyncio.sleep(PROGRESS_POLL)
            else:
                await asyncio.wait({launched}, timeout=PROGRESS_POLL)
            now_seen = await self.progress(shard)
            if now_seen != seen or (started.is_set() and not running):
                seen, since, running = now_seen, time.monotonic(), started.is_set()
            quiet = time.monotonic() - since
            if launched.done():
                if launched.result():
                    return True
                # Prefect says the run ended, but its shard still beats (a busy server lost its
                # heartbeats and a zombie rule marked it Crashed): wait for it rather than
                # fetch its batches twice at once.
                if quiet < 3 * SHARD_BEAT:
                    continue
                return False
            limit = self.stall if running else START_PATIENCE * self.stall
            if quiet > limit:
                night, what = self.run.night_date, "showed no life" if running else "did not start"
                log.warning("night %s: shard %d %s for %.0f s; given up", night, shard, what, limit)
                launched.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await launched
                return False


def collect(run: Any, plan: ShardPlan, area: ShardArea) -> None:
    """Copy every planned batch from the area into the night's staging (clients checked)."""
    for batch_id in sorted(plan.batches):
        clients = B.client_numbers(run.batches[batch_id])
        if not area.batch_fits(batch_id, clients):
            raise ShardFailed(
                f"night {run.night_date}: shard batch {batch_id} does not hold its planned clients"
            )
        tables, quarantine = area.read_batch(batch_id)
        run.night.write_batch(batch_id, tables, quarantine, clients=clients)
        run.progress.advance(len(clients))


async def land_shard(
    settings: ServiceSettings,
    plan_area: ShardArea,
    shard: int,
    client_options: Any = None,
    batches_in_flight: int = 2,
) -> dict[str, int]:
    """One shard: fetch its batches not yet in the area, write each there. Returns counts only."""
    from membersync.extract.client import ServiceClient

    plan = await asyncio.to_thread(plan_area.read_plan)
    mine = plan.batches_of(shard)
    done = await asyncio.to_thread(plan_area.done_batches)
    todo = [b for b in mine if b not in done]
    launch = _ShardLaunch(plan_area, shard, plan, batches_in_flight)
    async with ServiceClient.from_settings(settings, client_options) as client:
        await launch.fetch(client, todo)
        requests = int(client.stats.requests)
    log.info(
        "night %s shard %d: %d batches fetched, %d kept from an earlier launch, %d requests",
        plan.night,
        shard,
        len(todo),
        len(mine) - len(todo),
        requests,
    )
    return {"batches": len(todo), "kept": len(mine) - len(todo), "requests": requests}


class _ShardLaunch:
    """One launch of a shard (a worker's run): its batches fetched ``batches_in_flight`` at a
    time and each written to the area, with the launch's request counts as its beats."""

    def __init__(self, area: ShardArea, shard: int, plan: ShardPlan, batches_in_flight: int) -> None:
        self.area, self.shard, self.plan = area, shard, plan
        self.tz = TimezoneLookup.from_stores(plan.stores)
        self.window = window_of(plan)
        self.affiliated = frozenset(plan.affiliated)
        self.slots = asyncio.Semaphore(batches_in_flight)
        self.launch = uuid.uuid4().hex[:12]  # a launch's counts are its own: a relaunch adds, not replaces
        self.beat = 0

    async def fetch(self, client: Any, todo: list[str]) -> None:
        beater = asyncio.create_task(self.beating(client))
        try:
            async with asyncio.TaskGroup() as group:
                for batch_id in todo:
                    group.create_task(self.one(client, batch_id))
        finally:
            beater.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beater
        await self.record(client)

    async def record(self, client: Any) -> None:
        self.beat += 1
        totals, statuses = request_counts(client.stats), status_counts(client.stats)
        await asyncio.to_thread(
            self.area.write_launch_stats, self.shard, self.launch, self.beat, totals, statuses
        )

    async def beating(self, client: Any) -> None:
        """Proof of life for the night's watchdog, every SHARD_BEAT s."""
        while True:
            await self.record(client)
            await asyncio.sleep(SHARD_BEAT)

    async def one(self, client: Any, batch_id: str) -> None:
        batch = B.Batch(batch_id, tuple(map(B.ClientRef.of, self.plan.batches[batch_id])))
        async with self.slots:  # as NightRun's batches: a slot is held until the batch is written
            raw = await B.fetch_batch_raw(client, batch, self.window, self.affiliated)
            typed = await asyncio.to_thread(B.type_batch, raw, self.tz)
            clients = B.client_numbers(batch)
            await asyncio.to_thread(
                self.area.write_batch, batch_id, typed.tables, typed.quarantine_table, clients
            )
            await self.record(client)
