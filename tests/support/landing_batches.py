"""Small landed nights for the landing zone's tests: a few memberships per batch, one broken row.

Shared by the landing zone's unit tests and the object-storage scenarios (the same nights, landed
on a local disk and on ``s3://``).
"""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
from membersync.models.coerce import BatchBuilder, quarantine_table
from membersync.warehouse.landing.zone import LandingZone


def members(first: int, count: int, client: str = "000417") -> tuple[dict[str, pa.Table], pa.Table]:
    """``count`` memberships numbered from ``first`` and one row the coercion quarantines."""
    builder = BatchBuilder()
    items = [
        {"membershipId": f"M{n:06d}", "monthlyDues": f"{n}.25", "storecode": "DOWNTOWN  "}
        for n in range(first, first + count)
    ]
    items.append({"membershipId": "BROKEN", "monthlyDues": "1.005"})
    builder.add("memberships", items, {"clientNumber": client})
    landed = builder.build()["memberships"]
    return {"memberships": landed.table}, quarantine_table(landed.quarantine)


def land_night(zone: LandingZone, night: dt.date, batches: int = 2, rows: int = 3, first: int = 0) -> None:
    """Land and commit one full night of ``batches`` batches of ``rows`` memberships each."""
    with zone.lock():
        run = zone.open_night(night, "full")
        for b in range(batches):
            tables, quarantine = members(first + b * rows, rows)
            run.write_batch(f"b{b}", tables, quarantine)
        run.commit(f"{night}T01:00:00Z", batches, {"batches": batches})
