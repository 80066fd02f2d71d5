"""Everything a night exports, in one place: the report CSVs, their workbook, the HTML morning
report (and, with ``MEMBERSYNC_STORE_REPORTS=on``, each store's own folder), published to the
data location.

The night's build (:mod:`membersync.flows.night.nightly`), ``membersync reports`` and an erasure's
re-export (:mod:`membersync.warehouse.lifecycle.forget`) all call :func:`export_night`.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from membersync.extract.settings import Settings
from membersync.warehouse.exports.export import export_reports, night_stores
from membersync.warehouse.exports.morning import write_morning_report
from membersync.warehouse.landing.paths import DataDir
from membersync.warehouse.landing.remote import publish_reports, remove_reports

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Exported:
    """A night's report files: the chain's, each store's (with ``MEMBERSYNC_STORE_REPORTS=on``),
    and where each morning report was published (a URL on ``s3://``, else its path)."""

    paths: list[Path]
    published: list[str]
    store_reports: dict[str, tuple[Path, str]]  # storecode -> its morning report (path, published)


def export_night(data_dir: DataDir, night: dt.date | None = None, *, stores: bool | None = None) -> Exported:
    """Write a night's reports (default: the newest night), and each store's own when ``stores``
    (default: ``MEMBERSYNC_STORE_REPORTS``), then publish them to the data location."""
    if stores is None:
        stores = Settings.load().store_reports
    paths = export_reports(data_dir, night, None)
    paths.append(write_morning_report(data_dir, night))
    by_store: dict[str, Path] = {}
    for store in night_stores(data_dir, night) if stores else []:
        paths.extend(export_reports(data_dir, night, None, store))
        by_store[store] = write_morning_report(data_dir, night, store=store)
        paths.append(by_store[store])
    published = publish_reports(data_dir, paths)
    where = dict(zip(paths, published, strict=True))
    return Exported(paths, published, {s: (p, where[p]) for s, p in by_store.items()})


def reexport(data_dir: DataDir, nights: Sequence[str]) -> tuple[list[str], list[str]]:
    """Write again the reports of ``nights`` (ISO dates) that named a forgotten client. A night
    whose reports cannot be written again (retention removed it from the warehouse since) loses
    its report files instead, in the data location too: they name the client, so they cannot stay.
    Returns the nights written again and the nights whose reports were removed."""
    from membersync.warehouse.exports.export import ExportError

    done, removed = [], []
    for night in sorted(set(nights)):
        try:
            export_night(data_dir, dt.date.fromisoformat(night), stores=_had_stores(data_dir, night))
        except ExportError as exc:
            log.warning("reports of %s cannot be written again (%s): removed", night, exc)
            remove_reports(data_dir, night)
            removed.append(night)
            continue
        done.append(night)
    return done, removed


def _had_stores(data_dir: DataDir, night: str) -> bool:
    """Whether the night's store folders were written (they are written again with the rest)."""
    return (data_dir.reports / night / "stores").is_dir() or Settings.load().store_reports
