"""The memory a build may use (``MEMBERSYNC_BUILD_MEMORY``), and how DuckDB is held to it.

The bound is the whole process's: Python, dbt and DuckDB. DuckDB gets what is left after a
reserve for the rest (:data:`PROCESS_RESERVE`, at least a quarter: :data:`DUCKDB_SHARE`) as its
``memory_limit``, and spills what does not fit to ``temp_directory`` (owner-only, in the
warehouse's work area: spilled pages hold client rows). Every DuckDB connection of a build-time
job (the dbt build through its profile, the parts and catalogs, the catalog edits of forget and
retention, the export of the reports, retention's reads) holds to it, through
:func:`apply_bound` or :func:`bound_connection`. Forget and migrations rewrite a night's files
with Arrow, a night at a time.

DuckDB's limit bounds its buffer manager, not what a single query holds outside it; a full
refresh therefore also builds the history in batches of nights sized by :func:`batch_nights`,
each batch the incremental build the nights would have had, so its peak is a batch's and not the
history's (the batch rule is Spark's partition-by-partition rebuild, in nights).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
from membersync.extract.settings import Settings, SettingsError, parse_size
from membersync.warehouse.landing.paths import DIR_MODE, DataDir

MIB = 1024 * 1024
# Python with dbt-core parsed and prefect imported, and the Arrow tables a build holds: what the
# process uses besides DuckDB's buffers (a whole night's build of 5,000 clients peaks at 357-394 MB,
# DuckDB included: docs/benchmarks.md).
PROCESS_RESERVE = 512 * MIB
# ... and at most this share of the bound: the rest grows with the history too (dbt's manifest
# rows, Arrow tables, file pages DuckDB maps). 100,000 clients x 365 nights with DuckDB at the
# bound less the reserve alone peaked at 3,885 MiB under a 4 GB bound.
DUCKDB_SHARE = 0.75
DUCKDB_FLOOR = 256 * MIB  # under this DuckDB spills nearly every operator: refuse, do not crawl
BUILD_SPILL = "build"  # the dbt build's spill folder: fixed, as dbt hashes its profile into its parse cache
DEFAULT_SHARE = 0.5  # of the machine's (or the cgroup's) memory, when the setting is unset
# A night's landed Parquet (zstd) held as DuckDB's working set across the project's models,
# measured on the synthetic history: a one-batch full refresh of 10,000 clients x 365 nights
# (163 MB of landed Parquet) peaked at 2.75-2.87 GB. A batch's landed bytes stay under the
# DuckDB limit over this.
EXPANSION = 16


@dataclass(frozen=True)
class MemoryBound:
    total: int  # bytes the process may use
    spill_dir: Path

    @property
    def duckdb_limit(self) -> int:
        return min(self.total - PROCESS_RESERVE, int(self.total * DUCKDB_SHARE))

    def settings(self) -> dict[str, str]:
        """DuckDB's settings for this bound (the dbt profile's, and every connection's)."""
        return {
            "memory_limit": f"{self.duckdb_limit // MIB}MiB",
            "temp_directory": str(self.spill_dir),
        }


def machine_memory() -> int:
    """The memory this process can have: the machine's, or its memory cgroup's limit if lower."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limits = [physical, *(x for x in (_cgroup_limit(),) if x is not None)]
    return min(limits)


def _cgroup_limit() -> int | None:
    """The limit of this process's memory cgroup (v2 ``memory.max``, v1 ``memory.limit_in_bytes``)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            candidates = [Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.max"]
        elif "memory" in controllers.split(","):
            candidates = [Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.limit_in_bytes"]
        else:
            continue
        for candidate in candidates:
            with contextlib.suppress(OSError, ValueError):
                value = candidate.read_text().strip()
                if value != "max" and int(value) < 1 << 60:
                    return int(value)
    return None


def build_memory(
    data_dir: DataDir, spill: str = BUILD_SPILL, settings: Settings | None = None
) -> MemoryBound:
    """The bound of ``MEMBERSYNC_BUILD_MEMORY`` (default half the machine's memory), spilling to
    ``spill`` in the work area; a bound that leaves DuckDB under :data:`DUCKDB_FLOOR` raises a
    one-line SettingsError."""
    settings = settings or Settings.load()
    machine = machine_memory()
    raw = settings.build_memory
    total = parse_size(raw, machine) if raw else int(machine * DEFAULT_SHARE)
    least = PROCESS_RESERVE + DUCKDB_FLOOR
    if total < least:
        raise SettingsError(
            f"MEMBERSYNC_BUILD_MEMORY: {total // MIB} MiB is below the {least // MIB} MiB a build needs"
        )
    return MemoryBound(total, spill_root(data_dir) / spill)


def spill_root(data_dir: DataDir) -> Path:
    """Where DuckDB spills: a folder per process (its pid), and the build's own (:data:`BUILD_SPILL`)."""
    return data_dir.root / "warehouse" / "spill"


def sweep_spill(data_dir: DataDir, alive: Callable[[int], bool]) -> None:
    """Remove what a process that is gone spilled (DuckDB removes its files when it closes; a
    killed one cannot). The build's folder goes too: the caller holds the build lock."""
    root = spill_root(data_dir)
    if not root.is_dir():
        return
    for folder in root.iterdir():
        if folder.name.isdigit() and alive(int(folder.name)):
            continue
        shutil.rmtree(folder, ignore_errors=True)


def bound_connection(
    data_dir: DataDir, database: str = ":memory:", *, read_only: bool = False
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection held to the build's memory bound, spilling to the work area."""
    bound = build_memory(data_dir, spill=str(os.getpid()))
    con = duckdb.connect(database, read_only=read_only)
    apply_bound(con, bound)
    return con


def apply_bound(con: duckdb.DuckDBPyConnection, bound: MemoryBound) -> None:
    """Hold ``con``'s database to ``bound``. A database this process already opened keeps the
    folder it began spilling to (DuckDB refuses to move it): its limit is lowered all the same."""
    bound.spill_dir.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    con.execute(f"SET memory_limit = '{bound.settings()['memory_limit']}'")
    try:
        con.execute(f"SET temp_directory = '{str(bound.spill_dir).replace(chr(39), chr(39) * 2)}'")
    except duckdb.Error as exc:
        if "temp" not in str(exc).lower():
            raise


def batch_nights(night_bytes: Sequence[int], bound: MemoryBound, fixed: int = 0) -> list[int]:
    """How many nights each batch of a full refresh takes, in order: ``fixed`` nights each when
    given, else as many nights as keep a batch's landed bytes under DuckDB's limit / EXPANSION
    (at least one night a batch: a single night over it is built alone, and spills)."""
    if not night_bytes:
        return []
    if fixed > 0:
        full, rest = divmod(len(night_bytes), fixed)
        return [fixed] * full + ([rest] if rest else [])
    budget = max(1, bound.duckdb_limit // EXPANSION)
    sizes: list[int] = []
    held = 0
    for size in night_bytes:
        if sizes and held + size <= budget:
            sizes[-1] += 1
            held += size
        else:
            sizes.append(1)
            held = size
    return sizes
