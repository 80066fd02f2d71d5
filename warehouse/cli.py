"""What ``membersync reports`` and ``membersync sql`` do (the typer wiring is in ``flows/cli.py``).

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
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import duckdb
from membersync.extract.settings import Settings, UsageError
from membersync.models.tables import CLIENT_IDENTITY
from membersync.warehouse.build import BuildError, BuildInputError, build_warehouse, committed_nights
from membersync.warehouse.export import ExportError, cell_text, check_report_names, export_reports
from membersync.warehouse.landing import AlreadyRunning, LandingZone
from membersync.warehouse.manifest import ManifestError
from membersync.warehouse.paths import DataDir
from membersync.warehouse.storage import StoreError, publish_reports, refresh_mirror
from membersync.warehouse.upkeep import upkeep
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text

log = logging.getLogger(__name__)


def _usage_error(message: str) -> Exception:
    return UsageError(message)


def _data_dir() -> DataDir:
    data_dir = DataDir.from_settings(Settings.load())
    if data_dir.remote is None and not data_dir.root.is_dir():  # s3://: the working dir is made
        raise _usage_error(f"data dir {data_dir.root} does not exist (set MEMBERSYNC_DATA_DIR)")
    return data_dir


def run_reports_cli(night: dt.date | None, reports: list[str] | None, *, full_refresh: bool = False) -> int:
    """Build the warehouse from the landing zone (no call to the service), then export the CSVs.

    The build adds the committed nights the warehouse lacks; ``full_refresh`` rebuilds them all.
    """
    err = Console(stderr=True, highlight=False)
    out = Console(highlight=False)
    try:
        names = check_report_names(reports)
        data_dir = _data_dir()
        refresh_mirror(data_dir)  # an s3:// location: its committed files, mirrored in the working dir
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
        with LandingZone(data_dir).lock() as zone:
            upkeep(zone)  # a data dir of the earlier layout migrated, pending erasures finished
            result = build_warehouse(data_dir, full_refresh=full_refresh)
            paths = export_reports(data_dir, night, names)
            published = publish_reports(data_dir, paths)  # s3://: uploaded; else the paths
    except AlreadyRunning as exc:
        err.print(
            f"[bold red]error:[/] {exc}; it rebuilds the warehouse when it commits, "
            "or run `membersync reports` again after it",
            soft_wrap=True,
        )
        return 1
    except (ExportError, BuildInputError, ManifestError) as exc:
        raise _usage_error(str(exc)) from None
    except (BuildError, StoreError) as exc:
        err.print(f"[bold red]error:[/] {exc}", soft_wrap=True)
        return 1
    if result.built_nights:
        how = "rebuilt whole" if result.full_refresh else "built incrementally"
        out.print(
            f"warehouse {result.path}: {len(result.nights)} night(s), {len(result.built_nights)} {how}, "
            f"{result.checks} checks passed",
            soft_wrap=True,
        )
    else:
        out.print(f"warehouse {result.path}: {len(result.nights)} night(s), up to date", soft_wrap=True)
    for where, values in result.others.items():
        err.print(f"[yellow]note:[/] {where}: {sum(values.values())} row(s) counted as other", soft_wrap=True)
    for where in published:
        out.print(where, soft_wrap=True)
    return 0


# What the analyst tier does not have because it is personal: a query naming one of these (a
# column, the identity schema or the identity's landed table) is told where it is.
PERSONAL_NAMES = frozenset(
    {
        "client_number",
        "client_name",
        "identity",
        "client_identity",
        *(c.name for c in CLIENT_IDENTITY.columns),
    }
    - {"client_key", "identity_digest"}
)


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
    from membersync.warehouse.docs import DocsError, generate_docs

    data_dir = _data_dir()
    try:
        # No lock: the docs read a copy of the published catalog, which a build swaps atomically.
        page = generate_docs(data_dir)
    except DocsError as exc:
        raise _usage_error(str(exc)) from None
    out = Console(highlight=False)
    out.print(f"docs site: {page} (open it in a browser; one file, no server needed)", soft_wrap=True)
    out.print(
        f"for a web server: {page.with_name('index.html')} with manifest.json and catalog.json",
        soft_wrap=True,
    )
    return 0


def run_sql_cli(query: str, as_csv: bool = False, identified: bool = False) -> int:
    """Run ``query`` on the warehouse opened read-only (the analyst tier's catalog, or with
    ``identified`` the identified tier's); print a table (or CSV on stdout)."""
    _check_not_empty(query)
    data_dir = _data_dir()
    path = data_dir.catalog("identified" if identified else "analyst")
    if not path.is_file():
        raise _usage_error(f"no warehouse at {path}: run `membersync reports` first")
    try:
        with contextlib.closing(duckdb.connect(str(path), read_only=True)) as con:
            con.execute("SET TimeZone = 'UTC'")
            cursor = con.execute(query)
            if cursor is None:  # DuckDB answers None when there was no statement at all
                raise _usage_error(EMPTY_QUERY)
            header = [d[0] for d in cursor.description or []]
            rows = cursor.fetchall() if header else []
    except duckdb.Error as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        raise _usage_error(
            f"SQL failed: {first_line}{'' if identified else _identity_hint(first_line)}"
        ) from None
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
        raise _usage_error(EMPTY_QUERY)


# Numbers, dates, times and booleans are shown whole or not at all: a cut `16273.…` or
# `2024-12-…` reads as a different value. Text may fold over several lines, never be cut.
WHOLE_TYPES = (int, float, Decimal, dt.date, dt.time, dt.timedelta)
TEXT_MIN_WIDTH = 8  # text columns fold down to this before trailing columns are left out
NULL_TEXT = "NULL"


@dataclass(frozen=True)
class _Column:
    name: str
    cells: list[Text]
    whole: bool  # a number, date, time or boolean column: never cut, never folded
    numeric: bool  # right-aligned, so that the digits line up

    @property
    def data_width(self) -> int:
        return max((c.cell_len for c in self.cells), default=0)

    @property
    def natural_width(self) -> int:
        return max(self.data_width, cell_len(self.name), 1)

    @property
    def narrowest(self) -> int:
        """The least width it may get: whole values stay whole (the header folds above them)."""
        return max(self.data_width, 1) if self.whole else min(self.natural_width, TEXT_MIN_WIDTH)


def _columns(header: list[str], rows: list[tuple[Any, ...]]) -> list[_Column]:
    columns = []
    for index, name in enumerate(header):
        values = [row[index] for row in rows]
        first = next((v for v in values if v is not None), None)
        whole = isinstance(first, WHOLE_TYPES)  # bool is an int; datetime is a date
        numeric = isinstance(first, (int, float, Decimal)) and not isinstance(first, bool)
        cells = [Text(NULL_TEXT, style="dim") if v is None else Text(cell_text(v)) for v in values]
        columns.append(_Column(name, cells, whole, numeric))
    return columns


def _table_width(widths: list[int]) -> int:
    """Width of our table around cells of ``widths``: a border per column and one more, padding 1+1."""
    return sum(widths) + 3 * len(widths) + 1


def _fit(columns: list[_Column], width: int) -> tuple[list[_Column], list[int] | None]:
    """The leading columns that fit in ``width`` and each one's width (None: even one does not fit).

    Text columns fold first (down to TEXT_MIN_WIDTH, widest first), then the headers above whole
    values; when even that is too wide, trailing columns are left out.
    """
    kept = list(columns)
    while len(kept) > 1 and _table_width([c.narrowest for c in kept]) > width:
        kept.pop()
    widths = [c.natural_width for c in kept]
    if _table_width([c.narrowest for c in kept]) > width:
        return kept, None  # one column wider than the terminal: rich folds it, nothing is cut
    for whole in (False, True):  # text columns first, then the headers above whole values
        while _table_width(widths) > width:
            shrinkable = [i for i, c in enumerate(kept) if c.whole == whole and widths[i] > c.narrowest]
            if not shrinkable:
                break
            widest = max(shrinkable, key=lambda i: widths[i])
            widths[widest] -= 1
    return kept, widths


def _print_table(
    header: list[str],
    rows: list[tuple[Any, ...]],
    out: Console | None = None,
    err: Console | None = None,
) -> None:
    out = out or Console(highlight=False)
    err = err or Console(stderr=True, highlight=False)
    columns = _columns(header, rows)
    kept, widths = _fit(columns, out.width)
    table = RichTable(show_header=True, header_style="bold")
    for index, column in enumerate(kept):
        table.add_column(
            column.name,
            width=None if widths is None else widths[index],
            justify="right" if column.numeric else "left",
            overflow="fold",  # never "…": what does not fit goes on the next line
        )
    for row_index in range(len(rows)):
        table.add_row(*(column.cells[row_index] for column in kept))
    out.print(table)
    out.print(f"{len(rows)} row(s)", style="dim")
    left_out = [c.name for c in columns[len(kept) :]]
    if left_out:
        err.print(
            f"[yellow]note:[/] {len(left_out)} column(s) left out to fit {out.width} characters: "
            f"{_escape(', '.join(left_out))} (--csv prints every column)",
            soft_wrap=True,
        )


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
