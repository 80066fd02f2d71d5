"""One printer for every table the CLI shows (``membersync sql``, the demo, ``forget``,
``audit``, ``sync``'s summary): fitted to the terminal, numbers and dates never cut.

A table wider than the terminal folds its text columns first, then the headers above whole
values; when even that does not fit, trailing columns are left out and a note on stderr names
them. A value is never shortened to ``…``: ``29638.…`` reads as another amount.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from membersync.warehouse.exports.export import cell_text
from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable
from rich.text import Text

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


def _columns(
    header: list[str], rows: list[tuple[Any, ...]], null_text: str, unfolded: tuple[str, ...]
) -> list[_Column]:
    columns = []
    for index, name in enumerate(header):
        values = [row[index] for row in rows]
        first = next((v for v in values if v is not None), None)
        whole = isinstance(first, WHOLE_TYPES) or name in unfolded  # bool is an int; datetime is a date
        numeric = isinstance(first, (int, float, Decimal)) and not isinstance(first, bool)
        cells = [Text(null_text, style="dim") if v is None else Text(cell_text(v)) for v in values]
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


def print_table(
    header: list[str],
    rows: list[tuple[Any, ...]],
    *,
    title: str | None = None,
    show_header: bool = True,
    footer: str | None = None,
    full_view: str = "",
    null_text: str = NULL_TEXT,
    right_aligned: tuple[str, ...] = (),
    unfolded: tuple[str, ...] = (),
    out: Console | None = None,
    err: Console | None = None,
) -> None:
    """Print ``rows`` under ``header`` fitted to ``out``'s width; ``footer`` (dim) below it.

    Numbers are right-aligned, and so are the columns named in ``right_aligned`` (figures
    already formatted as text). The columns named in ``unfolded`` (a summary's labels) are kept
    whole like numbers, so the other text columns fold first. Columns left out to fit are named
    on ``err``, with ``full_view`` saying how to see them all.
    """
    out = out or Console(highlight=False)
    err = err or Console(stderr=True, highlight=False)
    columns = _columns(header, rows, null_text, unfolded)
    kept, widths = _fit(columns, out.width)
    table = RichTable(title=title, title_justify="left", show_header=show_header, header_style="bold")
    for index, column in enumerate(kept):
        table.add_column(
            column.name,
            width=None if widths is None else widths[index],
            justify="right" if column.numeric or column.name in right_aligned else "left",
            overflow="fold",  # never "…": what does not fit goes on the next line
        )
    for row_index in range(len(rows)):
        table.add_row(*(column.cells[row_index] for column in kept))
    out.print(table)
    if footer:
        out.print(footer, style="dim")
    left_out = [c.name for c in columns[len(kept) :]]
    if left_out:
        err.print(
            f"[yellow]note:[/] {len(left_out)} column(s) left out to fit {out.width} characters: "
            f"{escape(', '.join(left_out))}{f' ({full_view})' if full_view else ''}",
            soft_wrap=True,
            markup=True,  # its own markup; the names are escaped
        )


@dataclass
class TableRows:
    """Rows gathered one at a time (a benchmark adds them as it measures), printed by
    :func:`print_table` at the end."""

    header: list[str]
    title: str | None = None
    right_aligned: tuple[str, ...] = ()
    rows: list[tuple[Any, ...]] = field(default_factory=list)

    def add_row(self, *cells: Any) -> None:
        self.rows.append(cells)

    def print(self, out: Console | None = None) -> None:
        print_table(self.header, self.rows, title=self.title, right_aligned=self.right_aligned, out=out)
