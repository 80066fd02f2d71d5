"""Reading what landed as the tests think of it: by client number.

Every landed table carries surrogate client keys; the identity files hold the only link to the
client numbers the sandbox (and the tests' truth) speak of. These helpers read that link, so a
test can compare landed rows with the sandbox's clients.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
from membersync.warehouse.landing.identity import read_links
from membersync.warehouse.landing.paths import DataDir
from membersync.warehouse.landing.zone import LandingZone


def zone_of(where: Any) -> LandingZone:
    return where if isinstance(where, LandingZone) else LandingZone(where)


def numbers_by_key(where: DataDir | LandingZone) -> dict[str, str]:
    """client key -> client number, from every committed night's identity files."""
    zone = zone_of(where)
    links = read_links(zone.store, zone.manifests())
    return dict(zip(links["client_key"].to_pylist(), links["client_number"].to_pylist(), strict=True))


def with_numbers(table: pa.Table, numbers: dict[str, str]) -> pa.Table:
    """``table`` with a ``client_number`` column beside its ``client_key`` (None: forgotten)."""
    column = [numbers.get(k) for k in table["client_key"].to_pylist()]
    return table.append_column("client_number", pa.array(column, pa.string()))


def read_numbered(where: DataDir | LandingZone, table: str, night: dt.date) -> pa.Table:
    """One landed table of one night, with its clients' numbers."""
    zone = zone_of(where)
    return with_numbers(zone.read(table, night), numbers_by_key(zone))


def synced_numbers(where: DataDir | LandingZone, night: dt.date) -> list[str]:
    """The numbers of the clients a committed night synced."""
    return read_numbered(where, "synced_clients", night)["client_number"].to_pylist()
