"""`membersync reports` racing a sync never publishes an older warehouse (issue 8, defect 2).

Before the fix `reports` built without the data dir's lock: paused while a sync committed and
built a newer night, it then swapped its older warehouse over the newer one. Now every writer
holds the lock, and the publish itself refuses to go backwards.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
from pathlib import Path

import duckdb
import pytest
import warehouse_scenario as sc
from membersync.flows.benchmarks.synthetic import write_night
from membersync.warehouse.build import builder as build_module
from membersync.warehouse.build.builder import build_warehouse
from membersync.warehouse.build.errors import BuildStaleError
from membersync.warehouse.build.publish import TMP_PREFIX
from membersync.warehouse.landing.manifest import read_manifests
from membersync.warehouse.landing.paths import DataDir
from membersync.warehouse.landing.zone import LandingZone
from repo_root import MEMBERSYNC, REPO

N1, N2 = dt.date(2026, 3, 1), dt.date(2026, 3, 2)


def _nights_in_warehouse(data_dir: DataDir) -> list[dt.date]:
    with duckdb.connect(str(data_dir.warehouse_db), read_only=True) as con:
        return [r[0] for r in con.execute("SELECT snapshot_date FROM meta.nights ORDER BY 1").fetchall()]


def _two_nights(tmp_path: Path) -> DataDir:
    data_dir = DataDir(tmp_path / "data")
    write_night(data_dir, N1, {"stores": sc.stores_of(0)})
    write_night(data_dir, N2, {"stores": sc.stores_of(1)}, mode="incremental")
    return data_dir


def test_reports_while_a_sync_holds_the_lock_waits_its_turn(tmp_path: Path) -> None:
    data_dir = _two_nights(tmp_path)
    env = {**os.environ, "MEMBERSYNC_DATA_DIR": str(data_dir.root), "COLUMNS": "200"}
    with LandingZone(data_dir).lock():  # a sync is running
        proc = subprocess.run(
            [*MEMBERSYNC, "reports"],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "another writer is running" in lines[0], proc.stderr
    assert not data_dir.warehouse_db.exists()  # it built nothing


def test_a_build_that_read_older_manifests_never_replaces_a_newer_warehouse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = _two_nights(tmp_path)
    build_warehouse(data_dir)  # the sync's build: nights 1 and 2
    assert _nights_in_warehouse(data_dir) == [N1, N2]

    # A `reports` build that read the manifests before night 2 was committed.
    older = [m for m in read_manifests(data_dir.manifests) if m.snapshot_date == N1]
    monkeypatch.setattr(build_module, "read_manifests", lambda _folder: older)
    with pytest.raises(BuildStaleError, match="a newer warehouse was published"):
        build_warehouse(data_dir)
    assert _nights_in_warehouse(data_dir) == [N1, N2]
    assert not list(data_dir.root.glob(f"{TMP_PREFIX}*"))  # no temporary left
