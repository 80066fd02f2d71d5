"""How a night runs: :class:`SyncOptions`, every field read from one setting."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from membersync.extract.settings import Settings
from membersync.flows.night import audit as A


@dataclass(frozen=True)
class SyncOptions:
    """How a night runs. Every field has a setting (see :meth:`from_settings`)."""

    batch_size: int = 250  # clients per batch (= per Prefect task run)
    batches_in_flight: int = 2  # so the tail of one batch overlaps the next
    lookback_days: int = 7  # the window, when whole_history is off: last committed night minus this
    points_start: dt.date = dt.date(2000, 1, 1)  # first night: points transactions from this date
    watermark_overlap: dt.timedelta = dt.timedelta(minutes=15)
    build: bool = True  # build the warehouse and export reports after the commit
    whole_history: bool = True  # off: later nights fetch only a window (misses late corrections)
    client_options: Any = None  # membersync.extract.client.ClientOptions | None
    audit: A.AuditOptions = field(default_factory=A.AuditOptions)  # the nightly self-audit
    store_reports: bool = False  # each store's own reports folder (MEMBERSYNC_STORE_REPORTS)
    store_notify: Any = None  # flows.notify.StoreNotifier: each store's morning report to its manager
    retention: Any = None  # extract.settings.RetentionPolicy, applied after each committed night

    @classmethod
    def from_settings(cls, settings: Settings) -> SyncOptions:
        """``MEMBERSYNC_BATCH_SIZE``, ``MEMBERSYNC_BATCHES_IN_FLIGHT``, ``MEMBERSYNC_LOOKBACK_DAYS``,
        ``MEMBERSYNC_POINTS_START`` (YYYY-MM-DD), ``MEMBERSYNC_WATERMARK_OVERLAP_MINUTES``,
        ``MEMBERSYNC_WHOLE_HISTORY`` (on/off), ``MEMBERSYNC_BUILD`` (on/off: the warehouse build
        after the commit), the self-audit's ``MEMBERSYNC_AUDIT_*`` and the client's options."""
        from membersync.extract.client import ClientOptions

        client_options = ClientOptions.from_settings(settings)
        return cls(
            batch_size=settings.batch_size,
            batches_in_flight=settings.batches_in_flight,
            lookback_days=settings.lookback_days,
            points_start=settings.points_start,
            watermark_overlap=dt.timedelta(minutes=settings.watermark_overlap_minutes),
            build=settings.build,
            whole_history=settings.whole_history,
            client_options=None if client_options == ClientOptions() else client_options,
            audit=A.AuditOptions.from_settings(settings),
            store_reports=settings.store_reports,
            store_notify=_store_notifier(settings),
            retention=settings.retention,
        )


def _store_notifier(settings: Settings) -> Any:
    from membersync.flows.night.notify import StoreNotifier

    notifier = StoreNotifier.from_settings(settings)
    return notifier if notifier.urls else None
