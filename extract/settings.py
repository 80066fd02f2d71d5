"""Connection settings from the environment, with one-line errors that name what is missing.

``MEMBERSYNC_BASE_URL``, ``MEMBERSYNC_USERNAME``, ``MEMBERSYNC_PASSWORD`` (required for a
sync) and ``MEMBERSYNC_PROFILE`` (optional path of the tenant profile TOML). The password
is held as a :class:`pydantic.SecretStr` so that no repr, log or Prefect result shows it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from membersync.extract.profile import Profile
from pydantic import SecretStr


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

    def __repr__(self) -> str:  # never show the credentials, even masked ones' length
        return f"ServiceSettings(base_url={self.base_url!r}, profile_path={self.profile_path!r})"

    __str__ = __repr__

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ServiceSettings:
        env = os.environ if env is None else env
        missing = [
            k for k in ("MEMBERSYNC_BASE_URL", "MEMBERSYNC_USERNAME", "MEMBERSYNC_PASSWORD") if not env.get(k)
        ]
        if missing:
            raise SettingsError(f"missing setting {missing[0]} (set it in the environment)")
        base_url = env["MEMBERSYNC_BASE_URL"].strip()
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SettingsError("MEMBERSYNC_BASE_URL must be an http(s) URL such as http://127.0.0.1:8700")
        if parts.username or parts.password:
            raise SettingsError(
                "MEMBERSYNC_BASE_URL must not carry credentials: use MEMBERSYNC_USERNAME/PASSWORD"
            )
        return cls(
            base_url=base_url.rstrip("/"),
            username=SecretStr(env["MEMBERSYNC_USERNAME"]),
            password=SecretStr(env["MEMBERSYNC_PASSWORD"]),
            profile_path=env.get("MEMBERSYNC_PROFILE") or None,
        )

    def profile(self) -> Profile:
        return Profile.load(self.profile_path)
