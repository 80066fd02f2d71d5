"""``membersync freshness``: how old the newest committed night is; exit 0 fresh, 1 stale.

Meant for cron or a Prefect schedule beside the nightly sync: ``membersync freshness --notify``
sends one message through ``MEMBERSYNC_NOTIFY`` when the warehouse is stale (no message when
it is fresh). Bad input (a threshold that is not a positive number, a malformed or missing
``MEMBERSYNC_NOTIFY`` with ``--notify``) raises :class:`SettingsError`: one line, exit 2.
"""

from __future__ import annotations

from membersync.extract.settings import Settings, SettingsError
from membersync.flows.console import error, out
from membersync.flows.night.notify import NOTIFY_ENV, Notifier
from membersync.warehouse.landing import freshness
from membersync.warehouse.landing.manifest import ManifestError
from membersync.warehouse.landing.paths import DataDir

EXIT_FRESH, EXIT_STALE = 0, 1


def threshold_hours(max_age_hours: str | None, config: Settings) -> float:
    """``--max-age-hours`` when given (checked), else ``MEMBERSYNC_STALE_AFTER_HOURS``, else 36.

    The option arrives as text so that a bad value is our one line, not the parser's usage box.
    """
    if max_age_hours is None:
        return config.stale_after_hours
    return freshness.parse_hours(max_age_hours, "--max-age-hours")


def notifier_for(notify: bool, config: Settings) -> Notifier | None:
    """The notifier ``--notify`` asks for; checked before anything is read (bad input first)."""
    if not notify:
        return None
    notifier = Notifier.from_settings(config)
    if not notifier.enabled:
        raise SettingsError(f"missing setting {NOTIFY_ENV} (--notify sends through its Apprise URLs)")
    return notifier


def run_freshness_cli(max_age_hours: str | None, notify: bool = False) -> int:
    config = Settings.load()  # every MEMBERSYNC_* variable, read and checked once
    limit = threshold_hours(max_age_hours, config)
    notifier = notifier_for(notify, config)
    try:
        answer = freshness.check(DataDir.from_settings(config).manifests, limit)
    except ManifestError as exc:  # a manifest that cannot be read: the warehouse needs a look
        error(str(exc))
        return EXIT_STALE
    out.print(freshness.describe(answer), soft_wrap=True)
    if not answer.stale:
        return EXIT_FRESH
    if notifier is not None:
        notifier.stale(answer)
    return EXIT_STALE
