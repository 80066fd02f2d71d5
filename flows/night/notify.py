"""A word when a night fails or the warehouse goes stale, through Apprise URLs.

``MEMBERSYNC_NOTIFY`` holds one or more Apprise URLs (``json://host:port/path``,
``mailtos://...``, ``slack://...``, ``msteams://...``), separated by commas or spaces. Each is
checked with Apprise when a command starts: one that Apprise cannot use is a one-line
:class:`SettingsError` naming ``MEMBERSYNC_NOTIFY`` and the entry's position (never its text:
a notification URL often holds a token).

A message is a title and a body; a JSON receiver gets them as the ``title`` and ``message``
fields. The body is ``key: value`` lines (tenant, night, error, resume) so that a person and
a script both read it. Every text goes through :func:`membersync.extract.redact.scrub` with the
service credentials as extra values: an error line may name the user ("wrong credentials
(user ...)"), a message never does.

Who sends: ``membersync sync`` for the nights it runs (Prefect on or off), and the flow run
itself for a night a deployment runs (``serve``'s schedule, a tenant's work pool):
:func:`membersync.flows.night.prefect_flow.run_night_in_flow`. One message per failed night.

Delivery never decides an exit code: a receiver that is down or refuses is one warning in the
log, and the command ends as it would have without it.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from membersync.extract import redact
from membersync.extract.settings import Settings, SettingsError, env_name
from membersync.warehouse.landing.freshness import Freshness, hours

log = logging.getLogger(__name__)

NOTIFY_ENV = env_name("notify")
_SEPARATORS = re.compile(r"[,\s]+")


@dataclass(frozen=True)
class Message:
    title: str
    body: str
    failure: bool = True  # Apprise's type: "failure" for a failed night, "warning" for staleness


def split_urls(raw: str) -> list[str]:
    return [part for part in _SEPARATORS.split(raw.strip()) if part]


def _quiet_apprise_logger() -> logging.Logger:
    """Apprise's logger: masked like ours, and never printed by Python's last-resort handler.

    Without a handler of its own, a record from Apprise reaches stderr when the command has
    no log file yet, which would break the one-line errors; with the log file it lands there.
    """
    logger = logging.getLogger("apprise")
    if not any(isinstance(f, redact.RedactingFilter) for f in logger.filters):
        logger.addFilter(redact.RedactingFilter())
        logger.addHandler(logging.NullHandler())
    return logger


def check_urls(urls: list[str], env: str = NOTIFY_ENV) -> None:
    """Raise a one-line SettingsError (naming ``env``) when Apprise cannot use one of ``urls``."""
    if not urls:
        return  # no import of Apprise (a few hundred ms) for a command that sends nothing
    import apprise

    _quiet_apprise_logger()
    for position, url in enumerate(urls, start=1):
        if apprise.Apprise.instantiate(url) is None:
            scheme = urlsplit(url).scheme or "none"
            raise SettingsError(
                f"{env}: entry {position} of {len(urls)} is not an Apprise URL it can use "
                f"(scheme {scheme!r}; e.g. json://host:port/path, mailtos://..., slack://...)"
            )
        # An Apprise URL may carry a token or a password: mask it if a log line ever shows it.
        redact.register_secret(url)


def tenant_name(settings: Settings) -> str:
    """``MEMBERSYNC_TENANT``, else the service's host name, else a generic name."""
    if settings.tenant:
        return settings.tenant
    return (urlsplit(settings.base_url).hostname if settings.base_url else None) or "membersync"


def _credentials(settings: Settings) -> tuple[str, ...]:
    """The service credentials in every rendering a text could hold, for :func:`redact.scrub`."""
    username = settings.username.get_secret_value() if settings.username else ""
    password = settings.password.get_secret_value() if settings.password else ""
    if username and password:
        redact.register_credentials(username, password)
    return tuple(value for value in (username, password) if value)


@dataclass(frozen=True)
class Notifier:
    """Where messages go (none: a notifier that does nothing) and what they must never hold."""

    urls: tuple[str, ...]
    tenant: str
    secrets: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> Notifier:
        urls = split_urls(settings.notify.get_secret_value() if settings.notify else "")
        check_urls(urls)
        return cls(tuple(urls), tenant_name(settings), _credentials(settings))

    @property
    def enabled(self) -> bool:
        return bool(self.urls)

    def clean(self, text: str) -> str:
        return redact.scrub(text, extra=self.secrets)

    def send(self, message: Message) -> bool:
        """Deliver ``message`` to every URL; True when all took it. Failures are a warning, never raised."""
        if not self.enabled:
            return True
        title, body = self.clean(message.title), self.clean(message.body)
        try:
            delivered = _deliver(self.urls, title, body, message.failure)
        except Exception as exc:  # a notification must never change how the command ends
            log.warning("notification not sent: %s", redact.scrub(f"{type(exc).__name__}: {exc}"))
            return False
        if not delivered:
            log.warning("notification not delivered to every receiver of %s", NOTIFY_ENV)
        return delivered

    def night_failed(self, night: dt.date, error_line: str, resume: str, interrupted: bool = False) -> bool:
        return self.send(night_failed_message(self.tenant, night, error_line, resume, interrupted))

    def stale(self, freshness: Freshness) -> bool:
        return self.send(stale_message(self.tenant, freshness))


def _deliver(
    urls: tuple[str, ...], title: str, body: str, failure: bool | None, attach: str | None = None
) -> bool:
    """``failure``: True a failed night, False a warning (staleness), None news (a store's report)."""
    import apprise

    _quiet_apprise_logger()
    sender = apprise.Apprise()
    for url in urls:
        sender.add(url)
    kinds = {
        True: apprise.NotifyType.FAILURE,
        False: apprise.NotifyType.WARNING,
        None: apprise.NotifyType.INFO,
    }
    kind = kinds[failure]
    # TEXT: the body is sent as written (no Markdown/HTML conversion of the error line).
    return bool(
        sender.notify(
            body=body, title=title, notify_type=kind, body_format=apprise.NotifyFormat.TEXT, attach=attach
        )
    )


# --- each store's morning report, to its manager ----------------------------------------------------

STORE_NOTIFY_ENV = env_name("store_notify")


def parse_store_notify(raw: str) -> dict[str, tuple[str, ...]]:
    """``MEMBERSYNC_STORE_NOTIFY``: ``storecode=URL [URL...]`` pairs, separated by ``;`` or new
    lines, or ``@path`` of a file of such lines. The storecode is everything before the first
    ``=``, verbatim (a storecode may end in spaces); a SettingsError names the pair, never a URL."""
    text = raw
    if raw.startswith("@"):
        try:
            text = Path(raw[1:]).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SettingsError(
                f"{STORE_NOTIFY_ENV}: cannot read {raw[1:]}: {getattr(exc, 'strerror', exc)}"
            ) from None
    out: dict[str, tuple[str, ...]] = {}
    pairs = [p.rstrip("\r") for p in re.split(r"[;\n]", text) if p.strip() and not p.lstrip().startswith("#")]
    for position, pair in enumerate(pairs, start=1):
        store, sep, urls = pair.partition("=")
        if not sep or not store or not split_urls(urls):
            raise SettingsError(f"{STORE_NOTIFY_ENV}: pair {position} is not storecode=URL")
        if store in out:
            raise SettingsError(f"{STORE_NOTIFY_ENV}: pair {position} names store {store!r} again")
        check_urls(split_urls(urls), STORE_NOTIFY_ENV)
        out[store] = tuple(split_urls(urls))
    return out


@dataclass(frozen=True)
class StoreNotifier:
    """Each store's morning report to the managers of that store (one message per store)."""

    urls: Mapping[str, tuple[str, ...]]
    tenant: str

    @classmethod
    def from_settings(cls, settings: Settings) -> StoreNotifier:
        raw = settings.store_notify.get_secret_value() if settings.store_notify else ""
        return cls(parse_store_notify(raw) if raw else {}, tenant_name(settings))

    def send(self, night: dt.date, reports: Mapping[str, tuple[Path, str]]) -> dict[str, bool]:
        """One message per store with a receiver and a report: the report attached, its
        location in the body. Returns store -> delivered (failures are warnings)."""
        sent = {}
        for store, urls in sorted(self.urls.items()):
            if store not in reports:
                log.warning("%s names store %r, which has no report on %s", STORE_NOTIFY_ENV, store, night)
                continue
            path, where = reports[store]
            title = f"membersync {self.tenant}: {store.rstrip()} morning report {night.isoformat()}"
            body = _lines(
                {"tenant": self.tenant, "store": store.rstrip(), "night": night.isoformat(), "report": where}
            )
            try:
                sent[store] = _deliver(urls, title, body, None, attach=str(path))
            except Exception as exc:  # a notification must never change how the night ends
                log.warning("store report not sent: %s", redact.scrub(f"{type(exc).__name__}: {exc}"))
                sent[store] = False
        return sent


def _lines(fields: Mapping[str, str]) -> str:
    return "\n".join(f"{key}: {value}" for key, value in fields.items())


def resume_command(night: dt.date, full: bool = False) -> str:
    """The command that resumes (or re-runs) ``night`` where it stopped."""
    return f"membersync sync --date {night.isoformat()}" + (" --full" if full else "")


def night_failed_message(
    tenant: str, night: dt.date, error_line: str, resume: str, interrupted: bool = False
) -> Message:
    what = "was interrupted" if interrupted else "failed"
    fields = {"tenant": tenant, "night": night.isoformat(), "error": error_line, "resume": resume}
    return Message(f"membersync {tenant}: night {night} {what}", _lines(fields))


def stale_message(tenant: str, freshness: Freshness) -> Message:
    limit = hours(freshness.max_age)
    if freshness.newest is None or freshness.age is None:
        title = f"membersync {tenant}: no night committed yet"
        fields = {"tenant": tenant, "newest night": "none", "threshold": limit}
    else:
        age = hours(freshness.age)
        title = f"membersync {tenant}: warehouse stale, newest night {freshness.newest.night} is {age} old"
        fields = {
            "tenant": tenant,
            "newest night": freshness.newest.night.isoformat(),
            "committed at": f"{freshness.newest.committed_at:%Y-%m-%dT%H:%M:%SZ}",
            "age": age,
            "threshold": limit,
        }
    fields["run"] = "membersync sync"  # tonight's night; it lists what changed since the newest one
    return Message(title, _lines(fields), failure=False)
