"""The ``membersync`` command line: thin wiring over the library's functions.

Exit codes: 0 success, 1 the work failed (a night, a build), 2 bad input (configuration,
arguments, profile, data dir). Errors are one line on stderr, never a traceback, never a
secret.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from membersync.extract.settings import UsageError
from membersync.flows.console import err, error, out


def _flags_take_no_value() -> None:
    """typer 0.29's help labels a flag's type ``<bool>``, as if it took a value (``--dry-run
    <bool>``): a flag shows no type."""
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_take_no_value()
app = typer.Typer(
    name="membersync",
    help="Nightly sync, warehouse and reports for the business-management service.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
REPO_ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def fail(message: str, code: int = 2) -> NoReturn:
    error(message)
    raise typer.Exit(code)


def guarded(fn: Callable[[], T]) -> T:
    """Run ``fn``; turn known input errors into one line and exit code 2."""
    from membersync.extract.profile import ProfileError
    from membersync.extract.settings import SettingsError

    try:
        return fn()
    except (UsageError, ProfileError, SettingsError) as exc:
        fail(str(exc))


def parse_date(value: str | None) -> dt.date | None:
    """A ``--date`` as a date; only YYYY-MM-DD, the one form the help and the messages promise."""
    import re

    if value is None:
        return None
    # fromisoformat alone is not enough: on Python 3.11+ it also takes 20261124 and 2026-W47-2.
    if not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", value):
        raise UsageError(f"bad date {value!r}: expected YYYY-MM-DD")
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise UsageError(f"bad date {value!r}: expected YYYY-MM-DD") from None


@app.command()
def sandbox(
    port: Annotated[int, typer.Option(help="TCP port on 127.0.0.1 (0 = any free port)")] = 8700,
    host: Annotated[str, typer.Option(help="interface to bind (loopback by default)")] = "127.0.0.1",
    clients: Annotated[int, typer.Option(help="number of synthetic clients")] = 1000,
    stores: Annotated[int, typer.Option(help="number of stores")] = 5,
    seed: Annotated[int, typer.Option(help="seed of the synthetic data")] = 42,
    rate: Annotated[float, typer.Option(help="requests/s per credential (0 = unlimited)")] = 0.0,
    latency_ms: Annotated[float, typer.Option("--latency-ms", help="added latency per request")] = 0.0,
    fault_rate: Annotated[
        float, typer.Option("--fault-rate", help="share of requests answered with a fault")
    ] = 0.0,
    username: Annotated[str, typer.Option(envvar="SANDBOX_USERNAME", help="Basic username")] = "sandbox",
    password: Annotated[
        str, typer.Option(envvar="SANDBOX_PASSWORD", help="Basic password", show_default=False)
    ] = ("sandbox"),
    burst: Annotated[
        float | None, typer.Option(help="token-bucket burst per credential (default: the rate)")
    ] = None,
    announce_limits: Annotated[
        bool, typer.Option("--announce-limits", help="send RateLimit-* headers with every answer")
    ] = False,
    window: Annotated[
        float,
        typer.Option(help="a fixed window of rate x SECONDS requests instead of the token bucket (0: none)"),
    ] = 0.0,
    max_in_flight: Annotated[
        int, typer.Option("--max-in-flight", help="429 when more than N requests are open (0: no cap)")
    ] = 0,
    anchor_date: Annotated[
        str | None, typer.Option("--anchor-date", help="data is generated up to this date (default: today)")
    ] = None,
    drift: Annotated[
        bool, typer.Option("--drift", help="numbers as strings, enums in other casing, extra fields")
    ] = False,
    profile: Annotated[
        str | None, typer.Option(help="serve a tenant profile's wire names (TOML; default: the contract)")
    ] = None,
    recent_days: Annotated[
        int,
        typer.Option(
            "--recent-days",
            min=0,
            max=400,
            help="days of business before the anchor date (sales up to its eve)",
        ),
    ] = 14,
) -> None:
    """Serve the sandbox: a complete local implementation of the service."""
    from membersync.extract.profile import Profile
    from membersync.extract.sandbox.running import serve_forever
    from membersync.extract.sandbox.server import SandboxConfig

    config = guarded(
        lambda: SandboxConfig.checked(
            clients=clients,
            stores=stores,
            seed=seed,
            rate=rate,
            latency_ms=latency_ms,
            fault_rate=fault_rate,
            username=username,
            password=password,
            burst=burst,
            announce_limits=announce_limits,
            window=window,
            max_in_flight=max_in_flight,
            anchor_date=parse_date(anchor_date),
            recent_days=recent_days,
            drift=drift,
            profile=Profile.load(profile) if profile else None,
            lazy=True,  # clients' holdings are filled on first use: start-up stays fast at 100,000
        )
    )
    guarded(lambda: serve_forever(config, host=host, port=port))


@app.command()
def sync(
    date: Annotated[str | None, typer.Option(help="the night, YYYY-MM-DD (default: today)")] = None,
    full: Annotated[bool, typer.Option("--full", help="list every client, not only changed ones")] = False,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
    force: Annotated[
        bool, typer.Option("--force", help="re-run a night older than the newest committed one")
    ] = False,
    wait: Annotated[
        bool, typer.Option("--wait", help="wait for another writer to finish instead of exiting 1")
    ] = False,
) -> None:
    """Sync one night: configuration, discovery, per-client data; land; build reports."""
    from membersync.flows.cli.sync_cli import run_sync_cli
    from membersync.flows.night.interrupt import EXIT_INTERRUPTED, leave_now

    night = guarded(lambda: parse_date(date))
    code = run_sync_cli(night, full=full, progress=progress, force=force, wait=wait)
    if code == EXIT_INTERRUPTED:
        leave_now()  # the lock is released and the line said; skip Prefect's slow exit hooks
    raise typer.Exit(code)


@app.command()
def audit(
    clients: Annotated[
        str | None,
        typer.Option(help="clients to audit: a number, or 'all' (default: the nightly sample's size)"),
    ] = None,
    seed: Annotated[str | None, typer.Option(help="seed of the sample (default: a new one each run)")] = None,
) -> None:
    """Compare clients' live state with the landing zone now; queue those that differ for re-sync.

    Exit 0: no difference; 1: differences found and queued for the next night; 2: bad input.
    """
    from membersync.flows.cli.audit_cli import run_audit_cli

    raise typer.Exit(run_audit_cli(clients, seed))


@app.command()
def forget(
    client_numbers: Annotated[
        list[str] | None,
        typer.Argument(help="client numbers to forget (leading zeros kept)", show_default=False),
    ] = None,
    from_file: Annotated[
        Path | None, typer.Option("--from-file", help="a file of client numbers, one a line ('#' comments)")
    ] = None,
    reason: Annotated[str, typer.Option(help="why (kept in the erasure register)")] = "erasure request",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="list what would go; change nothing")] = False,
    wait: Annotated[
        bool, typer.Option("--wait", help="wait for a running night instead of exiting 1")
    ] = False,
    exact: Annotated[
        bool,
        typer.Option("--exact", help="forget numbers no night landed, as given (suppressed from now on)"),
    ] = False,
) -> None:
    """Forget clients everywhere: their identity leaves every night, report, log and the bucket.

    Their money, memberships and history stay under a surrogate key linked to no one; the
    erasure register (no personal data) keeps them forgotten when the service serves them again.
    """
    from membersync.flows.cli.privacy_cli import run_forget_cli

    raise typer.Exit(
        guarded(lambda: run_forget_cli(client_numbers or [], from_file, reason, dry_run, wait, exact))
    )


@app.command()
def retention(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="list what would go; change nothing")] = False,
    wait: Annotated[
        bool, typer.Option("--wait", help="wait for a running night instead of exiting 1")
    ] = False,
) -> None:
    """Apply MEMBERSYNC_RETENTION now: thin and remove old nights, forget inactive clients."""
    from membersync.flows.cli.privacy_cli import run_retention_cli

    raise typer.Exit(guarded(lambda: run_retention_cli(dry_run, wait)))


@app.command()
def demo(
    clients: Annotated[int, typer.Option(min=1, help="clients in the demo sandbox")] = 300,
    nights: Annotated[int, typer.Option(min=1, max=400, help="nights of history, the last tonight")] = 35,
    open_report: Annotated[
        bool, typer.Option("--open", help="open the morning report in the desktop's browser")
    ] = False,
) -> None:
    """Start a sandbox, sync five weeks of its history night by night, and show the morning after."""
    from membersync.flows.cli.demo import run_demo

    raise typer.Exit(guarded(lambda: run_demo(clients=clients, nights=nights, open_report=open_report)))


@app.command()
def reports(
    date: Annotated[str | None, typer.Option(help="night to export (default: newest committed)")] = None,
    report: Annotated[list[str] | None, typer.Option(help="only these reports (repeatable)")] = None,
    full_refresh: Annotated[
        bool, typer.Option("--full-refresh", help="rebuild every night (default: only the nights not built)")
    ] = False,
    wait: Annotated[
        bool, typer.Option("--wait", help="wait for another writer to finish instead of exiting 1")
    ] = False,
) -> None:
    """Build the warehouse (the committed nights it lacks) and export the CSVs (no call to the service)."""
    from membersync.flows.cli.reports_cli import run_reports_cli

    night = guarded(lambda: parse_date(date))
    build = lambda: run_reports_cli(night, report or None, full_refresh=full_refresh, wait=wait)  # noqa: E731
    raise typer.Exit(guarded(build))


@app.command()
def publish(
    full: Annotated[
        bool, typer.Option("--full", help="every table made again and loaded whole, in one transaction")
    ] = False,
    roles: Annotated[
        bool, typer.Option("--roles", help="create the roles, their grants and row security by store")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="with --roles: print the SQL, run nothing")
    ] = False,
    wait: Annotated[
        bool, typer.Option("--wait", help="wait for another writer to finish instead of exiting 1")
    ] = False,
) -> None:
    """Publish the warehouse into MEMBERSYNC_PUBLISH_URL's PostgreSQL (the nights it lacks)."""
    from membersync.flows.cli.publish_cli import run_publish_cli

    raise typer.Exit(guarded(lambda: run_publish_cli(full=full, roles=roles, dry_run=dry_run, wait=wait)))


@app.command("report-html")
def report_html(
    date: Annotated[
        str | None, typer.Option(help="night of the report (default: newest in the warehouse)")
    ] = None,
) -> None:
    """Write the night's HTML morning report (DATA_DIR/reports/<night>/morning_report_<night>.html)."""
    from membersync.flows.cli.reports_cli import run_report_html_cli

    night = guarded(lambda: parse_date(date))
    raise typer.Exit(guarded(lambda: run_report_html_cli(night)))


@app.command()
def docs() -> None:
    """Generate dbt's documentation site of the warehouse (static files in the data dir)."""
    from membersync.flows.cli.reports_cli import run_docs_cli

    raise typer.Exit(guarded(run_docs_cli))


# A query may start with an SQL comment (`-- note`): unknown "options" are kept as the argument.
@app.command(context_settings={"ignore_unknown_options": True})
def sql(
    query: Annotated[
        str | None,
        typer.Argument(help="SQL to run on the warehouse (read-only); - reads it from stdin"),
    ] = None,
    csv: Annotated[bool, typer.Option("--csv", help="print CSV instead of a table")] = False,
    identified: Annotated[
        bool,
        typer.Option(
            "--identified", help="the identified tier (client numbers, names): for roles that need it"
        ),
    ] = False,
    reader_setup: Annotated[
        bool,
        typer.Option(
            "--reader-setup",
            help="print the SQL a BI tool's DuckDB connection must run first to read as this tier",
        ),
    ] = False,
) -> None:
    """Run ad-hoc SQL on the warehouse (the analyst tier: no personal data; see --identified)."""
    from membersync.flows.cli.reports_cli import run_reader_setup_cli, run_sql_cli

    if reader_setup:
        raise typer.Exit(guarded(lambda: run_reader_setup_cli(identified=identified)))
    if query is None:
        raise typer.Exit(guarded(lambda: run_sql_cli("", as_csv=csv, identified=identified)))
    if query == "-":
        query = sys.stdin.read()
    text = query
    raise typer.Exit(guarded(lambda: run_sql_cli(text, as_csv=csv, identified=identified)))


@app.command()
def freshness(
    max_age_hours: Annotated[
        str | None,
        typer.Option(
            "--max-age-hours",
            help="stale after this many hours (default: MEMBERSYNC_STALE_AFTER_HOURS or 36)",
        ),
    ] = None,
    notify: Annotated[
        bool, typer.Option("--notify", help="when stale, send one message through MEMBERSYNC_NOTIFY")
    ] = False,
) -> None:
    """How old the newest committed night is: exit 0 fresh, 1 stale (or none committed)."""
    from membersync.flows.cli.freshness_cli import run_freshness_cli

    raise typer.Exit(guarded(lambda: run_freshness_cli(max_age_hours, notify=notify)))


@app.command()
def serve(
    cron: Annotated[str, typer.Option(help="cron schedule of the nightly run")] = "0 2 * * *",
    timezone: Annotated[str, typer.Option(help="IANA timezone of the schedule")] = "UTC",
    interval: Annotated[
        int | None, typer.Option(help="seconds between runs instead of cron (testing)")
    ] = None,
) -> None:
    """Serve the nightly flow as a Prefect deployment on a schedule (needs a real Prefect server)."""
    from membersync.flows.pool.schedule import run_serve_cli

    raise typer.Exit(guarded(lambda: run_serve_cli(cron=cron, timezone=timezone, interval=interval)))


@app.command()
def bench(
    clients: Annotated[list[int] | None, typer.Option(help="client counts to measure (repeatable)")] = None,
    sandbox_only: Annotated[
        bool, typer.Option("--sandbox-only", help="only the sandbox's own throughput")
    ] = False,
    rate_matrix: Annotated[
        bool, typer.Option("--rate-matrix", help="politeness at the limit: rates x bursts x latencies")
    ] = False,
    rates: Annotated[str, typer.Option(help="rate matrix: limits in req/s")] = "20,50,200,500",
    bursts: Annotated[str, typer.Option(help="rate matrix: bucket sizes (R = the rate)")] = "1,5,20,R",
    latencies: Annotated[str, typer.Option(help="rate matrix: latencies in ms")] = "0,20,200",
    seconds: Annotated[float, typer.Option(help="rate matrix: seconds of each night")] = 20.0,
    markdown: Annotated[str | None, typer.Option(help="rate matrix: also write a markdown table")] = None,
    announced: Annotated[
        bool, typer.Option("--announced", help="rate matrix: each cell also with RateLimit-* headers")
    ] = False,
    next_night: Annotated[
        bool,
        typer.Option(
            "--next-night", help="rate matrix: measure a second night, started at the rate the first found"
        ),
    ] = False,
    nights: Annotated[
        int,
        typer.Option(
            min=1, help="rate matrix: nights per cell, in turn (> 1: the median, the lowest, how many met)"
        ),
    ] = 1,
    history_cost: Annotated[
        bool, typer.Option("--history-cost", help="requests and bytes: whole histories vs the window")
    ] = False,
    window: Annotated[
        float,
        typer.Option(help="rate matrix: a fixed window of rate x SECONDS at each rate (whole nights)"),
    ] = 0.0,
    max_in_flight: Annotated[
        str,
        typer.Option("--max-in-flight", help="rate matrix: caps on requests in flight, N,N (whole nights)"),
    ] = "",
    ideal: Annotated[
        bool, typer.Option("--ideal", help="rate matrix, whole nights: each row also told the limit")
    ] = False,
) -> None:
    """Measure throughput, CPU per request and peak memory; print the figures."""
    from membersync.flows.benchmarks.sync import run_bench_cli, run_history_cost, run_rate_matrix

    if history_cost:
        raise typer.Exit(run_history_cost((clients or [10_000])[0]))
    if rate_matrix and (window or max_in_flight or ideal):
        from membersync.flows.benchmarks.whole_night import limits_from, run

        latency_list = guarded(lambda: _numbers(latencies, "--latencies"))
        caps = guarded(lambda: _caps(max_in_flight, latency_list))
        limits = guarded(lambda: limits_from(_numbers(rates, "--rates"), bursts.split(","), window, caps))
        raise typer.Exit(run(limits, latency_list, (clients or [1_500])[0], markdown, next_night, ideal))
    if rate_matrix:
        numbers = guarded(lambda: _numbers(rates, "--rates") + _numbers(latencies, "--latencies"))
        split = len(rates.split(","))
        raise typer.Exit(
            run_rate_matrix(
                numbers[:split],
                bursts.split(","),
                numbers[split:],
                seconds,
                markdown,
                announced,
                next_night,
                nights=nights,
            )
        )
    raise typer.Exit(run_bench_cli(clients or [10_000], sandbox_only=sandbox_only))


tenants_app = typer.Typer(
    help="The tenants file: every tenant's service, credentials (by name), schedule, data."
)
app.add_typer(tenants_app, name="tenants")


@tenants_app.command("check")
def tenants_check(
    file: Annotated[str, typer.Argument(help="the tenants file (TOML)")],
) -> None:
    """Validate a tenants file: one line per tenant (exit 0), or one line per error (exit 2)."""
    from membersync.flows.pool.tenants import run_tenants_check

    raise typer.Exit(run_tenants_check(file, out, err))


@app.command()
def deploy(
    file: Annotated[str, typer.Argument(help="the tenants file (TOML)")],
    pool: Annotated[str, typer.Option(help="the process work pool (created if missing)")] = "membersync",
) -> None:
    """Register one deployment per tenant on the Prefect server at PREFECT_API_URL (a process pool)."""
    from membersync.flows.pool.tenant_flow import run_deploy_cli

    raise typer.Exit(run_deploy_cli(file, pool, out, err))


def _numbers(text: str, option: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise UsageError(f"{option} takes numbers separated by commas, got {text!r}") from None


def _caps(text: str, latencies: list[float]) -> list[int]:
    """``--max-in-flight``: whole numbers >= 1, each measured at latencies above 0 (N / latency)."""
    if not text:
        return []
    caps = _numbers(text, "--max-in-flight")
    if any(c < 1 or c != int(c) for c in caps):
        raise UsageError(f"--max-in-flight takes whole numbers >= 1, got {text!r}")
    if any(latency <= 0 for latency in latencies):
        raise UsageError("--max-in-flight needs --latencies above 0: a cap's limit is N / latency")
    return [int(c) for c in caps]


def main() -> None:
    """Console-script entry point."""
    if shutil.get_terminal_size().columns < 20:  # pragma: no cover - odd terminals
        os.environ.setdefault("COLUMNS", "120")
    app()


if __name__ == "__main__":
    main()
