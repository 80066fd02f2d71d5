"""What ``membersync reports``, ``report-html``, ``docs`` and ``sql`` do (the typer wiring is in
``flows/cli/commands.py``).

Exit codes as everywhere in the CLI: 0 success, 1 the build failed (a check), 2 bad input (data
dir, night, report name, SQL). Bad input raises ``membersync.extract.settings.UsageError`` (one line on
stderr, exit 2, printed by the CLI's ``guarded``).
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import logging
import re
import sys
from typing import Any

import duckdb
from membersync.extract.settings import Settings, UsageError
from membersync.flows.console import err, error, nights_progress, out
from membersync.models.tables import PERSONAL_COLUMNS
from membersync.warehouse.build.builder import build_warehouse, committed_nights
from membersync.warehouse.build.catalog import ReaderRefused, check_reads_only, open_reader
from membersync.warehouse.build.errors import BuildError, BuildInputError
from membersync.warehouse.exports import open_tables, postgres
from membersync.warehouse.exports.export import ExportError, cell_text, check_report_names, export_reports
from membersync.warehouse.exports.morning import write_morning_report
from membersync.warehouse.exports.table_print import print_table
from membersync.warehouse.landing.identity import ErasureKeyError
from membersync.warehouse.landing.manifest import ManifestError
from membersync.warehouse.landing.paths import DataDir
from membersync.warehouse.landing.remote import publish_reports, refresh_mirror
from membersync.warehouse.landing.storage import StoreError
from membersync.warehouse.landing.zone import AlreadyRunning, LandingZone
from membersync.warehouse.lifecycle.upkeep import upkeep
from rich.text import Text

log = logging.getLogger(__name__)


def existing_data_dir() -> DataDir:
    data_dir = DataDir.from_settings(Settings.load())
    if data_dir.remote is None and not data_dir.root.is_dir():  # s3://: the working dir is made
        raise UsageError(f"data dir {data_dir.root} does not exist (set MEMBERSYNC_DATA_DIR)")
    return data_dir


def run_reports_cli(
    night: dt.date | None, reports: list[str] | None, *, full_refresh: bool = False, wait: bool = False
) -> int:
    """Build the warehouse from the landing zone (no call to the service), then export the CSVs.

    The build adds the committed nights the warehouse lacks; ``full_refresh`` rebuilds them all.
    """
    try:
        names = check_report_names(reports)
        data_dir = existing_data_dir()
        refresh_mirror(data_dir)  # an s3:// location: its committed files, mirrored in the working dir
        nights = committed_nights(data_dir)
        if not nights:
            raise UsageError(f"no committed night in {data_dir.manifests}: run `membersync sync` first")
        if night is not None and night not in nights:
            raise UsageError(
                f"night {night.isoformat()} is not committed "
                f"(newest committed night: {nights[-1].isoformat()})"
            )
        # Every writer of the warehouse holds the data dir's lock: a build racing a sync could
        # otherwise publish an older warehouse over the one the sync just built.
        with LandingZone(data_dir).lock(wait) as zone:
            refresh_mirror(data_dir)  # again, under the lock: what was committed before it was taken
            upkeep(zone)  # a data dir of the earlier layout migrated, pending erasures finished
            with nights_progress("building") as progress:
                result = build_warehouse(data_dir, full_refresh=full_refresh, progress=progress)
            open_tables.publish_build(data_dir, result)  # the analyst tier as Delta tables
            postgres.publish_if_configured(data_dir)  # MEMBERSYNC_PUBLISH_URL: BI tools' database
            paths = export_reports(data_dir, night, names)
            published = publish_reports(data_dir, paths)  # s3://: uploaded; else the paths
    except AlreadyRunning as exc:
        error(f"{exc}; it rebuilds the warehouse when it commits, or run `membersync reports` again after it")
        return 1
    except (ExportError, BuildInputError, ManifestError, ErasureKeyError) as exc:
        raise UsageError(str(exc)) from None
    except (BuildError, StoreError, open_tables.OpenTableError, postgres.PublishError) as exc:
        error(str(exc))
        return 1
    if result.built_nights:
        how = "rebuilt whole" if result.full_refresh else "built incrementally"
        if result.batches > 1:
            how += f" in {result.batches} batches (MEMBERSYNC_BUILD_MEMORY)"
        out.print(
            f"warehouse {result.path}: {len(result.nights)} night(s), {len(result.built_nights)} {how}, "
            f"{result.checks} checks passed",
            soft_wrap=True,
        )
    else:
        out.print(f"warehouse {result.path}: {len(result.nights)} night(s), up to date", soft_wrap=True)
    for where, values in result.others.items():
        counted = f" {where}: {sum(values.values())} row(s) counted as other"
        err.print(Text.assemble(("note:", "yellow"), counted), soft_wrap=True)
    for where in published:
        out.print(where, soft_wrap=True)
    return 0


# What the analyst tier does not have because it is personal: a query naming one of these (a
# column, the identity schema or the identity's landed table) is told where it is.
PERSONAL_NAMES = PERSONAL_COLUMNS | {"identity", "client_identity"}


def _identity_hint(error: str) -> str:
    """A hint naming ``--identified`` when a failed query wanted personal data."""
    if any(re.search(rf"\b{name}\b", error) for name in PERSONAL_NAMES):
        return (
            "; personal data (client numbers, names, contact, birth dates, addresses) is in the identified "
            "tier only: run `membersync sql --identified`, if your role allows it"
        )
    return ""


def run_docs_cli() -> int:
    """Generate dbt's docs site of the warehouse under the data dir and say where it is."""
    from membersync.warehouse.build.docs import DocsError, generate_docs

    data_dir = existing_data_dir()
    try:
        # No lock: the docs read a copy of the published catalog, which a build swaps atomically.
        page = generate_docs(data_dir)
    except DocsError as exc:
        raise UsageError(str(exc)) from None
    out.print(f"docs site: {page} (open it in a browser; one file, no server needed)", soft_wrap=True)
    out.print(
        f"for a web server: {page.with_name('index.html')} with manifest.json and catalog.json",
        soft_wrap=True,
    )
    return 0


def run_sql_cli(query: str, as_csv: bool = False, identified: bool = False) -> int:
    """Run ``query`` on the warehouse opened as a reader (the analyst tier's catalog, or with
    ``identified`` the identified tier's: read-only, reads only, no file but the tier's own);
    print a table (or CSV on stdout)."""
    _check_not_empty(query)
    data_dir = existing_data_dir()
    tier = "identified" if identified else "analyst"
    path = data_dir.catalog(tier)
    if not path.is_file():
        raise UsageError(f"no warehouse at {path}: run `membersync reports` first")
    try:
        with contextlib.closing(open_reader(data_dir, tier)) as con:
            check_reads_only(con, query)
            cursor = con.execute(query)
            if cursor is None:  # DuckDB answers None when there was no statement at all
                raise UsageError(EMPTY_QUERY)
            header = [d[0] for d in cursor.description or []]
            rows = cursor.fetchall() if header else []
    except ReaderRefused as exc:
        raise UsageError(f"SQL refused: {exc}") from None
    except duckdb.Error as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        raise UsageError(
            f"SQL failed: {first_line}{'' if identified else _identity_hint(first_line)}"
        ) from None
    if as_csv:
        _print_csv(header, rows)
    else:
        print_table(header, rows, footer=f"{len(rows)} row(s)", full_view="--csv prints every column")
    return 0


def run_reader_setup_cli(identified: bool = False) -> int:
    """Print the statements that make a DuckDB connection a reader of a tier (for a BI tool)."""
    from membersync.warehouse.build.catalog import reader_settings

    data_dir = existing_data_dir()
    tier = "identified" if identified else "analyst"
    sys.stdout.write(f"-- open {data_dir.catalog(tier)} read-only, then run:\n")
    sys.stdout.write("".join(f"{s};\n" for s in reader_settings(data_dir, tier)))
    return 0


def _print_csv(header: list[str], rows: list[tuple[Any, ...]]) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        writer.writerow([cell_text(v) for v in row])


EMPTY_QUERY = "empty query: nothing to run (only whitespace, semicolons or comments)"


def _check_not_empty(query: str) -> None:
    """Bad input before anything is opened: a query with no statement (blank, or only comments)."""
    try:
        # DuckDB's own parser knows its comments (`--`, `/* */`) and `--` inside a string literal.
        with contextlib.closing(duckdb.connect(":memory:")) as con:
            statements = con.extract_statements(query)
    except duckdb.Error:
        return  # a syntax error: the run on the warehouse reports it as "SQL failed: ..."
    if not statements:
        raise UsageError(EMPTY_QUERY)


def run_report_html_cli(night: dt.date | None) -> int:
    """Write the morning report of ``night`` (default: the newest) from the warehouse as built."""
    data_dir = existing_data_dir()
    try:
        path = write_morning_report(data_dir, night)
    except ExportError as exc:
        raise UsageError(str(exc)) from None
    out.print(f"morning report: {path}", soft_wrap=True)
    return 0
