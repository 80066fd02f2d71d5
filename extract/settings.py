"""Every ``MEMBERSYNC_*`` setting, declared once and read once: :class:`Settings`.

A command builds one :class:`Settings` (:meth:`Settings.load`, from the environment) and passes
it down; each part takes what it needs from it (:meth:`ServiceSettings.from_settings`,
``ClientOptions.from_settings``, ``SyncOptions.from_settings``, ``DataDir.from_settings``, ...).
No other module reads a ``MEMBERSYNC_*`` variable (``tests/unit/extract/test_settings.py`` checks it).

A bad value is a one-line :class:`SettingsError` naming the variable (the CLI exits 2); a secret's
value (credentials, notification URLs) is never shown, and passwords are held as
:class:`pydantic.SecretStr` so that no repr, log or Prefect result shows them.
"""

from __future__ import annotations

import calendar
import contextlib
import contextvars
import datetime as dt
import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from membersync.extract import constants
from membersync.extract.profile import Profile
from pydantic import AfterValidator, BeforeValidator, Field, SecretStr, ValidationError
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings.sources.utils import parse_env_vars

PREFIX = "MEMBERSYNC_"


class SettingsError(ValueError):
    """A setting is missing or malformed; the message names it (and never shows a secret)."""


class UsageError(Exception):
    """Bad input on the command line (an argument, a night, a report name): one line, exit 2.

    Declared here, beside SettingsError, so that every command group's module raises the same
    error without importing another command group's module.
    """


@dataclass(frozen=True)
class ServiceSettings:
    base_url: str
    username: SecretStr
    password: SecretStr
    profile_path: str | None = None
    tenant: str | None = None  # MEMBERSYNC_TENANT: the tenant a night records in its manifest

    def __repr__(self) -> str:  # never show the credentials, even masked ones' length
        return (
            f"ServiceSettings(base_url={self.base_url!r}, profile_path={self.profile_path!r}, "
            f"tenant={self.tenant!r})"
        )

    __str__ = __repr__

    def profile(self) -> Profile:
        return Profile.load(self.profile_path)

    @classmethod
    def from_settings(cls, settings: Settings) -> ServiceSettings:
        """The service's address and credentials (required for a sync: a missing one is named)."""
        missing = [n for n in ("base_url", "username", "password") if getattr(settings, n) is None]
        if missing:
            raise SettingsError(f"missing setting {env_name(missing[0])} (set it in the environment)")
        assert settings.base_url and settings.username and settings.password  # for mypy
        return cls(
            base_url=settings.base_url,
            username=settings.username,
            password=settings.password,
            profile_path=settings.profile,
            tenant=settings.tenant,
        )


# --- the one declaration -----------------------------------------------------------------------


def _strip(value: Any) -> Any:
    """Text without surrounding blanks; blanks alone are unset (a tenant of "" is no tenant)."""
    return (value.strip() or None) if isinstance(value, str) else value


def _iso_date(value: Any) -> Any:
    """YYYY-MM-DD (or YYYYMMDD) as the old reader took it; never a Unix timestamp."""
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value.strip())
        except ValueError:
            raise ValueError("must be a date YYYY-MM-DD") from None
    return value


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


def _finite(value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


def _http_url(value: str | None) -> str | None:
    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http(s) URL such as http://127.0.0.1:8700")
    if parts.username or parts.password:
        raise ValueError("must not carry credentials: use MEMBERSYNC_USERNAME/PASSWORD")
    return value.rstrip("/")


def _postgres_url(value: str | None) -> str | None:
    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError("must be a postgresql:// URL such as postgresql://membersync@db.example/warehouse")
    if parts.password is not None or "password=" in parts.query.lower():
        raise ValueError("must not carry a password: use PGPASSWORD, ~/.pgpass or a libpq service file")
    return value


_ROLE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def parse_store_roles(value: Any) -> Any:
    """``north_managers=S01,S02; south=S03`` (``;`` or new lines) as role -> its storecodes
    (each verbatim but for the spaces after a comma)."""
    if value is None or isinstance(value, dict):
        return value
    roles: dict[str, tuple[str, ...]] = {}
    for part in re.split(r"[;\n]", str(value)):
        if not part.strip():
            continue
        role, _, stores = part.partition("=")
        role = role.strip()
        # storecodes are byte-exact and may end in spaces: only the spaces after a comma go
        codes = tuple(sorted({c.lstrip() for c in stores.split(",") if c.strip()}))
        if role.startswith(("membersync_", "pg_")):  # the tier roles' and PostgreSQL's own names
            raise ValueError(f"role {role}: names starting membersync_ or pg_ are not store roles")
        if not _ROLE.match(role) or role in roles:
            raise ValueError("expected each role once, named in lower case letters, digits and _")
        if not codes:
            raise ValueError(f"role {role}: expected role=STORE,STORE")
        roles[role] = codes
    return roles or None


@dataclass(frozen=True)
class Span:
    """A length of time in business days, weeks, months or years (``400d``, ``7y``)."""

    amount: int
    unit: Literal["d", "w", "m", "y"]

    def before(self, day: dt.date) -> dt.date:
        """``day`` minus this span (a month or year back lands on the month's last day if need be)."""
        if self.unit in ("d", "w"):
            return day - dt.timedelta(days=self.amount * (7 if self.unit == "w" else 1))
        months = day.year * 12 + day.month - 1 - self.amount * (12 if self.unit == "y" else 1)
        year, month = divmod(months, 12)
        return dt.date(year, month + 1, min(day.day, calendar.monthrange(year, month + 1)[1]))

    def __str__(self) -> str:
        return f"{self.amount}{self.unit}"


@dataclass(frozen=True)
class RetentionPolicy:
    """``MEMBERSYNC_RETENTION``: how long history is kept (warehouse/lifecycle/retention.py). None: kept."""

    daily: Span | None = None  # older nights are thinned to month-end nights
    monthly: Span | None = None  # older nights are removed
    identity: Span | None = None  # a client inactive this long is forgotten

    @property
    def keeps_everything(self) -> bool:
        return self.daily is None and self.monthly is None and self.identity is None

    def __str__(self) -> str:
        spans = (("daily", self.daily), ("monthly", self.monthly), ("identity", self.identity))
        return ",".join(f"{name}={span}" for name, span in spans if span) or "keep everything"


def parse_retention(value: Any) -> Any:
    """``daily=400d,monthly=7y,identity=3y`` (any of the three; units d, w, m, y) as a policy."""
    if value is None or isinstance(value, RetentionPolicy):
        return value
    spans: dict[str, Span] = {}
    for part in str(value).split(","):
        name, _, amount = part.strip().partition("=")
        name, amount = name.strip().lower(), amount.strip().lower()
        if name not in ("daily", "monthly", "identity") or name in spans:
            raise ValueError(
                f"expected daily=, monthly= and identity= at most once each, got {part.strip()!r}"
            )
        if len(amount) < 2 or not amount[:-1].isdigit() or amount[-1] not in "dwmy" or int(amount[:-1]) < 1:
            raise ValueError(f"{name}: expected a length such as 400d, 8w, 18m or 7y, got {amount!r}")
        spans[name] = Span(int(amount[:-1]), amount[-1])  # type: ignore[arg-type]
    policy = RetentionPolicy(**spans)
    probe = dt.date(2000, 1, 1)
    if policy.daily and policy.monthly and policy.monthly.before(probe) > policy.daily.before(probe):
        raise ValueError("monthly= must be at least as long as daily= (month-end nights outlive daily ones)")
    return policy


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*(%|b|kb|mb|gb|tb|kib|mib|gib|tib)?$", re.IGNORECASE)
_SIZE_UNITS = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}
_SIZE_UNITS |= {"kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def parse_size(text: str, whole: int) -> int:
    """``2GB``, ``1.5GiB``, ``800MB``, ``40%`` (of ``whole``) or plain bytes, as bytes."""
    found = _SIZE.match(text.strip())
    if found is None or float(found.group(1)) <= 0:
        raise ValueError("expected a size such as 2GB, 1536MiB or 40%")
    number, unit = float(found.group(1)), (found.group(2) or "b").lower()
    if unit == "%" and number > 100:
        raise ValueError("a share of the memory is at most 100%")
    return int(whole * number / 100) if unit == "%" else int(number * _SIZE_UNITS[unit])


def _size(value: str | None) -> str | None:
    if value is not None:
        parse_size(value, 1)
    return value


Text = Annotated[str | None, BeforeValidator(_strip)]
Seconds = Annotated[float, Field(gt=0), AfterValidator(_finite)]
Flag = Annotated[bool, BeforeValidator(_lower)]

# A bad value of these is never shown, only the variable's name (the URL may carry credentials).
SECRET_SETTINGS = frozenset({"username", "password", "notify", "base_url", "store_notify", "publish_url"})

_ENVIRON: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar("environ", default=None)


class _Environment(EnvSettingsSource):
    """The environment :meth:`Settings.load` was given (``os.environ`` when none)."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # Names are upper case only: a stray `membersync_data_dir` is not read (and is not left
        # over by a tenant's environment, which sets and clears the upper-case names).
        environ = _ENVIRON.get()
        given = os.environ if environ is None else environ
        ours = {k: v for k, v in given.items() if k.startswith(PREFIX) and k == k.upper()}
        return parse_env_vars(ours, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


class Settings(BaseSettings):
    """Every setting of membersync: field ``x`` is the environment variable ``MEMBERSYNC_X``.

    Empty values count as unset. Defaults are the production ones; tests compare them with the
    defaults of the option objects built from them, so the two cannot drift.
    """

    model_config = SettingsConfigDict(
        env_prefix=PREFIX, case_sensitive=False, env_ignore_empty=True, extra="ignore", frozen=True
    )

    # Each field's description is the line of the configuration table (docs/configuration.md,
    # generated from here by flows/cli/docs_tables.py; a test fails when the two drift).
    # -- the service and the tenant
    base_url: Annotated[Text, AfterValidator(_http_url)] = Field(
        None,
        description="the service, e.g. `https://tenant.example.com` (`/svcapi/...` is appended); "
        "`sync` needs it",
    )
    username: SecretStr | None = Field(
        None, description="HTTP Basic user name; `sync` needs it; never logged"
    )
    password: SecretStr | None = Field(
        None, description="HTTP Basic password; `sync` needs it; never logged, never a Prefect parameter"
    )
    profile: Text = Field(None, description="path of the tenant profile TOML (docs/tenant-profile.md)")
    tenant: Text = Field(
        None,
        description="the tenant's name in notifications and manifests; a night refuses a data location "
        "whose manifests name another tenant",
    )
    tenants_file: Text = Field(
        None, description="on a work-pool worker: its tenants file (docs/work-pool.md)"
    )
    # -- the client (extract/client.py; defaults in extract/constants.py)
    rate: Annotated[float | None, Field(gt=0), AfterValidator(_finite)] = Field(
        None, description="a cap in requests/s; without it the client finds the server's limit from its 429s"
    )
    max_concurrency: Annotated[int, Field(ge=1)] = Field(
        constants.MAX_CONCURRENCY, description="requests in flight at most (the client starts lower)"
    )
    connect_timeout: Seconds = Field(constants.CONNECT_TIMEOUT, description="seconds to connect")
    read_timeout: Seconds = Field(constants.READ_TIMEOUT, description="seconds a read may wait for bytes")
    request_timeout: Seconds = Field(
        constants.REQUEST_TIMEOUT, description="seconds a whole attempt may take"
    )
    max_retries: Annotated[int, Field(ge=0)] = Field(
        constants.MAX_RETRIES, description="retries after a request's first attempt"
    )
    # -- a night (flows/night/nightly.py)
    batch_size: Annotated[int, Field(ge=1)] = Field(250, description="clients per batch (a Prefect task run)")
    batches_in_flight: Annotated[int, Field(ge=1)] = Field(2, description="batches fetched at once")
    lookback_days: Annotated[int, Field(ge=0)] = Field(
        7, description="with `MEMBERSYNC_WHOLE_HISTORY=off`: days before the last night a window starts"
    )
    points_start: Annotated[dt.date, BeforeValidator(_iso_date)] = Field(
        dt.date(2000, 1, 1), description="where points histories start (the service needs a start date)"
    )
    watermark_overlap_minutes: Annotated[int, Field(ge=0)] = Field(
        15, description="discovery re-lists clients changed this long before the last watermark"
    )
    build: Flag = Field(True, description="`off` skips the warehouse build and the reports after a night")
    whole_history: Flag = Field(
        True,
        description="`on`: every synced client's whole history every night (late corrections seen); `off`: a "
        "window, which misses changes older than it until a `--full` night",
    )
    prefect: Flag = Field(True, description="`off` runs a night without Prefect (the same steps)")
    # -- the nightly self-audit (flows/night/audit.py)
    audit_share: Annotated[float, Field(ge=0, le=1)] = Field(
        0.01, description="the self-audit's sample: this share of all known clients"
    )
    audit_min: Annotated[int, Field(ge=0)] = Field(
        20, description="the self-audit's sample: at least this many"
    )
    audit_max_requests: Annotated[int, Field(ge=0)] = Field(
        10_000, description="the self-audit's requests at most (9 a client; 0 turns it off)"
    )
    audit_heal: Annotated[Literal["next", "now"], BeforeValidator(_lower)] = Field(
        "next",
        description="clients found different are re-synced by the `next` night, or `now`, before the commit",
    )
    # -- the warehouse and its readers
    data_dir: Text = Field(
        None,
        description="where everything is written (default `warehouse/data`), owner-only; or "
        "`s3://bucket/prefix` "
        "(docs/object-storage.md)",
    )
    cache_dir: Text = Field(
        None,
        description="with `s3://`: the local working dir "
        "(default `~/.cache/membersync/s3/<bucket>/<prefix>`)",
    )
    shard_stall_seconds: Seconds = Field(
        600.0, description="a shard run with no sign of life this long is run again (docs/work-pool.md)"
    )
    dbt_threads: Annotated[int, Field(ge=1)] = Field(
        2, description="dbt threads of the warehouse build (4 took the same time, 1.3x the memory)"
    )
    build_memory: Annotated[Text, AfterValidator(_size)] = Field(
        None,
        description="memory a warehouse build may use (`2GB`, `1536MiB`, `40%`; default half the "
        "machine's or cgroup's): DuckDB spills past it and a full refresh runs in batches of nights",
    )
    open_tables: Flag = Field(
        True,
        description="`off`: no Delta Lake tables of the analyst tier under `delta/` of the data location "
        "(docs/open-tables.md)",
    )
    publish_url: Annotated[Text, AfterValidator(_postgres_url)] = Field(
        None,
        description="a PostgreSQL database every build publishes the warehouse into "
        "(`postgresql://user@host/db`; the password from `PGPASSWORD`, `~/.pgpass` or a service "
        "file, never the URL: docs/postgres.md)",
    )
    publish_roles: Annotated[dict[str, tuple[str, ...]] | None, BeforeValidator(parse_store_roles)] = Field(
        None,
        description="the publication's store roles: `role=STORE,STORE` pairs (`;` or new lines); a "
        "store role reads only its stores' rows (`membersync publish --roles`)",
    )
    build_batch_nights: Annotated[int, Field(ge=0)] = Field(
        0, description="nights per batch of a full refresh (0: as many as fit `MEMBERSYNC_BUILD_MEMORY`)"
    )
    lease_seconds: Annotated[float, Field(ge=3.0, le=3600.0)] = Field(
        30.0,
        description="with `s3://`: the writer's lease in the bucket lasts this long unless renewed (a "
        "third of it): a killed writer's lease ends by itself after it",
    )
    stale_after_hours: Seconds = Field(
        36.0, description="`membersync freshness` calls the warehouse stale past this age of its newest night"
    )
    notify: SecretStr | None = Field(
        None,
        description="Apprise URLs (comma or space separated) told when a night fails or the warehouse "
        "is stale",
    )
    # -- personal data (warehouse/landing/identity.py, warehouse/lifecycle/: forget.py, retention.py)
    erasure_key_file: Text = Field(
        None,
        description="the erasure register's key, outside the data location (default "
        "`~/.config/membersync/erasure-<digest>.key`); back it up (docs/personal-data.md)",
    )
    retention: Annotated[RetentionPolicy | None, BeforeValidator(parse_retention)] = Field(
        None,
        description="history kept by business date, e.g. `daily=400d,monthly=7y,identity=3y`; "
        "unset: everything",
    )
    # -- per-store reports for store managers (warehouse/exports/reports.py, flows/night/notify.py)
    store_reports: Flag = Field(
        False,
        description="`on`: each night also writes each store's own folder "
        "`reports/<night>/stores/<storecode>/`",
    )
    store_notify: SecretStr | None = Field(
        None,
        description="each store's morning report to its manager: `storecode=URL` pairs (`;` or new "
        "lines), or "
        "`@path` of a file of them",
    )
    # -- fault injection for the reliability tests (warehouse/landing/crashpoints.py)
    crash_at: Text = Field(
        None, description="the reliability tests' fault injection; never set it in production"
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, _Environment(settings_cls))

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings from ``env`` (default: the process environment); a bad value raises a
        one-line :class:`SettingsError` naming its variable."""
        with _given_environment(env):
            try:
                return cls()
            except ValidationError as exc:
                raise SettingsError(_one_line(exc)) from None


def env_name(field: str) -> str:
    return f"{PREFIX}{field.upper()}"


@contextlib.contextmanager
def _given_environment(env: Mapping[str, str] | None) -> Iterator[None]:
    token = _ENVIRON.set(env)
    try:
        yield
    finally:
        _ENVIRON.reset(token)


def _one_line(exc: ValidationError) -> str:
    error = exc.errors(include_url=False, include_input=True)[0]
    field = str(error["loc"][0]) if error["loc"] else ""
    message = str(error["msg"]).removeprefix("Value error, ")
    message = message[0].lower() + message[1:] if message else "is not valid"
    message = message.removeprefix("input ")
    if field in SECRET_SETTINGS or "input" not in error:
        return f"{env_name(field)}: {message}"
    return f"{env_name(field)}: {message}, got {str(error['input'])!r}"
