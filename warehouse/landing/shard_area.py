"""The shard area: where the shards of a large tenant's night leave their batches.

A sharded night (``flows/night/shards.py``) is still **one** run of the landing zone: the night's own
run holds the data dir's lock, discovers the clients, plans the batches and commits once. Only
the fetching fans out: the run writes its plan here, each shard (a flow run on any worker,
possibly another machine) fetches its batches and writes them here, and the run then copies
every batch into its own staging and commits as if it had fetched them itself. The area lives
where the data does, so shards on other machines reach it::

    <data location>/landing/_shards/<night>/<run id>/
        plan.json                        the night's batches, which shard fetches which, and
                                         what fetching needs (window, stores, affiliated packages)
        batches/<batch>/<table>.parquet  a shard's batch, every table (written first)
        batches/<batch>.done             its marker: tables, rows, the clients' digest (last)
        stats/<shard>-<launch>.json      a shard launch's beat (raised every few seconds while it
                                         lives) and its requests, retries, 429s, errors, bytes

``<data location>`` is the data dir on local (or shared) disk, or the ``s3://`` prefix. Every
object is written whole (an atomic rename on disk, one PUT on S3) and the marker after the
tables, so a shard killed mid-batch leaves either a whole batch or one its rerun fetches again;
the run copies only batches whose marker names exactly the planned clients. The plan and the
batches hold what the landing zone publishes anyway (typed rows, discovery records with secret
fields scrubbed); readers never look here (no manifest names these files), and the run removes
the area once its staging holds every batch.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from membersync.models.coerce import to_json
from membersync.models.tables import BY_NAME, QUARANTINE_SCHEMA
from membersync.warehouse.landing.atomic import write_file_atomic
from membersync.warehouse.landing.crashpoints import crashpoint
from membersync.warehouse.landing.night import client_digest
from membersync.warehouse.landing.paths import DataDir

QUARANTINE = "_quarantine"
PLAN_FORMAT = 1


class ShardAreaError(RuntimeError):
    """The shard area is missing or holds something unusable (the message names the object)."""


@dataclass(frozen=True)
class ShardPlan:
    """What a shard needs to fetch its batches: no credential, only the night's facts."""

    tenant: str | None
    night: dt.date
    run_id: str
    window: dict[str, str | None]  # flows.batches.Window's fields, ISO dates
    stores: list[dict[str, Any]]  # the storelist (timezones)
    affiliated: list[str]  # package ids of affiliated packages
    batches: dict[str, list[dict[str, Any]]]  # batch id -> discovery records of its clients
    shard_of: dict[str, int]  # batch id -> shard

    def batches_of(self, shard: int) -> list[str]:
        return sorted(b for b, s in self.shard_of.items() if s == shard)

    @property
    def shards(self) -> list[int]:
        return sorted(set(self.shard_of.values()))

    def to_json(self) -> str:
        return to_json(
            {
                "format": PLAN_FORMAT,
                "tenant": self.tenant,
                "night": self.night.isoformat(),
                "run_id": self.run_id,
                "window": self.window,
                "stores": self.stores,
                "affiliated": self.affiliated,
                "batches": self.batches,
                "shard_of": self.shard_of,
            }
        )

    @classmethod
    def from_json(cls, text: str, where: str) -> ShardPlan:
        try:
            body = json.loads(text)
            if body.get("format") != PLAN_FORMAT:
                raise ValueError(f"format {body.get('format')!r}")
            return cls(
                tenant=body["tenant"],
                night=dt.date.fromisoformat(body["night"]),
                run_id=str(body["run_id"]),
                window=dict(body["window"]),
                stores=list(body["stores"]),
                affiliated=[str(p) for p in body["affiliated"]],
                batches={str(k): list(v) for k, v in body["batches"].items()},
                shard_of={str(k): int(v) for k, v in body["shard_of"].items()},
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ShardAreaError(f"{where}: not a shard plan ({type(exc).__name__}: {exc})") from None


# What a shard launch records of its requests: RunSummary's name -> the client's ClientStats field.
LAUNCH_STATS = {
    "requests": "requests",
    "retries": "retries",
    "status_429": "status_429",
    "errors": "errors",
    "bytes_received": "bytes",
}


def request_counts(stats: Any) -> dict[str, int]:
    """A client's ClientStats as the counts a night's summary keeps (:data:`LAUNCH_STATS`)."""
    return {name: int(getattr(stats, field)) for name, field in LAUNCH_STATS.items()}


def status_counts(stats: Any) -> dict[str, int]:
    """A client's answers by HTTP status ("200" -> count), as a night's summary keeps them."""
    return {str(status): int(n) for status, n in sorted(stats.by_status.items())}


def add_counts(*counts: Mapping[str, int]) -> dict[str, int]:
    """Counts by key, summed (keys in order)."""
    total: dict[str, int] = {}
    for one in counts:
        for key, n in one.items():
            total[key] = total.get(key, 0) + n
    return dict(sorted(total.items()))


def assign(batch_ids: Sequence[str], shards: int) -> dict[str, int]:
    """Batch id -> shard: contiguous runs of the sorted ids (client ranges), as even as can be."""
    ordered = sorted(batch_ids)
    count = max(1, min(shards, len(ordered)))
    return {b: i * count // len(ordered) for i, b in enumerate(ordered)}


SHARDS = "landing/_shards"  # relative to the data location's root


class ShardArea:
    """``landing/_shards/<night>/<run id>/`` under the data location (local disk or S3)."""

    def __init__(self, data_dir: DataDir, night: dt.date, run_id: str, fs: Any = None) -> None:
        relative = f"landing/_shards/{night.isoformat()}/{run_id}"
        self.data_dir = data_dir
        self.relative = relative
        self.remote = data_dir.remote is not None
        if self.remote:
            from membersync.warehouse.landing.storage import s3_filesystem

            assert data_dir.remote is not None
            self.fs = fs or s3_filesystem()
            self.base = f"{data_dir.remote.removeprefix('s3://')}/{relative}"
            self.where = f"{data_dir.remote}/{relative}"
        else:
            self.fs = None
            self.base = str(data_dir.root / relative)
            self.where = self.base

    # -- objects -------------------------------------------------------------------------------------

    def _put(self, name: str, data: bytes) -> None:
        if self.fs is not None:
            self.fs.pipe_file(f"{self.base}/{name}", data)
        else:
            write_file_atomic(Path(self.base) / name, data)

    def _get(self, name: str) -> bytes | None:
        try:
            if self.fs is not None:
                return bytes(self.fs.cat_file(f"{self.base}/{name}"))
            return (Path(self.base) / name).read_bytes()
        except FileNotFoundError:
            return None

    def _names(self, folder: str) -> list[str]:
        try:
            if self.fs is not None:
                return [p.rsplit("/", 1)[-1] for p in self.fs.ls(f"{self.base}/{folder}", detail=False)]
            return [p.name for p in (Path(self.base) / folder).iterdir()]
        except FileNotFoundError:
            return []

    # -- the plan -------------------------------------------------------------------------------------

    def write_plan(self, plan: ShardPlan) -> None:
        self._put("plan.json", plan.to_json().encode())

    def read_plan(self) -> ShardPlan:
        data = self._get("plan.json")
        if data is None:
            raise ShardAreaError(f"{self.where}/plan.json: no shard plan (was the night's run started?)")
        return ShardPlan.from_json(data.decode(), f"{self.where}/plan.json")

    # -- batches ----------------------------------------------------------------------------------

    def write_batch(
        self,
        batch_id: str,
        tables: Mapping[str, pa.Table],
        quarantine: pa.Table | None,
        clients: Sequence[str],
    ) -> None:
        """Every table of the batch, then its marker (a batch without a marker is not there)."""
        rows = {}
        for name, table in [*tables.items(), *([(QUARANTINE, quarantine)] if quarantine is not None else [])]:
            sink = io.BytesIO()
            pq.write_table(table, sink)
            self._put(f"batches/{batch_id}/{name}.parquet", sink.getvalue())
            rows[name] = table.num_rows
        marker = {
            "batch": batch_id,
            "rows": rows,
            "clients": {"count": len(clients), "digest": client_digest(clients)},
        }
        self._put(f"batches/{batch_id}.done", json.dumps(marker, sort_keys=True).encode())
        crashpoint("after_shard_batch")

    # -- each launch: proof of life, and what it asked of the service ------------------------------

    def write_launch_stats(
        self,
        shard: int,
        launch: str,
        beat: int,
        stats: Mapping[str, int],
        by_status: Mapping[str, int] | None = None,
    ) -> None:
        """A launch's running totals (and its answers by HTTP status) and its ``beat`` (a count it
        raises every few seconds while alive, whatever Prefect's server records): the night's
        summary counts the requests, the night's watchdog watches the beat."""
        body: dict[str, Any] = {"shard": shard, "beat": beat}
        body |= {k: int(stats.get(k, 0)) for k in LAUNCH_STATS}
        body["by_status"] = {str(k): int(v) for k, v in (by_status or {}).items()}
        self._put(f"stats/{shard}-{launch}.json", json.dumps(body, sort_keys=True).encode())

    def _launches(self, shard: int | None = None) -> list[dict[str, Any]]:
        """The launches' stats files (of ``shard`` only: its files alone are read)."""
        found = []
        prefix = "" if shard is None else f"{shard}-"
        for name in self._names("stats"):
            if not name.startswith(prefix):
                continue
            data = self._get(f"stats/{name}")
            try:
                body = json.loads(data) if data is not None else None
            except ValueError:
                continue
            if isinstance(body, dict) and isinstance(body.get("shard"), int):
                found.append(body)
        return found

    def beats(self, shard: int) -> int:
        """The beats of every launch of ``shard`` (it grows while one is alive)."""
        mine = [b.get("beat") for b in self._launches(shard) if b["shard"] == shard]
        return sum(beat for beat in mine if isinstance(beat, int))

    def launch_totals(self) -> tuple[dict[str, int], dict[str, int]]:
        """Every launch's counts (:data:`LAUNCH_STATS`) and answers by HTTP status, each summed,
        from one read of the stats files (a malformed file or entry counts nothing)."""
        counts, statuses = [], []
        for body in self._launches():
            counts.append({k: v for k in LAUNCH_STATS if isinstance(v := body.get(k), int)})
            by_status = body.get("by_status")
            if isinstance(by_status, dict):
                statuses.append({k: v for k, v in by_status.items() if isinstance(v, int)})
        return {**dict.fromkeys(LAUNCH_STATS, 0), **add_counts(*counts)}, add_counts(*statuses)

    def done_batches(self) -> set[str]:
        return {n.removesuffix(".done") for n in self._names("batches") if n.endswith(".done")}

    def batch_fits(self, batch_id: str, clients: Sequence[str]) -> bool:
        marker = self._marker(batch_id)
        recorded = marker.get("clients") if marker else None
        return isinstance(recorded, dict) and recorded == {
            "count": len(clients),
            "digest": client_digest(clients),
        }

    def _marker(self, batch_id: str) -> dict[str, Any] | None:
        data = self._get(f"batches/{batch_id}.done")
        if data is None:
            return None
        try:
            body = json.loads(data)
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    def read_batch(self, batch_id: str) -> tuple[dict[str, pa.Table], pa.Table | None]:
        """The batch's tables (and quarantine) as its shard wrote them, checked against the marker."""
        marker = self._marker(batch_id)
        if marker is None or not isinstance(marker.get("rows"), dict):
            raise ShardAreaError(f"{self.where}/batches/{batch_id}.done: missing or malformed")
        tables: dict[str, pa.Table] = {}
        quarantine = None
        for name, rows in sorted(marker["rows"].items()):
            data = self._get(f"batches/{batch_id}/{name}.parquet")
            if data is None:
                raise ShardAreaError(f"{self.where}/batches/{batch_id}/{name}.parquet: missing")
            schema = QUARANTINE_SCHEMA if name == QUARANTINE else BY_NAME[name].schema
            table = pq.read_table(io.BytesIO(data), schema=schema)
            if table.num_rows != rows:
                where = f"{self.where}/batches/{batch_id}/{name}.parquet"
                raise ShardAreaError(f"{where}: {table.num_rows} rows, its marker says {rows}")
            if name == QUARANTINE:
                quarantine = table
            else:
                tables[name] = table
        return tables, quarantine

    def remove(self) -> None:
        """Forget the area (the night's staging holds every batch now): on ``s3://`` every
        version of every object (a shard's batch holds client numbers and names)."""
        if self.fs is not None:
            remove_shard_areas(self.data_dir, self.relative)
        else:
            shutil.rmtree(self.base, ignore_errors=True)


def remove_shard_areas(data_dir: DataDir, relative: str = SHARDS) -> int:
    """Delete shard areas in the data location for good (every version of every object under
    ``relative``; default: every night's); returns the objects deleted. A local data dir: the
    folder goes."""
    if data_dir.remote is None:
        folder = data_dir.root / relative
        count = sum(1 for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0
        shutil.rmtree(folder, ignore_errors=True)
        return count
    from membersync.warehouse.landing.storage import ObjectStore

    return ObjectStore(data_dir).sweep(relative)  # a staging area: no reader's, so no fence
