"""The tenants file: every business membersync syncs, in one TOML file, with no secret in it.

::

    [defaults]                          # optional: any tenant key, for every tenant
    schedule = "0 2 * * *"
    timezone = "UTC"

    [tenants.spa-north]                 # the tenant's name: lower-case letters, digits, '-'
    base_url = "https://north.example.com"
    username_env = "NORTH_USERNAME"     # names of environment variables holding the credentials ...
    password_env = "NORTH_PASSWORD"
    # credentials_block = "spa-north-credentials"   # ... or a Prefect Secret block (JSON
    #                                                #     {"username": ..., "password": ...})
    profile = "profiles/north.toml"     # optional tenant profile, relative to this file
    schedule = "30 3 * * *"             # cron, in
    timezone = "Europe/Paris"           # this IANA zone
    data_dir = "s3://membersync-data/spa-north"    # or a local path (relative to this file)
    rate = 100                          # optional: the service's limit in requests/s, if known

A tenant's night runs with ``MEMBERSYNC_TENANT`` set to its name, and each committed manifest
records it; a night refuses a data location whose manifests name another tenant. Without a
tenants file nothing changes: one tenant, from the ``MEMBERSYNC_*`` variables.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from membersync.extract.settings import SettingsError
from membersync.flows.console import error
from membersync.warehouse.landing.manifest import TENANT_ENV

_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BLOCK_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,127}")
KEYS = frozenset(
    {
        "base_url",
        "username_env",
        "password_env",
        "credentials_block",
        "profile",
        "schedule",
        "timezone",
        "data_dir",
        "rate",
        "shards",
    }
)
MAX_SHARDS = 64
# keys that would hold a secret's value: refused, whatever they hold
SECRET_KEYS = frozenset(
    {
        "username",
        "password",
        "credentials",
        "secret",
        "token",
        "api_key",
        "apikey",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
    }
)
DEFAULT_SCHEDULE = "0 2 * * *"
DEFAULT_TIMEZONE = "UTC"


@dataclass(frozen=True)
class Tenant:
    name: str
    base_url: str
    username_env: str | None
    password_env: str | None
    credentials_block: str | None
    profile: Path | None
    schedule: str
    timezone: str
    data_dir: str  # a local path (absolute) or s3://bucket/prefix
    rate: float | None
    shards: int = 1  # > 1: the night's batches are fetched by this many shard runs (flows/night/shards.py)

    def night_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The ``MEMBERSYNC_*`` settings of this tenant's night (credentials read from the
        variables the file names, at run time; a Secret block is resolved by the caller)."""
        env = {
            "MEMBERSYNC_BASE_URL": self.base_url,
            "MEMBERSYNC_DATA_DIR": self.data_dir,
            TENANT_ENV: self.name,
        }
        if self.profile is not None:
            env["MEMBERSYNC_PROFILE"] = str(self.profile)
        if self.rate is not None:
            env["MEMBERSYNC_RATE"] = f"{self.rate:g}"
        for source, target in (
            (self.username_env, "MEMBERSYNC_USERNAME"),
            (self.password_env, "MEMBERSYNC_PASSWORD"),
        ):
            if source is not None:
                if not environ.get(source):
                    raise SettingsError(f"tenant {self.name}: missing setting {source} (its {target})")
                env[target] = environ[source]
        return env


class TenantsFileError(SettingsError):
    """The tenants file is unusable; ``errors`` holds one line per problem."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__(errors[0] if errors else "tenants file: unusable")
        self.errors = errors


def load_tenants(path: str | Path, *, check_profiles: bool = True) -> list[Tenant]:
    """Read and validate the tenants file; every problem found, one line each, in the error."""
    path = Path(path)
    where = str(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TenantsFileError([f"tenants file {where}: cannot read it ({exc.strerror or exc})"]) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TenantsFileError([f"tenants file {where}: not valid TOML ({exc})"]) from None
    errors: list[str] = []
    unknown_top = sorted(set(raw) - {"defaults", "tenants"})
    errors += [
        f"{where}: unknown section [{k}] (expected [defaults] and [tenants.<name>])" for k in unknown_top
    ]
    defaults = raw.get("defaults", {})
    if not isinstance(defaults, dict):
        errors.append(f"{where}: [defaults] must be a table")
        defaults = {}
    errors += _key_errors(f"{where}: [defaults]", defaults)
    tenants_raw = raw.get("tenants", {})
    if not isinstance(tenants_raw, dict) or not tenants_raw:
        errors.append(f"{where}: no tenant (add a [tenants.<name>] table)")
        tenants_raw = {}
    tenants = []
    for name, body in tenants_raw.items():
        here = f"{where}: tenant {name}"
        if not isinstance(body, dict):
            errors.append(f"{here}: must be a table")
            continue
        before = len(errors)
        if not _NAME.fullmatch(name):
            errors.append(f"{here}: bad name (lower-case letters, digits and '-', at most 63)")
        errors += _key_errors(here, body)
        merged = {**{k: v for k, v in defaults.items() if k in KEYS}, **body}
        tenant = _tenant(name, merged, path.parent.resolve(), here, errors, check_profiles)
        if tenant is not None and len(errors) == before:
            tenants.append(tenant)
    seen: dict[str, str] = {}
    for tenant in tenants:
        other = seen.setdefault(tenant.data_dir.rstrip("/"), tenant.name)
        if other != tenant.name:
            errors.append(
                f"{where}: tenant {tenant.name}: data_dir {tenant.data_dir} is also tenant {other}'s "
                "(each tenant needs its own data location)"
            )
    if errors:
        raise TenantsFileError(errors)
    return tenants


def _key_errors(here: str, body: Mapping[str, Any]) -> list[str]:
    out = []
    for key in sorted(body):
        if key.lower() in SECRET_KEYS:
            out.append(
                f"{here}: {key!r} would hold a secret: name environment variables (username_env, "
                "password_env) or a Prefect Secret block (credentials_block) instead"
            )
        elif key not in KEYS:
            out.append(f"{here}: unknown key {key!r} (known: {', '.join(sorted(KEYS))})")
    return out


def _text(body: Mapping[str, Any], key: str, here: str, errors: list[str]) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        errors.append(f"{here}: {key} must be a non-empty string")
        return None
    return value.strip()


def _tenant(
    name: str, body: Mapping[str, Any], base: Path, here: str, errors: list[str], check_profiles: bool
) -> Tenant | None:
    """One tenant's table (defaults merged in) checked key by key; every problem goes to
    ``errors``, in the order of the keys below. None when the tenant cannot be built at all."""
    url = _base_url(body, here, errors)
    user_env, pass_env, block = _credentials(body, here, errors)
    profile = _profile(body, base, here, errors, check_profiles)
    schedule, timezone = _schedule(body, here, errors)
    data_dir = _data_dir(body, base, here, errors)
    rate = _rate(body, here, errors)
    shards = _shards(body, here, errors)
    if url is None or not data_dir:
        return None
    return Tenant(
        name=name,
        base_url=url,
        username_env=user_env,
        password_env=pass_env,
        credentials_block=block,
        profile=profile,
        schedule=schedule,
        timezone=timezone,
        data_dir=data_dir,
        rate=rate,
        shards=shards,
    )


def _base_url(body: Mapping[str, Any], here: str, errors: list[str]) -> str | None:
    url = _text(body, "base_url", here, errors)
    if url is None and "base_url" not in body:
        errors.append(f"{here}: missing base_url")
    elif url is not None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            errors.append(f"{here}: base_url {url!r} is not an http(s) URL")
        elif parts.username or parts.password:
            errors.append(f"{here}: base_url must not carry credentials (use username_env/password_env)")
    return url


def _credentials(
    body: Mapping[str, Any], here: str, errors: list[str]
) -> tuple[str | None, str | None, str | None]:
    """(username_env, password_env, credentials_block): where the secrets are, never the secrets;
    exactly one of the two ways must be given."""
    user_env = _text(body, "username_env", here, errors)
    pass_env = _text(body, "password_env", here, errors)
    block = _text(body, "credentials_block", here, errors)
    for key, value in (("username_env", user_env), ("password_env", pass_env)):
        if value is not None and not _ENV_NAME.fullmatch(value):
            errors.append(f"{here}: {key} {value!r} is not an environment variable name")
    if block is not None and not _BLOCK_NAME.fullmatch(block):
        errors.append(f"{here}: credentials_block {block!r} is not a Prefect block name")
    if block is not None and (user_env or pass_env):
        errors.append(f"{here}: give either credentials_block or username_env + password_env, not both")
    elif block is None and not (user_env and pass_env):
        errors.append(f"{here}: missing credentials: username_env and password_env, or credentials_block")
    return user_env, pass_env, block


def _profile(
    body: Mapping[str, Any], base: Path, here: str, errors: list[str], check_profiles: bool
) -> Path | None:
    """The profile's absolute path (the file gives it relative to itself), loaded once to check it."""
    profile_text = _text(body, "profile", here, errors)
    profile = (base / profile_text).resolve() if profile_text else None
    if profile is not None and check_profiles:
        from membersync.extract.profile import Profile, ProfileError

        try:
            Profile.load(profile)
        except ProfileError as exc:
            errors.append(f"{here}: profile: {exc}")
    return profile


def _schedule(body: Mapping[str, Any], here: str, errors: list[str]) -> tuple[str, str]:
    """(cron, IANA zone), the defaults where unset; a bad cron or zone is one error line."""
    from membersync.flows.pool.schedule import check_schedule

    schedule = _text(body, "schedule", here, errors) or DEFAULT_SCHEDULE
    timezone = _text(body, "timezone", here, errors) or DEFAULT_TIMEZONE
    try:
        check_schedule(schedule, timezone, None)
    except SettingsError as exc:
        errors.append(f"{here}: {exc}")
    return schedule, timezone


def _data_dir(body: Mapping[str, Any], base: Path, here: str, errors: list[str]) -> str:
    """The data location: s3://bucket/prefix as written, or a local path made absolute against
    the tenants file's folder; "" when missing or unusable."""
    data_text = _text(body, "data_dir", here, errors)
    data_dir = ""
    if data_text is None:
        if "data_dir" not in body:
            errors.append(f"{here}: missing data_dir (a local path or s3://bucket/prefix)")
    elif "://" in data_text:
        from membersync.warehouse.landing.paths import DataDir

        try:
            data_dir = DataDir.remote_location(data_text, "/nonexistent").location
        except SettingsError:
            errors.append(f"{here}: data_dir {data_text!r} is not a local path or s3://bucket/prefix")
    else:
        data_dir = str((base / data_text).expanduser().resolve())
    return data_dir


def _rate(body: Mapping[str, Any], here: str, errors: list[str]) -> float | None:
    rate = body.get("rate")
    # bool is an int to Python, but `rate = true` is a mistake, not 1 req/s
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float) or rate <= 0):
        errors.append(f"{here}: rate must be a positive number of requests per second")
        rate = None
    return float(rate) if rate is not None else None


def _shards(body: Mapping[str, Any], here: str, errors: list[str]) -> int:
    shards = body.get("shards", 1)
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
        errors.append(f"{here}: shards must be a whole number from 1 to {MAX_SHARDS}")
        shards = 1
    return shards


def run_tenants_check(path: str, out: Any, err: Any) -> int:
    """``membersync tenants check FILE``: 0 and one line per tenant, or 2 and one line per error."""
    try:
        tenants = load_tenants(path)
    except TenantsFileError as exc:
        for line in exc.errors:
            error(line, err)
        return 2
    for t in tenants:
        creds = (
            f"Secret block {t.credentials_block}"
            if t.credentials_block
            else f"${t.username_env}/${t.password_env}"
        )
        rate = f"{t.rate:g} req/s" if t.rate is not None else "rate found from 429s"
        out.print(
            f"{t.name}: {t.base_url} -> {t.data_dir}; credentials {creds}; "
            f"cron {t.schedule!r} {t.timezone}; {rate}",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )
    out.print(f"ok: {len(tenants)} tenant(s)", markup=False, highlight=False)
    return 0
