"""Issue 13: the landing zone on S3-compatible object storage (``MEMBERSYNC_DATA_DIR=s3://...``).

Real parts: moto's S3 server on 127.0.0.1 (a real HTTP endpoint, reached through s3fs exactly as
AWS S3 would be), the sandbox on loopback, real ``membersync sync`` / ``membersync reports``
processes (forked from the pre-imported zygote), SIGKILLed as whole process groups. Ground truth
is the sandbox's own state (:mod:`truth`).
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import truth
from conftest import SECRET, s3_prefix  # the moto S3 fixtures (s3_endpoint, aws_env) live in conftest
from membersync.extract.sandbox.running import RunningSandbox
from membersync.models.tables import LANDED_BY_NAME as BY_NAME
from membersync.warehouse.landing.night import LandingError
from membersync.warehouse.landing.paths import DataDir
from membersync.warehouse.landing.storage import ObjectStore, s3_filesystem
from membersync.warehouse.landing.zone import AlreadyRunning, LandingZone
from nights import TONIGHT as NIGHT
from reliability import Workspace, inspect

CHARTS_DRAWN = 10  # every chart of the morning report (warehouse/exports/morning.py read_charts), drawn


def s3_workspace(root: Path, sandbox: RunningSandbox, location: str, aws: dict[str, str]) -> Workspace:
    return Workspace(
        root,
        sandbox.url,
        NIGHT,
        extra_env={
            **aws,
            "MEMBERSYNC_DATA_DIR": location,
            "MEMBERSYNC_CACHE_DIR": str(root / "work"),
            "MEMBERSYNC_LEASE_SECONDS": "3",  # a killed writer's lease ends within 3 s
        },
    )


def analyst(root: Path, location: str) -> DataDir:
    """Another machine's view of the location: an empty working dir of its own."""
    return DataDir.remote_location(location, str(root / "analyst"))


def run_reports(ws: Workspace, location: str, cache: Path) -> Any:
    env = ws.env(MEMBERSYNC_DATA_DIR=location, MEMBERSYNC_CACHE_DIR=str(cache))
    return ws.sync(["reports"], env=env)


def remote_keys(location: str) -> list[str]:
    fs = s3_filesystem()
    return sorted(p.removeprefix(location.removeprefix("s3://") + "/") for p in fs.find(location))


def assert_remote_exact(location: str) -> None:
    """Every file a remote manifest names exists and is readable; no duplicate keys in a night."""
    store = ObjectStore(DataDir.remote_location(location, tempfile.mkdtemp(prefix="probe-")))
    keys = set(remote_keys(location))
    manifests = store.manifests()
    assert manifests, "no committed night in the bucket"
    for m in manifests:
        for name, files in m.tables.items():
            rows, seen = 0, set[tuple[object, ...]]()
            for f in files.files:
                assert f"landing/{f}" in keys, f"manifest {m.snapshot_date} names a missing object {f}"
                table = store.read_table(f, BY_NAME[name].schema)
                cols = list(BY_NAME[name].key)
                rows += table.num_rows
                seen.update(zip(*(table.column(c).to_pylist() for c in cols), strict=True))
            assert rows == len(seen) == files.rows, f"{m.snapshot_date} {name}: {rows} rows, {len(seen)} keys"


# --- a night on S3, reports from another machine -------------------------------------------------------


def test_night_on_s3_and_reports_from_another_working_dir_are_exact(
    sandbox: RunningSandbox, tmp_root: Path, aws_env: dict[str, str]
) -> None:
    location = s3_prefix("tenant-a")
    ws = s3_workspace(tmp_root, sandbox, location, aws_env)
    outcome = ws.sync()
    assert outcome.ok, outcome.describe()
    keys = remote_keys(location)
    assert f"landing/_manifests/{NIGHT}.json" in keys
    assert any(k.startswith("landing/clients/snapshot_date=") and k.endswith(".parquet") for k in keys)
    assert not any("_staging" in k or ".tmp-" in k for k in keys), keys
    # the night's own machine built its warehouse and uploaded the report files
    truth.assert_night_exact(sandbox, DataDir.remote_location(location, str(tmp_root / "work")), NIGHT)
    written = tmp_root / "work" / "reports" / NIGHT.isoformat()
    uploaded = {k.removeprefix(f"reports/{NIGHT}/") for k in keys if k.startswith(f"reports/{NIGHT}/")}
    assert uploaded == {p.name for p in written.iterdir()}, uploaded  # every report file, workbook too
    assert {f"{n}_{NIGHT}.csv" for n in truth.REPORT_NAMES} | {f"reports_{NIGHT}.xlsx"} <= uploaded
    # an analyst with an empty working dir: `membersync reports` reads the bucket, exact
    other = analyst(tmp_root, location)
    done = run_reports(ws, location, other.root)
    assert done.ok, done.describe()
    truth.assert_night_exact(sandbox, other, NIGHT)
    fs = s3_filesystem()
    for name in truth.REPORT_NAMES:
        local = truth.csv_path(other, NIGHT, name).read_bytes()
        assert fs.cat_file(f"{location}/reports/{NIGHT}/{name}_{NIGHT}.csv") == local
    assert inspect(other).problems() == []
    assert_remote_exact(location)
    assert_morning_report_from_the_bucket(sandbox, ws, location, other)
    # secrets: the AWS secret never lands anywhere we wrote (bucket, working dirs, logs)
    for k in keys:
        assert SECRET.encode() not in fs.cat_file(f"{location}/{k}"), k
    for path in tmp_root.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def assert_morning_report_from_the_bucket(
    sandbox: RunningSandbox, ws: Workspace, location: str, other: DataDir
) -> None:
    """The night's HTML morning report is in the bucket with the money owed the truth says, and
    an analyst's ``membersync report-html`` (an empty working dir) writes it again from the bucket
    with the same figures: five charts drawn, nothing to fetch."""
    night = NIGHT.isoformat()
    owed = sum(r["amount_owed"] for r in truth.truth_of(sandbox, NIGHT)["outstanding_balances_by_store"])
    assert owed > 0
    uploaded = s3_filesystem().cat_file(f"{location}/reports/{night}/morning_report_{night}.html").decode()
    env = ws.env(MEMBERSYNC_DATA_DIR=location, MEMBERSYNC_CACHE_DIR=str(other.root))
    made = ws.sync(["report-html", "--date", night], env=env)
    assert made.ok, made.describe()
    line = next(x for x in made.stdout.splitlines() if x.startswith("morning report: "))
    again = Path(line.removeprefix("morning report: ").strip()).read_text(encoding="utf-8")
    for html in (uploaded, again):
        assert f"{owed:,}" in html and html.count("<svg") == CHARTS_DRAWN and "<script" not in html


def test_duckdb_reads_the_bucket_through_a_registered_fsspec_filesystem(
    tmp_root: Path, aws_env: dict[str, str]
) -> None:
    from landing_batches import land_night
    from membersync.warehouse.landing.remote import duckdb_connect

    location = s3_prefix("duck")
    data_dir = DataDir.remote_location(location, str(tmp_root / "work"))
    zone = LandingZone(data_dir)
    land_night(zone, NIGHT, batches=2, rows=3)
    manifest = ObjectStore(data_dir).manifest(NIGHT)
    assert manifest is not None
    files = [f"{location}/landing/{f}" for f in manifest.tables["memberships"].files]
    con = duckdb_connect(data_dir)
    try:
        count = con.execute("SELECT count(*) FROM read_parquet(?)", [files]).fetchone()
    finally:
        con.close()
    assert count == (manifest.tables["memberships"].rows,)


# --- the commit is a conditional put -------------------------------------------------------------------


def _staged(root: Path, location: str, name: str) -> Any:
    from landing_batches import members

    zone = LandingZone(DataDir.remote_location(location, str(root / name)))
    lock = zone.lock()
    lock.__enter__()
    night = zone.open_night(NIGHT, "full")
    tables, quarantine = members(0 if name == "a" else 100, 4)
    night.write_batch("b0", tables, quarantine)
    return zone, lock, night


@pytest.mark.parametrize("round_", range(5))
def test_two_machines_racing_for_the_lease_exactly_one_writes(
    tmp_root: Path, aws_env: dict[str, str], round_: int
) -> None:
    """Two machines take the location's lease at the same instant: one holds it, the other is
    told who does (its conditional put of the lease refused), at once."""
    location = s3_prefix(f"race{round_}")
    zones = {name: LandingZone(DataDir.remote_location(location, str(tmp_root / name))) for name in "ab"}
    barrier = threading.Barrier(2)
    results: dict[str, Any] = {}
    release = threading.Event()

    def take(name: str) -> None:
        barrier.wait()
        try:
            with zones[name].lock():
                results[name] = zones[name]
                release.wait(30)
        except AlreadyRunning as exc:
            results[name] = exc
            release.set()

    threads = [threading.Thread(target=take, args=(name,)) for name in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    errors = [v for v in results.values() if isinstance(v, Exception)]
    assert len(results) == 2 and len(errors) == 1, results
    assert f"another writer holds {location}: `" in str(errors[0]) and "lease token 1" in str(errors[0])
    with zones["a"].lock():  # released: the next writer takes it at once (token 2)
        land_night_here(zones["a"])
    assert_remote_exact(location)


def land_night_here(zone: LandingZone) -> None:
    night = zone.open_night(NIGHT, "full")
    from landing_batches import members

    tables, quarantine = members(0, 4)
    night.write_batch("b0", tables, quarantine)
    night.commit(None, 1, {})


def test_a_rerun_replaces_a_committed_night_only_if_nobody_else_did(
    tmp_root: Path, aws_env: dict[str, str]
) -> None:
    from landing_batches import land_night

    location = s3_prefix("rerun")
    first = LandingZone(DataDir.remote_location(location, str(tmp_root / "a")))
    land_night(first, NIGHT)
    before = set(remote_keys(location))
    # a second machine opens a rerun of the committed night (its base: the manifest's etag) ...
    zone, lock, night = _staged(tmp_root, location, "b")
    lock.__exit__(None, None, None)  # ... is interrupted, and the first machine commits the night again
    land_night(first, NIGHT, first=50)
    with zone.lock(), pytest.raises(LandingError, match="committed by another writer"):
        night.commit(None, 1, {})  # the resumed rerun, under a lease of its own: its base is gone
    # a fresh rerun on the second machine replaces it, and the replaced run's parts go
    land_night(zone, NIGHT, first=200)
    after = set(remote_keys(location))
    parts = {k for k in before & after if k.endswith(".parquet")}
    assert not parts, f"replaced parts remain: {sorted(parts)}"
    assert_remote_exact(location)


# --- a crash mid-landing -------------------------------------------------------------------------------


@pytest.mark.parametrize("point", ["after_batch_landed:2", "after_publish"])
def test_sigkill_mid_landing_then_rerun_is_exact(
    fresh_sandbox: Callable[..., RunningSandbox], tmp_root: Path, aws_env: dict[str, str], point: str
) -> None:
    sandbox = fresh_sandbox(clients=80, seed=13, anchor_date=NIGHT)
    location = s3_prefix("kill")
    ws = s3_workspace(tmp_root, sandbox, location, aws_env)
    killed = ws.sync(env=ws.env(MEMBERSYNC_CRASH_AT=point))
    assert killed.status == -9, killed.describe()
    keys = remote_keys(location)
    assert f"landing/_manifests/{NIGHT}.json" not in keys  # nothing committed
    if point == "after_publish":
        assert any(k.endswith(".parquet") for k in keys)  # parts uploaded, no manifest: unseen
    rerun = ws.sync([*ws.argv(), "--wait"])  # the killed night's lease ends by itself
    assert rerun.ok, rerun.describe()
    other = analyst(tmp_root, location)
    done = run_reports(ws, location, other.root)
    assert done.ok, done.describe()
    truth.assert_night_exact(sandbox, other, NIGHT)
    assert inspect(other).problems() == []
    assert_remote_exact(location)
    assert_morning_report_from_the_bucket(sandbox, ws, location, other)
    named = {
        f"landing/{f}"
        for m in ObjectStore(other).manifests()
        for t in [*m.tables.values(), m.quarantine]
        for f in t.files
    }
    orphans = [k for k in remote_keys(location) if k.startswith("landing/") and k.endswith(".parquet")]
    assert sorted(set(orphans) - named) == [], "parts of the killed run remain beside the committed ones"


def test_a_bad_data_location_is_one_line_exit_2(sandbox: RunningSandbox, tmp_root: Path) -> None:
    ws = Workspace(tmp_root, sandbox.url, NIGHT, extra_env={"MEMBERSYNC_DATA_DIR": "gs://bucket/x"})
    outcome = ws.sync()
    assert outcome.status == 2, outcome.describe()
    lines = [line for line in outcome.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "MEMBERSYNC_DATA_DIR" in lines[0], lines


def test_parquet_parts_are_immutable_names(tmp_root: Path, aws_env: dict[str, str]) -> None:
    from landing_batches import land_night

    location = s3_prefix("names")
    data_dir = DataDir.remote_location(location, str(tmp_root / "w"))
    land_night(LandingZone(data_dir), NIGHT)
    manifest = ObjectStore(data_dir).manifest(NIGHT)
    assert manifest is not None
    for f in manifest.tables["memberships"].files:
        assert manifest.run_id in f
        assert pq.read_table(data_dir.landing / f).num_rows > 0  # the local mirror holds the same part
