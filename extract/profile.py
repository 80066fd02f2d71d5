"""The tenant profile: every name the interface document leaves "not shown".

The contract (``shared/spec/contract.md``) fixes query parameter names, wrapper keys of
client and user endpoints, item field names and paging parameters for this project. A
real tenant's server may differ in any of them, so they are read from a TOML file whose
defaults *are* the contract (``extract/profile.default.toml``). A user whose server
differs writes a small TOML file with only the differences and points
``MEMBERSYNC_PROFILE`` at it; no code changes.

Format (every table optional; keys are logical names, values wire names)::

    [params]                 # query parameter names
    clientNumber = "clientNo"

    [paging]
    page = "page"            # name of the page-number parameter
    pageSize = "pageSize"    # name of the page-size parameter
    totalCount = "totalCount"  # key of the total in a search answer
    first_page = 1           # number of the first page
    page_size = 500          # page size we ask for (1..max_page_size)
    max_page_size = 500

    [wrappers]               # endpoint name -> wrapper key of its answer
    clientdetails = "client"

    [fields.clientMembership]  # record type -> {logical field = wire field}
    status = "membershipStatus"

Everything downstream of the client sees logical names only.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import Any

from membersync.extract import catalogue

DEFAULT_PROFILE_PATH = Path(__file__).with_name("profile.default.toml")


class ProfileError(ValueError):
    """The tenant profile cannot be used; the message names the file and the key."""


_PARAM_NAMES = frozenset(
    {"clientNumber", "startDate", "endDate", "membershipId", "storecode", "type", *catalogue.SEARCH_CRITERIA}
)
_PAGING_NAMES = frozenset({"page", "pageSize", "totalCount"})
_PAGING_NUMBERS = frozenset({"first_page", "page_size", "max_page_size"})
_WRAPPED = frozenset(
    e.name for e in catalogue.ENDPOINTS if e.wrapper is not None and e.kind in ("client_read", "search")
)
_RECORDS = (
    frozenset(e.record for e in catalogue.ENDPOINTS if e.record)
    | frozenset(e.name for e in catalogue.WRITE_ENDPOINTS)
    | {"transactionLine", "transactionPayment"}
)


@dataclass(frozen=True)
class Profile:
    """Logical -> wire names for one tenant. Build with :meth:`load` or :meth:`default`."""

    params: Mapping[str, str] = field(default_factory=dict)
    paging: Mapping[str, Any] = field(default_factory=dict)
    wrappers: Mapping[str, str] = field(default_factory=dict)
    fields: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    source: str = "<defaults>"

    # -- construction -------------------------------------------------------------------

    @classmethod
    def default(cls) -> Profile:
        return _default_profile()

    @classmethod
    def load(cls, path: str | Path | None = None) -> Profile:
        """The defaults, overridden by the TOML file at ``path`` (when given)."""
        base = cls.default()
        if path is None:
            return base
        return _load_file(Path(path), base=base)

    # -- names --------------------------------------------------------------------------

    def param(self, logical: str) -> str:
        """Wire name of a query parameter (paging ones included)."""
        if logical in ("page", "pageSize"):
            return str(self.paging[logical])
        return self.params.get(logical, logical)

    def wrapper(self, endpoint: catalogue.Endpoint) -> str | None:
        return self.wrappers.get(endpoint.name, endpoint.wrapper)

    @property
    def total_key(self) -> str:
        return str(self.paging["totalCount"])

    @property
    def first_page(self) -> int:
        return int(self.paging["first_page"])

    @property
    def page_size(self) -> int:
        return int(self.paging["page_size"])

    @property
    def max_page_size(self) -> int:
        return int(self.paging["max_page_size"])

    # -- records ------------------------------------------------------------------------

    @cached_property
    def _to_logical(self) -> dict[str, dict[str, str]]:
        """record -> {wire: logical}, only for records whose names differ."""
        return {rec: {w: lg for lg, w in m.items() if w != lg} for rec, m in self.fields.items() if m}

    def to_logical(self, record: str, item: Any) -> Any:
        """Rename one wire item's fields to logical names (no copy when nothing differs)."""
        renames = self._to_logical.get(record)
        if not renames or not isinstance(item, dict):
            return item
        return {renames.get(k, k): v for k, v in item.items()}

    def to_wire(self, record: str, item: dict[str, Any]) -> dict[str, Any]:
        """Rename a logical item's fields to the wire names (used by the sandbox)."""
        mapping = self.fields.get(record)
        if not mapping:
            return item
        return {mapping.get(k, k): v for k, v in item.items()}

    @property
    def is_contract(self) -> bool:
        """True when every name is the contract's (fast paths may skip renaming)."""
        default = Profile.default()
        return (
            dict(self.params) == dict(default.params)
            and dict(self.paging) == dict(default.paging)
            and dict(self.wrappers) == dict(default.wrappers)
            and not any(self._to_logical.values())
        )


@cache
def _default_profile() -> Profile:
    return _load_file(DEFAULT_PROFILE_PATH, base=None)


def _load_file(path: Path, base: Profile | None) -> Profile:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProfileError(f"tenant profile {path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"tenant profile {path}: cannot be read ({exc.__class__.__name__})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"tenant profile {path}: not valid TOML ({exc})") from None
    where = str(path)
    unknown = set(raw) - {"params", "paging", "wrappers", "fields"}
    if unknown:
        raise ProfileError(f"tenant profile {where}: unknown table [{sorted(unknown)[0]}]")
    params = dict(base.params) if base else {}
    paging = dict(base.paging) if base else {}
    wrappers = dict(base.wrappers) if base else {}
    fields: dict[str, dict[str, str]] = {k: dict(v) for k, v in base.fields.items()} if base else {}

    params.update(_names(raw.get("params", {}), _PARAM_NAMES, where, "params"))
    wrappers.update(_names(raw.get("wrappers", {}), _WRAPPED, where, "wrappers"))
    paging_raw = _table(raw.get("paging", {}), where, "paging")
    for key, value in paging_raw.items():
        if key in _PAGING_NAMES:
            paging[key] = _wire_name(value, where, f"paging.{key}")
        elif key in _PAGING_NUMBERS:
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ProfileError(f"tenant profile {where}: paging.{key} must be a whole number >= 0")
            paging[key] = value
        else:
            raise ProfileError(f"tenant profile {where}: unknown key paging.{key}")
    for record, mapping in _table(raw.get("fields", {}), where, "fields").items():
        if record not in _RECORDS:
            raise ProfileError(f"tenant profile {where}: unknown record type [fields.{record}]")
        table = _table(mapping, where, f"fields.{record}")
        fields.setdefault(record, {}).update(
            {k: _wire_name(v, where, f"fields.{record}.{k}") for k, v in table.items()}
        )
    if base is not None or paging:
        missing = (_PAGING_NAMES | _PAGING_NUMBERS) - set(paging)
        if missing:
            raise ProfileError(f"tenant profile {where}: paging.{sorted(missing)[0]} is missing")
        if not 1 <= int(paging["page_size"]) <= int(paging["max_page_size"]):
            raise ProfileError(
                f"tenant profile {where}: paging.page_size must be between 1 and max_page_size"
            )
    return Profile(params=params, paging=paging, wrappers=wrappers, fields=fields, source=where)


def _table(value: Any, where: str, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProfileError(f"tenant profile {where}: [{key}] must be a table")
    return value


def _wire_name(value: Any, where: str, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ProfileError(f"tenant profile {where}: {key} must be a non-empty string")
    return value


def _names(value: Any, allowed: frozenset[str], where: str, key: str) -> dict[str, str]:
    table = _table(value, where, key)
    for name in table:
        if name not in allowed:
            raise ProfileError(f"tenant profile {where}: unknown key {key}.{name}")
    return {k: _wire_name(v, where, f"{key}.{k}") for k, v in table.items()}
