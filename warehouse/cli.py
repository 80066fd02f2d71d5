"""What ``membersync reports`` and ``membersync sql`` do (the typer wiring is in ``flows/cli.py``).

Exit codes as everywhere in the CLI: 0 success, 1 the build failed (a check), 2 bad input (data
dir, night, report name, SQL). Bad input raises ``membersync.flows.cli.UsageError`` (one line on
stderr, exit 2, printed by the CLI's ``guarded``).
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import logging
import sys
from typing import Any

import duckdb
from membersync.warehouse.build import BuildError, BuildInputError, build_warehouse, committed_nights
from membersync.warehouse.export import ExportError, cell_text, check_report_names, export_reports
from membersync.warehouse.landing import AlreadyRunning, LandingZone
from membersync.warehouse.manifest import ManifestError
from membersync.warehouse.paths import DataDir
from rich.console import Console
from rich.table import Table as RichTable

log = logging.getLogger(__name__)


def _usage_error(message: str) -> Exception:
    from membersync.flows.cli import UsageError

    return UsageError(message)


def _data_dir() -> DataDir:
    data_dir = DataDir.from_env()
    if not data_dir.root.is_dir():
        raise _usage_error(f"data dir {data_dir.root} does not exist (set MEMBERSYNC_DATA_DIR)")
    return data_dir


def run_reports_cli(night: dt.date | None, reports: list[str] | None) -> int:
    """Rebuild the warehouse from the landing zone (no call to the service), then export the CSVs."""
    err = Console(stderr=True, highlight=False)
    out = Console(highlight=False)
    try:
        names = check_report_names(reports)
        data_dir = _data_dir()
        nights = committed_nights(data_dir)
        if not nights:
            raise _usage_error(f"no committed night in {data_dir.manifests}: run `membersync sync` first")
        if night is not None and night not in nights:
            raise _usage_error(
                f"night {night.isoformat()} is not committed "
                f"(newest committed night: {nights[-1].isoformat()})"
            )
        # Every writer of the warehouse holds the data dir's lock: a build racing a sync could
        # otherwise publish an older warehouse over the one the sync just built.
        with LandingZone(data_dir).lock():
            result = build_warehouse(data_dir)
            paths = export_reports(data_dir, night, names)
    except AlreadyRunning as exc:
        err.print(
            f"[bold red]error:[/] {exc}; it rebuilds the warehouse when it commits, "
            "or run `membersync reports` again after it",
            soft_wrap=True,
        )
        return 1
    except (ExportError, BuildInputError, ManifestError) as exc:
        raise _usage_error(str(exc)) from None
    except BuildError as exc:
        err.print(f"[bold red]error:[/] {exc}", soft_wrap=True)
        return 1
    out.print(
        f"warehouse {result.path} built from {len(result.nights)} night(s), {result.checks} checks passed",
        soft_wrap=True,
    )
    for where, values in result.others.items():
        err.print(f"[yellow]note:[/] {where}: {sum(values.values())} row(s) counted as other", soft_wrap=True)
    for path in paths:
        out.print(str(path), soft_wrap=True)
    return 0


def run_sql_cli(query: str, as_csv: bool = False) -> int:
    """Run ``query`` on the warehouse opened read-only; print a table (or CSV on stdout)."""
    data_dir = _data_dir()
    if not data_dir.warehouse_db.is_file():
        raise _usage_error(f"no warehouse at {data_dir.warehouse_db}: run `membersync reports` first")
    try:
        with contextlib.closing(duckdb.connect(str(data_dir.warehouse_db), read_only=True)) as con:
            con.execute("SET TimeZone = 'UTC'")
            cursor = con.execute(query)
            header = [d[0] for d in cursor.description or []]
            rows = cursor.fetchall() if header else []
    except duckdb.Error as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        raise _usage_error(f"SQL failed: {first_line}") from None
    if as_csv:
        _print_csv(header, rows)
    else:
        _print_table(header, rows)
    return 0


def _print_csv(header: list[str], rows: list[tuple[Any, ...]]) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        writer.writerow([cell_text(v) for v in row])


def _print_table(header: list[str], rows: list[tuple[Any, ...]]) -> None:
    table = RichTable(show_header=True, header_style="bold")
    for name in header:
        table.add_column(name)
    for row in rows:
        # repr-free cells: exact decimals, ISO dates; null shown as NULL (dim).
        table.add_row(*("[dim]NULL[/]" if v is None else _escape(cell_text(v)) for v in row))
    console = Console(highlight=False)
    console.print(table)
    console.print(f"{len(rows)} row(s)", style="dim")


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
