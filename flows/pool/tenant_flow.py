"""Many tenants on a Prefect work pool: ``membersync deploy`` and the flow each deployment runs.

``membersync deploy TENANTS_FILE [--pool NAME]`` registers, on the Prefect server named by
``PREFECT_API_URL``, a **process** work pool (created if missing) and one deployment of
:func:`tenant_night` per tenant: the deployment's name is the tenant's name, its schedule the
tenant's cron and timezone, its only parameters the tenant's name (and ``night``/``full``), its
tags ``membersync`` and ``tenant:<name>``. The deployment's job variables carry the tenants
file's path (``MEMBERSYNC_TENANTS_FILE``), never a credential. ``prefect worker start --pool
NAME`` on any machine with membersync installed runs them (the entrypoint is the installed
module ``membersync.flows.pool.tenant_flow:tenant_night``, so no code storage is needed).

On the worker, :func:`tenant_night` reads the tenants file, sets the tenant's ``MEMBERSYNC_*``
settings (credentials read from the environment variables the file names, on the worker, or
from the tenant's Prefect Secret block) and runs the ordinary night. Each tenant's night is its
own flow run: one failing never blocks another.

**One rate limit per tenant, shared by every worker.** A tenant with a known ``rate`` gets a
Prefect global concurrency limit ``membersync-rate-<tenant>`` whose slots decay at ``rate`` per
second (a token bucket held by the Prefect server). Every request of a **sharded** night (the
night's own run and its shards, retries too) first takes a slot through :class:`SharedRateGate`,
which takes them from the server in chunks (:func:`chunk_for`: about four API calls per second
per tenant, whatever its rate), so N workers calling the same tenant together stay under its
rate. The client's own pacing (``MEMBERSYNC_RATE`` = the rate) still spaces each process's
requests evenly; an unsharded night is one process at a time and needs nothing more
(:func:`tenant_options`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from membersync.extract.settings import Settings, SettingsError, env_name
from membersync.flows.console import error
from membersync.flows.pool.tenants import Tenant, TenantsFileError, load_tenants
from membersync.warehouse.landing.shard_area import ShardPlan
from prefect import flow

log = logging.getLogger(__name__)

TENANTS_FILE_ENV = env_name("tenants_file")
DEFAULT_POOL = "membersync"
FLOW_NAME = "membersync-tenant-night"
ENTRYPOINT = "membersync.flows.pool.tenant_flow:tenant_night"
SHARD_FLOW_NAME = "membersync-tenant-shard"
SHARD_QUEUE = "shards"  # the pool's work queue of shard runs (a worker may poll it alone)
RATE_LIMIT_PREFIX = "membersync-rate-"
# The tenant settings a night takes from the tenants file; a worker's own values are dropped.
_TENANT_KEYS = tuple(
    env_name(n) for n in ("base_url", "username", "password", "data_dir", "profile", "rate", "tenant")
)
# Slots taken per call to the Prefect server: about this many calls per second per tenant.
ACQUISITIONS_PER_SECOND = 4
MAX_CHUNK = 50


def rate_limit_name(tenant: str) -> str:
    return f"{RATE_LIMIT_PREFIX}{tenant}"


def chunk_for(rate: float) -> int:
    """Slots taken per call to the Prefect server for a tenant limited to ``rate`` req/s."""
    return max(1, min(MAX_CHUNK, int(rate / ACQUISITIONS_PER_SECOND)))


def bucket_size(rate: float) -> int:
    """The global limit's capacity: two chunks (a worker may hold one while another is taken)."""
    return max(2, 2 * chunk_for(rate))


class SharedRateGate:
    """Awaited before each request (``ClientOptions.gate``): one slot of a shared rate limit.

    Slots are taken from the Prefect server ``chunk`` at a time and spent locally, so the cost
    is one API call per ``chunk`` requests. ``acquire`` takes ``n`` slots (default: Prefect's
    ``rate_limit`` on the named global limit, strict: a missing limit fails the night rather
    than running unlimited).
    """

    def __init__(
        self, name: str, chunk: int, acquire: Callable[[int], Awaitable[None]] | None = None
    ) -> None:
        if chunk < 1:
            raise ValueError("chunk must be >= 1")
        self.name = name
        self.chunk = chunk
        self._acquire = acquire or self._prefect_acquire
        self._tokens = 0
        self._lock = asyncio.Lock()
        self.acquisitions = 0  # calls to the server

    async def _prefect_acquire(self, slots: int) -> None:
        from prefect.concurrency.asyncio import rate_limit

        await rate_limit(self.name, occupy=slots, strict=True)

    async def __call__(self) -> None:
        if self._tokens > 0:
            self._tokens -= 1
            return
        async with self._lock:
            if self._tokens <= 0:
                await self._acquire(self.chunk)
                self.acquisitions += 1
                self._tokens += self.chunk
            self._tokens -= 1


# --- on the worker: one tenant's night ------------------------------------------------------------


def find_tenant(name: str, config: Settings) -> Tenant:
    """The tenant ``name`` of the tenants file named by ``MEMBERSYNC_TENANTS_FILE``."""
    path = config.tenants_file
    if not path:
        raise SettingsError(f"missing setting {TENANTS_FILE_ENV} (the deployment's job variables set it)")
    for tenant in load_tenants(path):
        if tenant.name == name:
            return tenant
    raise SettingsError(f"tenants file {path}: no tenant {name!r}")


async def tenant_env(tenant: Tenant, environ: Mapping[str, str], config: Settings) -> dict[str, str]:
    """The tenant's ``MEMBERSYNC_*`` settings, credentials resolved here (on the worker) from the
    variables the tenants file names (``environ``) or its Secret block."""
    env = tenant.night_env(environ)
    if tenant.credentials_block is not None:
        from prefect.blocks.system import Secret

        block: Any = await Secret.aload(tenant.credentials_block)
        value = block.get()
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = json.loads(value)
        if not (isinstance(value, dict) and value.get("username") and value.get("password")):
            raise SettingsError(
                f"tenant {tenant.name}: Secret block {tenant.credentials_block} must hold "
                '{"username": ..., "password": ...}'
            )
        env["MEMBERSYNC_USERNAME"] = str(value["username"])
        env["MEMBERSYNC_PASSWORD"] = str(value["password"])
    if config.cache_dir:  # one working dir per tenant under a worker-wide cache dir
        env[env_name("cache_dir")] = str(Path(config.cache_dir) / tenant.name)
    return env


@contextlib.contextmanager
def tenant_environment(env: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with the tenant's settings (and no other tenant's), restored on exit."""
    keys = set(_TENANT_KEYS) | set(env) | {env_name("cache_dir")}
    saved = {k: os.environ.get(k) for k in keys}
    for key in _TENANT_KEYS:
        os.environ.pop(key, None)
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def tenant_options(found: Tenant, config: Settings, shared: bool) -> tuple[Any, SharedRateGate | None]:
    """The night's options from ``config``; with ``shared`` (several processes call the tenant: a
    sharded night) and a known rate, the tenant's shared rate-limit gate too.

    An unsharded night is one process at a time (its deployment's concurrency limit is 1, its
    data location's lock agrees): its own pacing at ``MEMBERSYNC_RATE`` = the tenant's rate holds
    the limit exactly, and a shared gate would only cost it (measured: 6 tenants at 100 req/s
    through Prefect's slots served ~27 req/s each)."""
    from membersync.extract.client import ClientOptions
    from membersync.flows.night.options import SyncOptions

    options = SyncOptions.from_settings(config)
    if found.rate is None or not shared:
        return options, None
    gate = SharedRateGate(rate_limit_name(found.name), chunk_for(found.rate))
    client_options = replace(options.client_options or ClientOptions(), gate=gate)
    return replace(options, client_options=client_options), gate


async def launch_shard(tenant: str, plan: ShardPlan, shard: int, started: asyncio.Event) -> bool:
    """Run shard ``shard`` of ``plan`` as a run of the tenant's shard deployment (any worker of
    the pool) and wait for it, setting ``started`` once it runs; whether it completed. Cancelled
    (the night gave the shard up), it marks the run ``Crashed`` so that the UI says what happened
    and no worker starts it late."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import arun_deployment

    flow_run = await arun_deployment(
        f"{SHARD_FLOW_NAME}/{tenant}",
        parameters={"tenant": tenant, "night": plan.night.isoformat(), "run_id": plan.run_id, "shard": shard},
        timeout=0,
    )

    def seen(runs: dict[Any, Any]) -> None:
        state = runs[flow_run.id].state
        if state is not None and (state.is_running() or state.is_final()):
            started.set()

    async with get_client() as client:
        try:
            flow_run = (await wait_final(client, [flow_run.id], on_read=seen))[flow_run.id]
        except asyncio.CancelledError:
            await _mark_given_up(client, flow_run.id, f"{tenant} shard {shard}")
            raise
    state = flow_run.state
    log.info("tenant %s: shard %d run %s ended %s", tenant, shard, flow_run.name, state.type.value)
    return bool(state.is_completed())


MARK_PATIENCE = 60.0  # seconds to keep trying to mark a given-up shard run Crashed
MARK_RETRY = 2.0  # seconds between tries


async def _mark_given_up(client: Any, flow_run_id: Any, what: str) -> None:
    """Mark a given-up shard run ``Crashed``, until the server shows a final state for it (a busy
    server may refuse, or answer and not keep it, for a while): a run left ``Running`` in the UI
    with no process behind it would say the night is not over. Gives up after
    :data:`MARK_PATIENCE` seconds with a warning: the night's own outcome comes first."""
    from prefect.states import Crashed

    deadline = time.monotonic() + MARK_PATIENCE
    problem = "no final state"
    while time.monotonic() < deadline:
        try:
            await client.set_flow_run_state(
                flow_run_id, Crashed(message="the night gave this shard up (no progress)"), force=True
            )
            state = (await client.read_flow_run(flow_run_id)).state
            if state is not None and state.is_final():
                return
        except Exception as exc:  # the server's trouble must not hide the shard's own outcome
            problem = type(exc).__name__
        await asyncio.sleep(MARK_RETRY)
    log.warning("%s: could not mark the given-up run Crashed in %g s (%s)", what, MARK_PATIENCE, problem)


async def wait_final(
    client: Any,
    ids: list[Any],
    timeout: float | None = None,
    on_read: Callable[[dict[Any, Any]], None] | None = None,
) -> dict[Any, Any]:
    """The flow runs ``ids`` (id -> run) once all are in a final state, read every 2 s through
    ``client`` (Prefect's; ``on_read`` sees each reading); after ``timeout`` seconds, as they stand."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        runs = {i: await client.read_flow_run(i) for i in ids}
        if on_read is not None:
            on_read(runs)
        if all(r.state is not None and r.state.is_final() for r in runs.values()):
            return runs
        if deadline is not None and time.monotonic() > deadline:
            return runs
        await asyncio.sleep(2)


def resume_command(tenant: str, night: dt.date, full: bool = False) -> str:
    """The command that runs a tenant's ``night`` again (it resumes where a failed run stopped)."""
    command = f"prefect deployment run '{FLOW_NAME}/{tenant}' --param night={night.isoformat()}"
    return command + (" --param full=true" if full else "")


@flow(name=FLOW_NAME, flow_run_name="{tenant}", persist_result=False, log_prints=False)
async def tenant_night(tenant: str, night: dt.date | None = None, full: bool = False) -> dict[str, Any]:
    """One night of one tenant of the tenants file (``MEMBERSYNC_TENANTS_FILE``).

    Only the tenant's *name* is a parameter; its service, credentials (by the environment
    variable names or the Secret block the file gives) and data location are resolved here.
    A tenant with ``shards = N`` fetches its batches through N runs of its shard deployment
    (:func:`tenant_shard`, :mod:`membersync.flows.night.shards`) and commits once, here.
    """
    from membersync.flows.night.context import NightContext
    from membersync.flows.night.nightly import prepare_prefect_env
    from membersync.flows.night.prefect_flow import run_night_in_flow
    from membersync.flows.night.shards import fan_out

    prepare_prefect_env()
    worker = Settings.load()
    found = find_tenant(tenant, worker)
    env = await tenant_env(found, os.environ, worker)
    with tenant_environment(env):
        config = Settings.load()  # the worker's settings with the tenant's over them
        options, gate = tenant_options(found, config, shared=found.shards > 1)
        sharded = None
        if found.shards > 1:

            async def sharded(run: Any, pending: list[str]) -> None:
                stall = config.shard_stall_seconds
                await fan_out(run, pending, found.shards, partial(launch_shard, found.name), stall)

        log.info(
            "tenant %s: night %s; shared rate limit %s; %s",
            found.name,
            night or "today",
            f"{rate_limit_name(found.name)} ({found.rate:g} req/s)" if found.rate else "none",
            f"{found.shards} shards" if found.shards > 1 else "not sharded",
        )
        try:
            night = night or dt.date.today()
            resume = resume_command(found.name, night, full)
            return await run_night_in_flow(night, full, NightContext.load(config, options), sharded, resume)
        finally:
            if gate is not None:
                log.info("tenant %s: %d slot acquisitions of %d", found.name, gate.acquisitions, gate.chunk)


@flow(
    name=SHARD_FLOW_NAME,
    flow_run_name="{tenant}-shard-{shard}",
    persist_result=False,
    log_prints=False,
)
async def tenant_shard(tenant: str, night: dt.date, run_id: str, shard: int) -> dict[str, int]:
    """One shard of a large tenant's night: fetch its batches of the plan the night's run wrote
    (run ``run_id``) into the shard area. Parameters carry names and ids only."""
    from membersync.extract.settings import ServiceSettings
    from membersync.flows.night.nightly import prepare_prefect_env
    from membersync.flows.night.shards import land_shard
    from membersync.warehouse.landing.paths import DataDir
    from membersync.warehouse.landing.shard_area import ShardArea

    prepare_prefect_env()
    worker = Settings.load()
    found = find_tenant(tenant, worker)
    env = await tenant_env(found, os.environ, worker)
    with tenant_environment(env):
        config = Settings.load()
        options, _ = tenant_options(found, config, shared=True)
        area = ShardArea(DataDir.from_settings(config), night, run_id)
        return await land_shard(
            ServiceSettings.from_settings(config),
            area,
            shard,
            options.client_options,
            options.batches_in_flight,
        )


# --- membersync deploy ----------------------------------------------------------------------------

HEARTBEAT_SECONDS = 30  # Prefect's least
ZOMBIE_AFTER = dt.timedelta(seconds=75)  # no heartbeat for this long: the run is Crashed
ZOMBIE_AUTOMATION = "membersync: crash runs whose heartbeats stopped"


async def ensure_zombie_automation() -> str:
    """Prefect's documented zombie-run automation (detect-zombie-flows), for membersync's flows.

    A run of a tenant's night or shard that stops sending heartbeats for :data:`ZOMBIE_AFTER`
    is marked ``Crashed``; so is one that went ``Pending`` (a worker took it) and never sent its
    first heartbeat (the worker died while starting it). Limited to membersync's two flows: a
    run of another flow on the same server may send no heartbeats at all. Created, or brought
    up to date, by every ``deploy``.
    """
    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    trigger = EventTrigger(
        after={"prefect.flow-run.heartbeat", "prefect.flow-run.Pending"},
        expect={
            "prefect.flow-run.heartbeat",
            "prefect.flow-run.Completed",
            "prefect.flow-run.Failed",
            "prefect.flow-run.Cancelled",
            "prefect.flow-run.Crashed",
        },
        match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
        match_related=ResourceSpecification(
            {"prefect.resource.role": "flow", "prefect.resource.name": [FLOW_NAME, SHARD_FLOW_NAME]}
        ),
        for_each={"prefect.resource.id"},
        posture=Posture.Proactive,
        threshold=1,
        within=ZOMBIE_AFTER,
    )
    crash = ChangeFlowRunState(
        name=None,
        state=StateType.CRASHED,
        message=f"no heartbeat for {ZOMBIE_AFTER.seconds} s (its worker is gone)",
        force=False,
    )
    rule = f"no heartbeat for {ZOMBIE_AFTER.seconds} s: Crashed"
    try:
        existing = await Automation.aread(name=ZOMBIE_AUTOMATION)
    except ValueError:
        await Automation(name=ZOMBIE_AUTOMATION, trigger=trigger, actions=[crash]).acreate()
        return f"automation {ZOMBIE_AUTOMATION!r}: created ({rule})"
    existing.trigger, existing.actions, existing.enabled = trigger, [crash], True
    await existing.aupdate()
    return f"automation {ZOMBIE_AUTOMATION!r}: updated ({rule})"


async def deploy_tenants(tenants_file: Path, tenants: list[Tenant], pool: str) -> list[str]:
    """Create the pool if missing, the tenants' rate limits, one deployment per tenant.

    Returns one line per thing done. Needs ``PREFECT_API_URL`` (and ``PREFECT_API_AUTH_STRING``
    when the server requires basic auth)."""
    from prefect.client.orchestration import get_client

    done = []
    async with get_client() as client:
        done.append(await _ensure_work_pool(client, pool))
        for tenant in tenants:
            if tenant.rate is not None:
                done.append(await _ensure_rate_limit(client, tenant.name, tenant.rate))
    # Runs send heartbeats; the automation marks a run whose heartbeats stopped (its worker was
    # killed, its machine lost) Crashed, so a night waiting on a shard launches it again.
    env = {TENANTS_FILE_ENV: str(tenants_file), "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_SECONDS)}
    done.append(await ensure_zombie_automation())
    for tenant in tenants:
        done.append(await _deploy_night(tenant, env, pool))
        if tenant.shards > 1:
            done.append(await _deploy_shard(tenant, env, pool))
    return done


async def _ensure_work_pool(client: Any, pool: str) -> str:
    """The work pool, created (a process pool) only if missing: an existing one is left as set up."""
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    try:
        await client.read_work_pool(pool)
        return f"work pool {pool}: exists"
    except ObjectNotFound:
        await client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        return f"work pool {pool}: created (process)"


async def _ensure_rate_limit(client: Any, tenant: str, rate: float) -> str:
    """The tenant's global concurrency limit used as a token bucket: ``rate`` slots decay per
    second, so the tenant's nights and shards together never ask faster than the service allows."""
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
    from prefect.exceptions import ObjectNotFound

    name = rate_limit_name(tenant)
    size = bucket_size(rate)
    try:
        await client.read_global_concurrency_limit_by_name(name)
        await client.update_global_concurrency_limit(
            name,
            GlobalConcurrencyLimitUpdate(limit=size, slot_decay_per_second=rate, active=True),
        )
    except ObjectNotFound:
        await client.create_global_concurrency_limit(
            GlobalConcurrencyLimitCreate(name=name, limit=size, slot_decay_per_second=rate, active=True)
        )
    return f"rate limit {name}: {rate:g} req/s, bucket {size}"


async def _deploy_night(tenant: Tenant, env: dict[str, str], pool: str) -> str:
    """The tenant's scheduled night deployment."""
    from prefect.deployments.runner import RunnerDeployment
    from prefect.schedules import Cron
    from prefect.types.entrypoint import EntrypointType

    deployment = RunnerDeployment.from_flow(
        tenant_night,
        name=tenant.name,
        schedules=[Cron(tenant.schedule, timezone=tenant.timezone)],
        parameters={"tenant": tenant.name},
        tags=["membersync", f"tenant:{tenant.name}"],
        description=f"membersync: the night of tenant {tenant.name}",
        job_variables={"env": env},
        entrypoint_type=EntrypointType.MODULE_PATH,
        concurrency_limit=1,  # one night of a tenant at a time (its data dir's lock agrees)
    )
    await deployment.aapply(work_pool_name=pool)
    return f"deployment {FLOW_NAME}/{tenant.name}: cron {tenant.schedule!r} {tenant.timezone}, pool {pool}"


async def _deploy_shard(tenant: Tenant, env: dict[str, str], pool: str) -> str:
    """The tenant's shard deployment: no schedule, its night starts the runs, on their own queue."""
    from prefect.deployments.runner import RunnerDeployment
    from prefect.types.entrypoint import EntrypointType

    shard = RunnerDeployment.from_flow(
        tenant_shard,
        name=tenant.name,
        tags=["membersync", f"tenant:{tenant.name}", "shard"],
        description=f"membersync: a shard of a night of tenant {tenant.name} (its night starts it)",
        job_variables={"env": env},
        entrypoint_type=EntrypointType.MODULE_PATH,
        work_queue_name=SHARD_QUEUE,
    )
    await shard.aapply(work_pool_name=pool)
    return (
        f"deployment {SHARD_FLOW_NAME}/{tenant.name}: {tenant.shards} shards a night, "
        f"pool {pool}, queue {SHARD_QUEUE}"
    )


def run_deploy_cli(path: str, pool: str, out: Any, err: Any) -> int:
    """``membersync deploy``: 0 and one line per thing registered; 2 on bad input; 1 if the
    server refused."""
    if not os.environ.get("PREFECT_API_URL", "").strip():
        error(
            "PREFECT_API_URL is not set (the Prefect server to register on; "
            "with basic auth also PREFECT_API_AUTH_STRING)",
            err,
        )
        return 2
    try:
        tenants = load_tenants(path)
    except TenantsFileError as exc:
        for line in exc.errors:
            error(line, err)
        return 2
    from membersync.flows.night.nightly import prepare_prefect_env

    prepare_prefect_env()
    try:
        lines = asyncio.run(deploy_tenants(Path(path).resolve(), tenants, pool))
    except Exception as exc:  # the server refused or cannot be reached: one line
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        error(f"deploy failed: {text}", err)
        return 1
    for line in lines:
        out.print(line, soft_wrap=True, markup=False, highlight=False)
    out.print(
        f"ok: {len(tenants)} deployment(s); start workers with: prefect worker start --pool {pool}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return 0


__all__ = [
    "ENTRYPOINT",
    "FLOW_NAME",
    "SHARD_FLOW_NAME",
    "SharedRateGate",
    "bucket_size",
    "chunk_for",
    "deploy_tenants",
    "rate_limit_name",
    "run_deploy_cli",
    "tenant_night",
    "tenant_shard",
]
