"""What a report is to its exports: how it is read and totalled (:class:`Report`, :class:`TotalRow`)
and one night of it as read (:class:`ReportTable`). Declared apart from the exports so that the
CSV writer (:mod:`membersync.warehouse.exports.export`) and the workbook
(:mod:`membersync.warehouse.exports.workbook`) both read it without importing each other."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TotalRow:
    """How a store report's TOTAL row is made: sums, and ratios recomputed from the sums."""

    sums: tuple[str, ...]
    derived: dict[str, Callable[[dict[str, Any]], Any]] = field(default_factory=dict)
    label_column: str = "storecode"


@dataclass(frozen=True)
class Report:
    name: str
    order_by: str
    per_night: bool = True  # False: the whole history up to the night (business_date <= night)
    total: TotalRow | None = None
    sheet: str = ""  # the workbook's sheet title (at most 31 characters, Excel's limit)
    where: str = ""  # the rows of the night when not per_night's (one ``?``: the night)
    relation: str = ""  # the view it is read from (default reports.<name>)
    model: str = ""  # its dbt model, whose YAML declares the columns (default: the name)

    @property
    def source(self) -> str:
        return self.relation or f"reports.{self.name}"

    @property
    def headings(self) -> dict[str, str]:
        """Column -> the heading a manager reads (``config.meta.heading`` beside the column's
        description in the dbt YAML); the CSVs keep the column names analysts script against."""
        return dict(_declared_headings().get(self.model or self.name, ()))


@functools.cache
def _declared_headings() -> dict[str, tuple[tuple[str, str], ...]]:
    from membersync.warehouse.build.dbt_run import SQL_DIR, model_yaml

    return {
        str(model["name"]): tuple(
            (str(column["name"]), str(heading))
            for column in model.get("columns", [])
            if (heading := ((column.get("config") or {}).get("meta") or {}).get("heading"))
        )
        for model in model_yaml(SQL_DIR)
    }


@dataclass(frozen=True)
class ReportTable:
    """One report of one night as exported: the same rows feed the CSV and the workbook sheet."""

    report: Report
    header: list[str]  # the column names (the CSV's header)
    types: list[str]  # the DuckDB type of each column, e.g. "DECIMAL(38,2)", "VARCHAR", "DATE"
    rows: list[list[Any]]  # in export order; the TOTAL row last when the report has one

    @property
    def has_total(self) -> bool:
        return self.report.total is not None

    @property
    def headings(self) -> list[str]:
        """The workbook's header: each column's declared heading (its name if it has none)."""
        declared = self.report.headings
        return [declared.get(name, name) for name in self.header]
