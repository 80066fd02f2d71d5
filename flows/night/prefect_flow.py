"""The Prefect 3 flow around :mod:`membersync.flows.night.nightly`: one task per step, one per batch.

All tasks are ``async`` and awaited on the flow's own event loop, so the night's one
``ServiceClient`` (one connection pool, one rate limiter) serves every batch. Tasks receive a
run key and a batch id, and find their :class:`~membersync.flows.night.nightly.NightRun` in the
module-level run registry; no credential, client or data is ever a task parameter or result,
every task uses ``NO_CACHE`` and persists nothing. Settings come from the environment.

The registry lives in :mod:`membersync.flows.night.nightly` and is always reached as ``nightly.RUNS``:
when ``serve`` runs a flow, Prefect cloudpickles the flow's function *by value* into a fresh
process, and a global of this module would be copied separately for the flow and each task.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import uuid
from typing import Any

from membersync.flows.night import nightly
from membersync.flows.night.context import NightContext, context_for
from membersync.flows.night.interrupt import reclaim_sigterm
from membersync.flows.night.nightly import NightRun, StepRunner, drive, unwrap
from membersync.flows.night.notify import Notifier, resume_command
from membersync.flows.night.summary import RunSummary
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

_TASK_OPTIONS: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False, "retries": 0}


@task(name="configuration", **_TASK_OPTIONS)
async def config_task(run_key: str) -> int:
    """Configuration lists; returns the rows landed."""
    return await nightly.RUNS[run_key].land_config()


@task(name="discovery", **_TASK_OPTIONS)
async def discovery_task(run_key: str) -> list[str]:
    """Client discovery; returns the ids of the batches still to write."""
    return await nightly.RUNS[run_key].discover()


@task(name="batch", task_run_name="batch-{batch_id}", **_TASK_OPTIONS)
async def batch_task(run_key: str, batch_id: str) -> int:
    """One batch of clients: fetch (async), type, write; returns its client count."""
    return await nightly.RUNS[run_key].land_batch(batch_id)


@task(name="shards", **_TASK_OPTIONS)
async def shards_task(run_key: str, pending: list[str]) -> int:
    """The pending batches fetched by shard runs on the work pool (a large tenant's night)."""
    return await nightly.RUNS[run_key].land_by_shards(pending)


@task(name="self-audit", **_TASK_OPTIONS)
async def audit_task(run_key: str) -> list[str]:
    """The self-audit of an incremental night; returns the ids of re-sync batches to land now."""
    return await nightly.RUNS[run_key].audit()


@task(name="commit", **_TASK_OPTIONS)
async def commit_task(run_key: str) -> None:
    await nightly.RUNS[run_key].commit()


@task(name="warehouse-build", **_TASK_OPTIONS)
async def build_task(run_key: str) -> None:
    await nightly.RUNS[run_key].build()


# The steps of NightRun (by method name) as the task runs that execute them.
TASKS: dict[str, Any] = {
    "land_config": config_task,
    "discover": discovery_task,
    "land_batch": batch_task,
    "land_by_shards": shards_task,
    "audit": audit_task,
    "commit": commit_task,
    "build": build_task,
}


def task_steps(run_key: str) -> StepRunner:
    """Run each step of a night as its Prefect task run, on the flow's event loop (so the one
    client of the night serves every batch)."""

    async def step(name: str, *args: Any) -> Any:
        return await TASKS[name](run_key, *args)

    return step


SUMMARY_ARTIFACT_KEY = "membersync-night-summary"


@flow(name="membersync-nightly", persist_result=False, log_prints=False)
async def nightly_sync(
    night: dt.date | None = None, full: bool = False, context: str | None = None
) -> dict[str, Any]:
    """One night of sync (Prefect flow). Settings come from the environment, never parameters.

    ``night`` defaults to today's date (this machine's local date); ``full`` lists every
    client and fetches whole histories. ``context``: the key under which ``membersync sync``
    handed its :class:`NightContext` down (settings, lock and progress, built once); a run in
    another process (a schedule, a worker) reads its own environment. Returns the run summary
    (counts only).
    """
    # `serve` ships this function by value (cloudpickle) to the process that runs it: a name
    # its annotations use (dt) must also appear in its body, or Prefect cannot resolve them there.
    night = night or dt.date.today()
    return await run_night_in_flow(night, full, context_for(context))


async def run_night_in_flow(
    night: dt.date | None,
    full: bool,
    context: NightContext,
    fan_out: Any = None,
    resume: str | None = None,
) -> dict[str, Any]:
    """The body of a night inside a running flow (``nightly_sync``, ``tenant_night``): service,
    data dir, lock and progress from ``context``, the steps as tasks, the summary as artifacts.
    ``fan_out``: how a large tenant's batches are fetched by shards (:attr:`NightRun.fan_out`).

    A night a deployment runs (``membersync serve``'s schedule, a tenant's deployment on a work
    pool) that fails, or ends uncommitted, sends one message through ``MEMBERSYNC_NOTIFY``
    saying how to resume (``resume``; default: the ``membersync sync`` command). A night that
    ``membersync sync`` runs is left to it: it says the same in the terminal, then sends it.
    """
    reclaim_sigterm()  # under `membersync sync`: one Ctrl-C/SIGTERM path, see reclaim_sigterm
    notifier = context.notifier if _run_by_a_deployment() else None
    night = night or dt.date.today()
    resume = resume or resume_command(night, full)
    settings, data_dir, options = context.settings, context.data_dir, context.options
    run = NightRun(settings, data_dir, night, full=full, options=options, progress=context.progress)
    run.fan_out = fan_out
    key = uuid.uuid4().hex
    nightly.RUNS[key] = run
    try:
        with context.lock() as zone:
            run.zone = zone
            try:
                summary = await drive(run, task_steps(key))
            except BaseExceptionGroup as group:
                raise unwrap(group) from None
    except Exception as exc:
        await _tell(notifier, night, f"night {night} failed: {nightly.one_line(exc)}", resume)
        raise
    finally:
        del nightly.RUNS[key]
        await _summary_artifacts(run.summary)
    shortfall = summary.shortfall()
    if shortfall is not None:
        await _tell(notifier, night, shortfall, resume)
    return summary.as_dict()


async def _summary_artifacts(summary: RunSummary) -> None:
    """The night's summary as a table artifact, and a link to its morning report (if written)."""
    from prefect.artifacts import acreate_table_artifact

    try:
        await acreate_table_artifact(
            key=SUMMARY_ARTIFACT_KEY,
            table=summary.table_rows(keys=True),
            description=f"membersync night {summary.night} ({summary.status})",
        )
    except Exception as exc:  # the summary is also in the manifest: never mask the night's outcome
        logging.getLogger(__name__).warning("could not record the summary artifact: %s", exc)
    await _morning_report_artifact(summary.night, summary.reports)


def _run_by_a_deployment() -> bool:
    """Is this flow run a deployment's (a schedule, a worker), not ``membersync sync``'s own?"""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    return bool(context and context.flow_run and context.flow_run.deployment_id)


async def _tell(notifier: Notifier | None, night: dt.date, line: str, resume: str) -> None:
    """Send a failed night's message (delivery blocks: off the flow's event loop); never raises."""
    if notifier is not None:
        await asyncio.to_thread(notifier.night_failed, night, line, resume)


MORNING_ARTIFACT_KEY = "membersync-morning-report"


async def _morning_report_artifact(night: dt.date, reports: list[str]) -> None:
    """A markdown artifact linking the night's HTML morning report (when the build wrote one)."""
    from prefect.artifacts import acreate_markdown_artifact

    pages = [r for r in reports if r.endswith(".html")]
    if not pages:
        return
    page = pages[0]
    link = page if "://" in page else f"file://{page}"
    try:
        await acreate_markdown_artifact(
            key=MORNING_ARTIFACT_KEY,
            markdown=f"# Morning report {night}\n\n[{page}]({link})\n",
            description=f"membersync morning report of {night}",
        )
    except Exception as exc:  # a link only: never mask the night's outcome
        logging.getLogger(__name__).warning("could not record the morning report artifact: %s", exc)
