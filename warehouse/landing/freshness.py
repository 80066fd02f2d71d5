"""How old the newest committed night is: plain functions over the landing zone's manifests.

The newest committed night is the manifest with the latest ``snapshot_date`` under
``DATA_DIR/landing/_manifests``; its age is the time since its ``committed_at`` (this
machine's clock, written by the commit). The warehouse is *stale* when that age exceeds the
threshold (``MEMBERSYNC_STALE_AFTER_HOURS``, default 36: a nightly schedule plus a day's
slack), or when no night was ever committed.

Only the newest manifest is read, so the check costs the same after a year of nights.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from pathlib import Path

from membersync.extract.settings import SettingsError
from membersync.warehouse.landing.manifest import read_manifest


@dataclass(frozen=True)
class NewestNight:
    """The newest committed night and when it was committed (UTC)."""

    night: dt.date
    committed_at: dt.datetime


@dataclass(frozen=True)
class Freshness:
    """The answer of one check: the newest night (None: nothing committed) against a threshold."""

    newest: NewestNight | None
    age: dt.timedelta | None
    max_age: dt.timedelta

    @property
    def stale(self) -> bool:
        return self.age is None or self.age > self.max_age


def parse_hours(raw: str, name: str) -> float:
    """A positive, finite number of hours, or a one-line :class:`SettingsError` naming ``name``."""
    try:
        hours = float(raw.strip())
    except ValueError:
        raise SettingsError(f"{name} must be a number of hours, got {raw.strip()!r}") from None
    if not math.isfinite(hours) or hours <= 0:
        raise SettingsError(f"{name} must be a positive number of hours, got {raw.strip()!r}")
    return hours


def committed_nights(manifests_dir: Path) -> list[dt.date]:
    """Nights with a manifest, oldest first, from the file names alone (temporary files are not commits)."""
    if not manifests_dir.exists():
        return []
    nights = []
    for path in manifests_dir.glob("????-??-??.json"):
        try:
            nights.append(dt.date.fromisoformat(path.stem))
        except ValueError:  # a stray file shaped like a date but not one: not a commit
            continue
    return sorted(nights)


def parse_committed_at(text: str) -> dt.datetime:
    """``committed_at`` (``2026-11-21T02:14:03Z``) as an aware UTC datetime; naive text is taken as UTC."""
    moment = dt.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.UTC)


def newest_night(manifests_dir: Path) -> NewestNight | None:
    """The newest committed night, or None when none is. A malformed manifest raises ManifestError."""
    nights = committed_nights(manifests_dir)
    if not nights:
        return None
    manifest = read_manifest(manifests_dir, nights[-1])
    if manifest is None:  # removed between the listing and the read: look again
        return newest_night(manifests_dir)
    return NewestNight(manifest.snapshot_date, parse_committed_at(manifest.committed_at))


def age_of(newest: NewestNight, now: dt.datetime) -> dt.timedelta:
    """Time since the commit; never negative (a clock set back after the commit reads as just now)."""
    return max(now - newest.committed_at, dt.timedelta(0))


def check(manifests_dir: Path, max_age_hours: float, now: dt.datetime | None = None) -> Freshness:
    """How fresh the landing zone under ``manifests_dir`` is, against ``max_age_hours``."""
    now = now or dt.datetime.now(dt.UTC)
    newest = newest_night(manifests_dir)
    age = age_of(newest, now) if newest is not None else None
    return Freshness(newest, age, dt.timedelta(hours=max_age_hours))


def hours(delta: dt.timedelta) -> str:
    """A duration as hours with one decimal (``40.5 h``), the unit of the threshold."""
    return f"{delta.total_seconds() / 3600:.1f} h"


def describe(freshness: Freshness) -> str:
    """One line: the newest night, when it was committed, its age, and the verdict."""
    verdict = "stale" if freshness.stale else "fresh"
    limit = f"threshold {hours(freshness.max_age)}"
    if freshness.newest is None or freshness.age is None:
        return f"no night committed yet: {verdict} ({limit})"
    committed = f"{freshness.newest.committed_at:%Y-%m-%dT%H:%M:%SZ}"
    return (
        f"newest committed night {freshness.newest.night}, committed {committed}, "
        f"{hours(freshness.age)} ago: {verdict} ({limit})"
    )
