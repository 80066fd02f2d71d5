"""``membersync audit``: the self-audit on demand, without writing a night.

Fetches a sample of the known clients (or all of them) live, compares them with the landing
zone's committed state (:mod:`membersync.flows.night.audit`), queues those that differ for a full
re-sync by the next night, and prints them (client numbers, tables and keys; never a value).
Exit codes: 0 no difference, 1 differences found and queued (or the service failed), 2 bad
input (settings, ``--clients``, a data dir without a committed night).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from pathlib import Path

from membersync.extract.profile import ProfileError
from membersync.extract.settings import ServiceSettings, Settings, SettingsError
from membersync.flows.console import error, out
from membersync.flows.night import audit as A
from membersync.flows.night import batches as B
from membersync.flows.night import nightly
from membersync.flows.night.options import SyncOptions
from membersync.models.coerce import TimezoneLookup
from membersync.warehouse.exports.table_print import print_table
from membersync.warehouse.landing.paths import DataDir
from rich.console import Console

log = logging.getLogger(__name__)


class AuditUsageError(ValueError):
    """A bad ``--clients`` (one line, exit 2)."""


def parse_clients(value: str | None) -> int | None:
    """``--clients``: a whole number >= 1, ``all`` (None: every known client), or not given (-1:
    the nightly sizing from ``MEMBERSYNC_AUDIT_*``)."""
    if value is None:
        return -1
    if value.strip().lower() == "all":
        return None
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise AuditUsageError(f"bad --clients {value!r}: expected a whole number >= 1 or 'all'")
    return count


def choose(known: list[str], wanted: int | None, options: A.AuditOptions, seed: str) -> list[str]:
    """The clients to audit: all of them, ``wanted`` of them, or the nightly sizing (-1)."""
    if wanted is None:
        return list(known)
    size = A.sample_size(len(known), len(known), options) if wanted < 0 else wanted
    return A.pick_sample(known, size, seed)


def run_audit_cli(clients: str | None, seed: str | None = None) -> int:
    from membersync.extract.errors import ServiceError
    from membersync.warehouse.landing.identity import ErasureKeyError
    from membersync.warehouse.landing.zone import AlreadyRunning

    try:
        wanted = parse_clients(clients)
        config = Settings.load()  # every MEMBERSYNC_* variable, read and checked once
        settings = ServiceSettings.from_settings(config)
        settings.profile()
        options = SyncOptions.from_settings(config)
        data_dir = DataDir.from_settings(config)
    except (AuditUsageError, SettingsError, ProfileError) as exc:
        return _fail(str(exc), 2)
    started = dt.datetime.now(dt.UTC)
    label = f"on-demand-{started:%Y%m%dT%H%M%SZ}"
    try:
        with nightly.holding_lock(data_dir) as zone:  # the re-sync queue is shared with the nightly sync
            from membersync.warehouse.lifecycle.upkeep import upkeep

            upkeep(zone)
            holdings = A.read_holdings(zone)
            if not holdings.known:
                return _fail(f"nothing to audit: no committed night in {data_dir.root}", 2)
            sample = choose(holdings.known, wanted, options.audit, seed or label)
            result = asyncio.run(_audit(settings, options, data_dir, holdings, sample))
            report = A.write_report(data_dir, result, label)
            A.queue_for_resync(data_dir, result, label)
    except AlreadyRunning as exc:
        return _fail(f"already running: {exc}", 1)
    except ErasureKeyError as exc:  # the register's key is missing or not its own: land nothing
        return _fail(str(exc), 2)
    except OSError as exc:
        return _fail(f"cannot use the data dir {data_dir.root}: {exc.strerror or exc}", 2)
    except (ServiceError, B.BatchFailed) as exc:
        return _fail(f"audit failed: {nightly.one_line(exc)}", 1)
    show(result, report)
    return 1 if result.differed else 0


async def _audit(
    settings: ServiceSettings,
    options: SyncOptions,
    data_dir: DataDir,
    holdings: A.Holdings,
    sample: list[str],
) -> A.AuditResult:
    from membersync.extract.client import ServiceClient

    newest = max(holdings.manifests)
    night = max(dt.date.today(), newest)
    window = B.Window.for_night(
        night, None, full=True, lookback_days=options.lookback_days, points_start=options.points_start
    )
    async with ServiceClient.from_settings(settings, options.client_options) as client:
        tz = TimezoneLookup.from_stores(await client.get("storelist"))
        return await A.audit_clients(client, data_dir, holdings, sample, tz, window, options.batch_size)


def show(result: A.AuditResult, report: Path, console: Console | None = None) -> None:
    """The clients that differed (tables and keys), then one line of counts and the report's path."""
    console = console or out
    if result.differed:
        rows = [
            (key, name, ", ".join(keys))
            for key, by_table in sorted(result.differed.items())
            for name, keys in sorted(by_table.items())
        ]
        title = "clients that differ from the landing zone"
        print_table(["client key", "table", "keys"], rows, title=title, out=console)
    counts = result.counts()
    verdict = (
        "queued for a full re-sync by the next night"
        if result.differed
        else "no difference from the landing zone"
    )
    console.print(
        f"audited {counts['sampled']:,} clients: {counts['differed']:,} differed "
        f"({counts['tables']} tables, {counts['keys']:,} keys); {verdict}",
        soft_wrap=True,
    )
    console.print(f"report: {report}", soft_wrap=True)


def _fail(message: str, code: int) -> int:
    error(message)
    return code
