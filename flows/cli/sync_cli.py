"""``membersync sync``: one night from the command line, on Prefect's ephemeral server.

Checks everything it can *before* starting Prefect (whose ephemeral server takes seconds to
start): settings and profile (a missing one is a one-line error naming it, exit 2), the
data dir (exit 2), and the sync lock (another sync on the same data dir: "already running",
exit 1, at once). Then runs the flow, shows a progress bar, prints the run summary, and
exits 0 when the night was committed and the warehouse built, 1 otherwise.

``MEMBERSYNC_PREFECT=off`` runs the same night without Prefect (for embedding, debugging a
machine without a Prefect home, and the benchmark's comparison).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from membersync.extract.profile import ProfileError
from membersync.extract.settings import ServiceSettings, SettingsError
from membersync.flows.console import err, error, out
from membersync.flows.night import logfile, nightgc, nightly
from membersync.flows.night.context import NightContext, handed_down
from membersync.flows.night.interrupt import EXIT_INTERRUPTED, Interrupted, run_until_signal, say_once
from membersync.flows.night.notify import resume_command
from membersync.flows.night.options import SyncOptions
from membersync.flows.night.progress import NullProgress, Progress, RichProgress
from membersync.flows.night.summary import RunSummary
from membersync.warehouse.exports.table_print import print_table
from membersync.warehouse.landing.manifest import foreign_tenant
from rich.console import Console

log = logging.getLogger(__name__)


def _fail(message: str, code: int) -> int:
    error(message)
    return code


def run_sync_cli(
    night: dt.date | None, full: bool = False, progress: bool = True, force: bool = False, wait: bool = False
) -> int:
    from membersync.warehouse.landing.zone import AlreadyRunning

    started = time.monotonic()
    try:
        setup = NightContext.load()
    except (SettingsError, ProfileError) as exc:
        return _fail(str(exc), 2)
    try:
        setup.data_dir.ensure()
    except OSError as exc:
        return _fail(f"cannot use the data dir {setup.data_dir.root}: {exc.strerror or exc}", 2)
    night = night or dt.date.today()
    refusal = _refusal(setup, night, force)
    if refusal is not None:
        return _fail(refusal, 2)
    log_file = logfile.start(setup.data_dir, f"sync-{night.isoformat()}")
    logfile.capture_stray_output(log_file, err)
    command = _SyncNight(setup, night, full, log_file, resume_command(night, full))
    try:
        with setup.lock(wait):
            outcome = command.run_locked(progress)
    except AlreadyRunning as exc:
        return _fail(f"already running: {exc}", 1)
    if isinstance(outcome, int):  # the night failed: said and sent already
        return outcome
    print_summary(outcome, log_file=log_file, wall_s=time.monotonic() - started)
    shortfall = outcome.shortfall()
    if shortfall is not None:
        setup.notifier.night_failed(night, shortfall, command.resume_hint)
        return 1
    return 0


def _refusal(setup: NightContext, night: dt.date, force: bool) -> str | None:
    """Why this night must not run at this data location (one line), or None."""
    from membersync.warehouse.landing.identity import ErasureKeyError, erasure_key, read_register
    from membersync.warehouse.landing.zone import LandingZone

    zone = LandingZone(setup.data_dir, erasure_key_file=setup.config.erasure_key_file)
    refusal = check_night(night, zone.state().committed, dt.date.today(), force)
    if refusal is None:  # a location whose manifests name another tenant is not this night's
        owners = ((m.snapshot_date, m.tenant) for m in zone.manifests())
        refusal = foreign_tenant(owners, setup.settings.tenant)
    if refusal is None and read_register(zone.store).erasures:
        try:  # a night that cannot recognise the forgotten clients must not start
            erasure_key(zone, create=False)
        except ErasureKeyError as exc:
            refusal = str(exc)
    return refusal


@dataclass(frozen=True)
class _SyncNight:
    """One night of ``membersync sync``, its settings read and its log open."""

    setup: NightContext
    night: dt.date
    full: bool
    log_file: Path
    resume_hint: str

    def last_words(self, signame: str) -> str:
        return (
            f"interrupted ({signame}): night {self.night} was not committed; the batches already "
            f"written are kept, resume with `{self.resume_hint}`"
        )

    def night_failed(self, line: str, code: int, interrupted: bool = False) -> int:
        """Say the line (an interrupt's was said at the signal), then send it; the code is unchanged."""
        if not interrupted:
            _fail(line, code)
        self.setup.notifier.night_failed(self.night, line, self.resume_hint, interrupted=interrupted)
        return code

    def run_locked(self, progress: bool) -> RunSummary | int:
        """The night, the caller holding the data dir's lock: its summary, or the exit code of a
        night that failed (the failure said and sent)."""
        setup, night = self.setup, self.night
        # A first request before Prefect starts (seconds): wrong credentials, a wrong URL or
        # a server that is down is one line at once, not a failed flow run.
        problem = probe_service(setup.settings, setup.options)
        if problem is not None:
            return self.night_failed(problem, 1)
        bar: Progress = RichProgress(err) if progress else NullProgress()
        setup.progress = bar
        try:
            return _run(setup, night, self.full, bar, self.last_words)
        except Interrupted as exc:
            bar.close()
            signame = exc.signal
            say_once(lambda: _fail(self.last_words(signame), EXIT_INTERRUPTED))
            return self.night_failed(self.last_words(signame), EXIT_INTERRUPTED, interrupted=True)
        except Exception as exc:
            bar.close()
            cause = nightly.unwrap(exc)
            log.error("night %s failed: %s", night, cause, exc_info=cause)
            return self.night_failed(
                f"night {night} failed: {nightly.one_line(cause)} (log: {self.log_file})", 1
            )


def check_night(night: dt.date, committed: list[dt.date], today: dt.date, force: bool) -> str | None:
    """Why ``night`` must not run (one line), or None.

    A night later than tomorrow cannot be observed yet (tomorrow is allowed: a store east of
    this machine may already be on it). A night older than the newest committed one would
    replace that night's history with *today's* state of the service: only with ``--force``.
    """
    if night > today + dt.timedelta(days=1):
        return f"night {night} is in the future (today is {today}): the service cannot show it yet"
    newest = committed[-1] if committed else None
    if newest is not None and night < newest and not force:
        return (
            f"night {night} is older than the newest committed night {newest}: re-running it would "
            "replace its history with today's state of the service; pass --force to do it anyway"
        )
    return None


def probe_service(settings: ServiceSettings, options: SyncOptions) -> str | None:
    """One GET of the store list: None when the service answers, else the one line to show."""
    from membersync.extract.client import ServiceClient
    from membersync.extract.errors import (
        AuthenticationError,
        NotFoundError,
        PermissionDeniedError,
        ServiceError,
        TransportError,
    )

    async def ask() -> None:
        async with ServiceClient.from_settings(settings, options.client_options) as client:
            await client.storelist()

    where = settings.base_url
    try:
        asyncio.run(ask())
    except AuthenticationError:
        user = settings.username.get_secret_value()
        return (
            f"wrong credentials (user {user!r}): {where} answered HTTP 401; "
            "check MEMBERSYNC_USERNAME and MEMBERSYNC_PASSWORD"
        )
    except PermissionDeniedError:
        user = settings.username.get_secret_value()
        return f"user {user!r} may not read the store list at {where} (HTTP 403)"
    except NotFoundError:
        return (
            f"{where} does not look like the service (HTTP 404 for its store list); check MEMBERSYNC_BASE_URL"
        )
    except TransportError as exc:
        return f"cannot reach the service at {where}: {exc.describe()} (after {exc.attempts} attempts)"
    except ServiceError as exc:
        return f"the service at {where} is not answering as expected: {nightly.one_line(exc)}"
    return None


def _committed(result: Any) -> bool:
    """Whether a night's result (its summary, or the flow's dict of it) says it committed: after a
    signal, only such a result stands (else the night was interrupted, see run_until_signal)."""
    status = result.get("status") if isinstance(result, dict) else getattr(result, "status", None)
    return status == "committed"


def _run(
    context: NightContext,
    night: dt.date,
    full: bool,
    bar: Progress,
    last_words: Callable[[str], str],
) -> RunSummary:
    def say(signame: str) -> None:
        bar.close()
        _fail(last_words(signame), EXIT_INTERRUPTED)

    settings, data_dir, options = context.settings, context.data_dir, context.options
    if not context.config.prefect:
        return run_until_signal(
            nightly.arun_night(settings, data_dir, night, full=full, options=options, progress=bar),
            say,
            _committed,
        )
    bar.phase("starting Prefect")
    nightly.prepare_prefect_env()
    with nightgc.quiet_while_loading():  # (seconds of imports: see nightgc)
        from membersync.flows.night import prefect_flow  # imports Prefect, which sets up its logging
        from membersync.flows.night.prefect_api import night_api

    logfile.quiet_console()  # Prefect's console handlers would break the bar and the one-line errors
    with night_api(), handed_down(context) as key:  # PREFECT_API_URL's server, else one of its own
        result: dict[str, Any] = run_until_signal(
            prefect_flow.nightly_sync(night=night, full=full, context=key),
            say,
            _committed,
        )
    return nightly.summary_from_flow_result(result)


def print_summary(
    summary: RunSummary,
    console: Console | None = None,
    log_file: Path | None = None,
    wall_s: float | None = None,
) -> None:
    """The night's summary table, then the files it wrote (reports, log), one per line."""
    rows = [(row["item"], row["value"]) for row in summary.table_rows()]
    if wall_s is not None:
        rows.append(("command wall time", f"{wall_s:,.1f} s (start-up, Prefect and build included)"))
    console = console or out
    print_table(
        ["item", "value"],
        rows,
        title=f"membersync night {summary.night}",
        show_header=False,
        right_aligned=("value",),
        unfolded=("item",),
        out=console,
    )
    for path in summary.reports:
        console.print(f"report: {path}", soft_wrap=True, highlight=False)
    if log_file is not None:
        console.print(f"log: {log_file}", soft_wrap=True, highlight=False)
