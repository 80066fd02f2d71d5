"""The night's reports as one XLSX workbook, one sheet per report, for managers' spreadsheets.

A CSV loses what a spreadsheet guesses wrong (client number ``000718`` becomes ``718``, money
``101.80`` shows as ``101.8``); typed cells keep it:

- every string (client numbers, storecodes with their trailing spaces, names) is a text cell
  written with ``write_string``, so nothing is ever read as a number or run as a formula;
- DECIMAL money (scale 2) is a number shown ``#,##0.00``, rates (scale 4) ``0.0000``, counts
  integers, dates real dates shown ``yyyy-mm-dd``;
- a title line (the report, the store or "all stores", the night), then a bold header row of
  human headings (declared beside each column's description in the dbt YAML; the CSVs keep the
  column names), both frozen, with an autofilter (over the rows, not the TOTAL row, so sorting
  keeps the TOTAL last), columns as wide as their content, TOTAL rows bold;
- printed landscape, fit to the page width, the title and header repeated on every page.

The rows come from :func:`membersync.warehouse.exports.export.read_report`, the same as the CSV's. The
workbook's creation time is the night, so a rerun on the same data writes identical bytes.
"""

from __future__ import annotations

import datetime as dt
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import xlsxwriter
from xlsxwriter.format import Format
from xlsxwriter.worksheet import Worksheet

if TYPE_CHECKING:
    from membersync.warehouse.exports.report_table import ReportTable

MONEY_FORMAT = "#,##0.00"
RATE_FORMAT = "0.0000"
INTEGER_FORMAT = "0"
DATE_FORMAT = "yyyy-mm-dd"
DATETIME_FORMAT = "yyyy-mm-dd hh:mm:ss"
# LibreOffice shows a boolean cell of format General as 1/0 now and then; this shows TRUE/FALSE.
BOOLEAN_FORMAT = '"TRUE";"TRUE";"FALSE"'
TEXT_FORMAT = "@"  # a value typed into a text column later stays text (a client number keeps its zeros)

MAX_SHEET_TITLE = 31  # Excel refuses longer sheet names
TITLE_ROW, HEADER_ROW, FIRST_ROW = 0, 1, 2
TITLE_FONT_SIZE = 13
MIN_WIDTH, MAX_WIDTH = 6, 60
FILTER_BUTTON_WIDTH = 3  # the autofilter's drop-down button covers the end of the header text

_DECIMAL = re.compile(r"^DECIMAL\(\d+,\s*(\d+)\)$")
_INTEGER_TYPES = frozenset(
    ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT")
)


@dataclass(frozen=True)
class ColumnStyle:
    """How one column is shown: its number format, and how wide one of its values reads."""

    number_format: str
    decimals: int | None = None  # for numbers shown with a fixed count of decimals

    def display(self, value: Any) -> str:
        """The value as the spreadsheet shows it (used only to size the column)."""
        if value is None:
            return ""
        if isinstance(value, bool):
            return "TRUE" if value else "FALSE"
        if isinstance(value, int | float | Decimal):
            grouping = "," if self.number_format == MONEY_FORMAT else ""
            return f"{float(value):{grouping}.{self.decimals or 0}f}"
        if isinstance(value, dt.datetime):
            return value.strftime("%Y-%m-%d %H:%M:%S")
        if isinstance(value, dt.date):
            return value.isoformat()
        return str(value)


def column_style(duckdb_type: str) -> ColumnStyle:
    """The style of a column from its DuckDB type (DECIMAL scale 2 is money, scale 4 a rate)."""
    decimal = _DECIMAL.match(duckdb_type)
    if decimal:
        scale = int(decimal.group(1))
        if scale == 2:
            return ColumnStyle(MONEY_FORMAT, 2)
        if scale == 4:
            return ColumnStyle(RATE_FORMAT, 4)
        return ColumnStyle("0." + "0" * scale if scale else INTEGER_FORMAT, scale)
    if duckdb_type in _INTEGER_TYPES:
        return ColumnStyle(INTEGER_FORMAT, 0)
    if duckdb_type == "DATE":
        return ColumnStyle(DATE_FORMAT)
    if duckdb_type.startswith("TIMESTAMP"):
        return ColumnStyle(DATETIME_FORMAT)
    if duckdb_type == "BOOLEAN":
        return ColumnStyle(BOOLEAN_FORMAT)
    if duckdb_type in ("DOUBLE", "FLOAT"):
        return ColumnStyle("General")
    return ColumnStyle(TEXT_FORMAT)


class _Formats:
    """One xlsxwriter format per (number format, bold), made on first use."""

    def __init__(self, workbook: xlsxwriter.Workbook) -> None:
        self.workbook = workbook
        self.made: dict[tuple[str, bool, int | None], Format] = {}

    def get(self, number_format: str, bold: bool = False, size: int | None = None) -> Format:
        key = (number_format, bold, size)
        if key not in self.made:
            properties: dict[str, Any] = {"num_format": number_format, "bold": bold}
            if size is not None:
                properties["font_size"] = size
            if number_format in (DATE_FORMAT, DATETIME_FORMAT):
                # centred: a right-aligned date would run into the left-aligned text beside it
                properties["align"] = "center"
            self.made[key] = self.workbook.add_format(properties)
        return self.made[key]


def render_workbook(
    tables: Sequence[ReportTable], night: dt.date, store: str | None = None, store_name: str | None = None
) -> bytes:
    """The workbook's bytes: one sheet per report table, in the order given (``store``: a store's
    own workbook, named in its title and each sheet's title line, with ``store_name``)."""
    buffer = io.BytesIO()
    options = {
        "in_memory": True,
        # Belt and braces: cells are written with typed calls, never the guessing write().
        "strings_to_numbers": False,
        "strings_to_formulas": False,
        "strings_to_urls": False,
        "remove_timezone": True,
    }
    workbook = xlsxwriter.Workbook(buffer, options)
    workbook.set_properties(
        {
            "title": f"Reports {night.isoformat()}" + (f" {store.rstrip()}" if store else ""),
            "created": dt.datetime.combine(night, dt.time()),
        }
    )
    formats = _Formats(workbook)
    where = (
        "all stores"
        if store is None
        else f"{store_name} ({store.rstrip()})"
        if store_name
        else store.rstrip()
    )
    for table in tables:
        title = f"{sheet_title(table)} \u2014 {where} \u2014 night of {night.isoformat()}"
        _write_sheet(workbook.add_worksheet(sheet_title(table)), table, title, formats)
    workbook.close()
    return buffer.getvalue()


def sheet_title(table: ReportTable) -> str:
    title = table.report.sheet or table.report.name.replace("_", " ").capitalize()
    return title[:MAX_SHEET_TITLE]


def _write_sheet(sheet: Worksheet, table: ReportTable, title: str, formats: _Formats) -> None:
    styles = [column_style(t) for t in table.types]
    # The title runs over the empty cells to its right, as a spreadsheet shows long text.
    sheet.write_string(TITLE_ROW, 0, title, formats.get("General", bold=True, size=TITLE_FONT_SIZE))
    header_format = formats.get("General", bold=True)
    for col, heading in enumerate(table.headings):
        sheet.write_string(HEADER_ROW, col, heading, header_format)
    total_index = len(table.rows) - 1 if table.has_total else None
    for index, row in enumerate(table.rows):
        bold = index == total_index
        for col, value in enumerate(row):
            _write_cell(sheet, FIRST_ROW + index, col, value, formats.get(styles[col].number_format, bold))
    _set_widths(sheet, table, styles)
    last_col = max(len(table.header) - 1, 0)
    body_rows = len(table.rows) - (1 if table.has_total else 0)
    sheet.freeze_panes(FIRST_ROW, 0)
    sheet.autofilter(HEADER_ROW, 0, HEADER_ROW + body_rows, last_col)
    sheet.set_landscape()
    sheet.fit_to_pages(1, 0)  # one page wide, as many pages tall as it takes
    sheet.repeat_rows(TITLE_ROW, HEADER_ROW)


def _write_cell(sheet: Worksheet, row: int, col: int, value: Any, cell_format: Format) -> None:
    if value is None:
        sheet.write_blank(row, col, None, cell_format)
    elif isinstance(value, bool):
        sheet.write_boolean(row, col, value, cell_format)
    elif isinstance(value, int | float | Decimal):
        # A double holds every amount to the cent exactly enough (15 significant digits).
        sheet.write_number(row, col, float(value), cell_format)
    elif isinstance(value, dt.date):  # datetime is a date too
        sheet.write_datetime(row, col, value, cell_format)
    else:
        sheet.write_string(row, col, str(value), cell_format)


def _set_widths(sheet: Worksheet, table: ReportTable, styles: list[ColumnStyle]) -> None:
    for col, heading in enumerate(table.headings):
        longest = max(
            [len(heading) + FILTER_BUTTON_WIDTH, *(len(styles[col].display(row[col])) for row in table.rows)]
        )
        # +1: bold TOTAL and header text is a little wider than the character count says.
        sheet.set_column(col, col, min(max(longest + 1, MIN_WIDTH), MAX_WIDTH))
