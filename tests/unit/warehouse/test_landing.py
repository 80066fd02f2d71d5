"""The landing zone: atomic batches, the manifest commit, reruns, resume, crashes, lock, modes.

Crash tests kill a real subprocess (``tests/support/landing_worker.py``) with SIGKILL, at named crash
points (``MEMBERSYNC_CRASH_AT``) and at arbitrary moments while it writes, then check that the
previously committed night is intact, nothing partial is published, and a rerun finishes the
night with exactly one copy of every row.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from landing_batches import land_night, members
from membersync.models.coerce import BatchBuilder, quarantine_table
from membersync.warehouse.landing import night as night_mod
from membersync.warehouse.landing import zone as landing_mod
from membersync.warehouse.landing.manifest import read_manifests
from membersync.warehouse.landing.night import LandingError, LandingWriteError, SavedPlan
from membersync.warehouse.landing.paths import DataDir
from membersync.warehouse.landing.zone import AlreadyRunning, LandingZone
from repo_root import REPO

WORKER = REPO / "tests" / "support" / "landing_worker.py"
D1 = dt.date(2026, 11, 20)
D2 = dt.date(2026, 11, 21)
CANARY = "CANARY-SECRET-7f3a"


@pytest.fixture
def zone(tmp_path: Path) -> LandingZone:
    return LandingZone(DataDir(tmp_path / "data"))


@pytest.fixture
def open_umask() -> Iterator[None]:
    """A permissive umask: modes must come from the code, not from the caller's umask."""
    old = os.umask(0)
    yield
    os.umask(old)


def published_files(zone: LandingZone) -> set[str]:
    """Every file under published table paths (relative to landing/)."""
    landing = zone.data_dir.landing
    out = set()
    for top in landing.iterdir():
        if top.name in ("_manifests", "_staging"):
            continue
        out |= {str(p.relative_to(landing)) for p in top.rglob("*") if p.is_file()}
    return out


def named_files(zone: LandingZone) -> set[str]:
    out = set()
    for m in zone.manifests():
        out |= {f for t in m.tables.values() for f in t.files} | set(m.quarantine.files)
    return out


def assert_named_once_swept(zone: LandingZone) -> None:
    """Every published file is named by a manifest once the build's sweep has run.

    A rerun night's replaced identity files wait for that sweep (the identified tier reads the
    landed identity files until the new catalogs are published); nothing else may wait."""
    waiting = published_files(zone) - named_files(zone)
    assert {rel.split("/")[0] for rel in waiting} <= landing_mod.PERSONAL_TABLES, waiting
    landing_mod.sweep_personal_files(zone.data_dir)
    assert published_files(zone) == named_files(zone)


def temp_files(zone: LandingZone) -> list[Path]:
    return [p for p in zone.data_dir.root.rglob("*") if landing_mod.TMP_MARK in p.name]


def assert_committed_readable(zone: LandingZone) -> None:
    """Every manifest-named file is a complete Parquet file with the manifest's row count."""
    for m in zone.manifests():
        for name, files in m.tables.items():
            assert zone.read(name, m.snapshot_date).num_rows == files.rows
        assert zone.read("_quarantine", m.snapshot_date).num_rows == m.quarantine.rows


# --- write, commit, read ---------------------------------------------------------------------------


def test_commit_publishes_named_files_and_the_manifest(zone: LandingZone) -> None:
    land_night(zone, D1, batches=2, rows=3)
    manifest = zone.manifest(D1)
    assert manifest is not None
    files = manifest.tables["memberships"].files
    assert len(files) == 2
    for rel in files:
        assert rel.startswith("memberships/snapshot_date=2026-11-20/part-")
        assert rel.endswith((f"{manifest.run_id}-b0.parquet", f"{manifest.run_id}-b1.parquet"))
    assert manifest.tables["memberships"].rows == 6
    assert manifest.quarantine.rows == 2 and manifest.quarantine_by_table == {"memberships": 2}
    table = zone.read("memberships", D1)
    assert sorted(table["membership_id"].to_pylist()) == [f"M{n:06d}" for n in range(6)]
    assert table.schema.field("monthly_dues").type == pa.decimal128(18, 2)
    assert published_files(zone) == named_files(zone)
    assert not (zone.data_dir.staging / D1.isoformat()).exists()
    assert zone.state().committed == [D1] and zone.state().watermark == "2026-11-20T01:00:00Z"
    state_file = json.loads(zone.data_dir.state_file.read_text())
    assert state_file["last_night"] == "2026-11-20"


def test_modes_are_owner_only_whatever_the_umask(zone: LandingZone, open_umask: None) -> None:
    land_night(zone, D1)
    with zone.lock():
        run = zone.open_night(D2, "full")  # a staged, uncommitted run too
        run.save_discovery([{"clientNumber": "1"}], 1)
        run.write_batch("b0", *members(0, 2))
    paths = [zone.data_dir.root, *zone.data_dir.root.rglob("*")]
    assert len(paths) > 15
    for path in paths:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), f"{path}: {oct(mode)}"


def test_write_batch_is_all_or_nothing(zone: LandingZone, monkeypatch: pytest.MonkeyPatch) -> None:
    real = night_mod._write_parquet
    calls = {"n": 0}

    def second_file_fails(table: pa.Table, path: Path) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        real(table, path)

    with zone.lock():
        run = zone.open_night(D1, "full")
        monkeypatch.setattr(night_mod, "_write_parquet", second_file_fails)
        tables, quarantine = members(0, 3)
        with pytest.raises(LandingWriteError, match="No space left on device"):
            run.write_batch("b0", tables, quarantine)  # memberships written, quarantine fails
        assert run.done_batches() == set()
        assert list(run.batches.iterdir()) == []  # no half batch, no temp folder
        monkeypatch.setattr(night_mod, "_write_parquet", real)
        run.write_batch("b0", tables, quarantine)
        assert run.done_batches() == {"b0"}


def test_write_batch_rejects_bad_input(zone: LandingZone) -> None:
    with zone.lock():
        run = zone.open_night(D1, "full")
        tables, _ = members(0, 1)
        with pytest.raises(ValueError, match="bad batch id"):
            run.write_batch("../escape", tables)
        with pytest.raises(ValueError, match="unknown typed table"):
            run.write_batch("b0", {"nope": tables["memberships"]})
        with pytest.raises(ValueError, match="declared schema"):
            run.write_batch("b0", {"clients": tables["memberships"]})
    with pytest.raises(LandingError, match=r"zone\.lock"):
        run.write_batch("b1", tables)
    with pytest.raises(LandingError, match=r"zone\.lock"):
        zone.open_night(D1, "full")


def test_rerun_of_a_night_replaces_it_without_duplicates(zone: LandingZone) -> None:
    land_night(zone, D1, batches=2, rows=3)
    land_night(zone, D2, batches=1, rows=2, first=100)
    first = zone.manifest(D1)
    assert first is not None
    land_night(zone, D1, batches=3, rows=3)  # the same night again
    second = zone.manifest(D1)
    assert second is not None and second.run_id != first.run_id
    ids = zone.read("memberships", D1)["membership_id"].to_pylist()
    assert len(ids) == len(set(ids)) == 9
    assert zone.read("_quarantine", D1).num_rows == 3
    for rel in first.tables["memberships"].files + first.quarantine.files:
        assert not (zone.data_dir.landing / rel).exists()  # replaced files are gone
    assert zone.read("memberships", D2).num_rows == 2  # the other night is untouched
    assert_named_once_swept(zone)
    assert zone.state().committed == [D1, D2]


def test_case_a_discovery_of_many_chunks_is_saved_whole_and_read_back_exactly(zone: LandingZone) -> None:
    """Case: the saved discovery is written a chunk of records at a time (from a generator, so
    never all as dicts at once); across chunk boundaries it reads back record for record."""
    count = 2 * night_mod.DISCOVERY_CHUNK + 1
    expected = [
        {
            "clientNumber": f"{i:06d}",
            "homeStore": "S" if i % 2 else None,
            "lastModified": f"2026-01-{i % 28 + 1:02d}",
        }
        for i in range(count)
    ]
    with zone.lock():
        run = zone.open_night(D1, "full")
        run.save_discovery((dict(r) for r in expected), 7)
        text = (run.folder / "discovery.json").read_text()
        assert json.loads(text) == {"format": 2, "batch_size": 7, "clients": expected}
        assert run.saved_discovery() == SavedPlan(expected, 7)
        run.save_discovery(iter(()), 3)  # no client changed
        assert run.saved_discovery() == SavedPlan([], 3)


def test_case_a_record_that_cannot_be_written_fails_clearly_and_keeps_the_saved_discovery(
    zone: LandingZone,
) -> None:
    """Case: a record JSON cannot hold (non-string keys) in the last chunk: a clear error, the
    earlier saved discovery stays as it was, and no temporary file is left."""
    records = [{"clientNumber": f"{i:06d}"} for i in range(night_mod.DISCOVERY_CHUNK)]
    with zone.lock():
        run = zone.open_night(D1, "full")
        run.save_discovery(records, 2)
        bad = [*records, {"clientNumber": "999999", "homeStore": {(1, 2): "x", "a": 1}}]
        with pytest.raises(
            LandingWriteError, match=r"cannot save discovery of night .*cannot be written as JSON"
        ):
            run.save_discovery(bad, 2)
        assert run.saved_discovery() == SavedPlan(records, 2)
    assert temp_files(zone) == []


def test_an_interrupted_run_resumes_with_its_batches_and_discovery(zone: LandingZone) -> None:
    with zone.lock():
        run = zone.open_night(D1, "full")
        assert not run.resumed and run.saved_discovery() is None
        run.save_discovery([{"clientNumber": "000001", "password": CANARY}, {"clientNumber": "000002"}], 2)
        run.write_batch("b0", *members(0, 2))
        first_id = run.run_id
    # the process "died" here: no commit
    with zone.lock():
        again = zone.open_night(D1, "full")
        assert again.resumed and again.run_id == first_id
        assert again.done_batches() == {"b0"}
        assert again.saved_discovery() == SavedPlan(
            [{"clientNumber": "000001"}, {"clientNumber": "000002"}], 2
        )
        again.write_batch("b1", *members(2, 2))
        manifest = again.commit(None, 2, {})
    assert manifest.run_id == first_id
    assert zone.read("memberships", D1).num_rows == 4
    # another mode does not resume a run of a different kind
    with zone.lock():
        run = zone.open_night(D2, "full")
        run.write_batch("b0", *members(0, 1))
    with zone.lock():
        other = zone.open_night(D2, "incremental")
        assert not other.resumed and other.done_batches() == set()


def test_state_follows_the_manifests_not_state_json(zone: LandingZone) -> None:
    assert zone.state().last_night is None and zone.state().watermark is None
    land_night(zone, D1)
    zone.data_dir.state_file.write_text(json.dumps({"last_night": "2030-01-01", "watermark": "2030"}))
    assert zone.state().last_night == D1
    with zone.lock():
        zone.recover()  # rewrites the copy from the manifests
    assert json.loads(zone.data_dir.state_file.read_text())["last_night"] == "2026-11-20"
    with zone.lock():
        run = zone.open_night(D2, "incremental")
        run.write_batch("b0", *members(0, 1))
        assert zone.state().last_night == D1  # staged, not committed: state does not advance
        run.commit("2026-11-21T00:30:00Z", 1, {})
    assert zone.state().last_night == D2 and zone.state().watermark == "2026-11-21T00:30:00Z"


def test_recover_sweeps_orphans_and_temp_files(zone: LandingZone) -> None:
    land_night(zone, D1)
    partition = zone.data_dir.landing / "memberships" / "snapshot_date=2026-11-20"
    stray = partition / "part-someone-else.parquet"
    stray.write_bytes(b"PAR1 not really")
    (zone.data_dir.manifests / f".2026-11-21.json{landing_mod.TMP_MARK}1-ab").write_text("{")
    (zone.data_dir.landing / "clients" / "snapshot_date=2026-11-19").mkdir(parents=True)
    assert zone.read("memberships", D1).num_rows == 6  # readers never see the stray file
    with zone.lock():
        zone.recover()  # quick: only nights with a staging area are scanned
        assert stray.exists() and temp_files(zone) == []
        zone.recover(full=True)
    assert not stray.exists()
    assert not (zone.data_dir.landing / "clients").exists()
    assert published_files(zone) == named_files(zone)
    assert zone.read("memberships", D1).num_rows == 6


def test_commit_refuses_stats_that_are_not_json(zone: LandingZone) -> None:
    with zone.lock():
        run = zone.open_night(D1, "full")
        with pytest.raises(ValueError, match="JSON"):
            run.commit(None, 0, {"when": dt.date(2026, 1, 1)})
        run.commit(None, 0, {})  # an empty night still commits
        with pytest.raises(LandingError, match="already committed"):
            run.commit(None, 0, {})


def test_secrets_never_reach_any_written_file(zone: LandingZone) -> None:
    builder = BatchBuilder()
    builder.add(
        "processor_credentials",
        [{"processor": "X", "merchantId": "M1", "username": CANARY, "password": CANARY, "apiKey": CANARY}],
        {"@storecode": "DOWNTOWN  ", "@type": "POS"},
    )
    builder.add(
        "billing_accounts",
        [
            {
                "billingAccountId": "B1",
                "tokenId": CANARY,
                "vaultToken": CANARY,
                "accountNo": CANARY,
                "routingNo": CANARY,
                "note": {"nested": [{"apiKey": CANARY, "ok": 1}]},
            },
            {"billingAccountId": 12, "tokenId": CANARY, "deep": [{"x": {"password": CANARY}}]},  # quarantined
        ],
        {"clientNumber": "000417"},
    )
    landed = builder.build()
    quarantine = quarantine_table([q for t in landed.values() for q in t.quarantine])
    assert quarantine.num_rows == 1
    with zone.lock():
        run = zone.open_night(D1, "full")
        run.save_discovery([{"clientNumber": "1", "newPassword": CANARY}], 1)
        run.write_batch("b0", {k: v.table for k, v in landed.items()}, quarantine)
        staged = [p for p in zone.data_dir.root.rglob("*") if p.is_file()]
        run.commit(None, 1, {})
    files = staged + [p for p in zone.data_dir.root.rglob("*") if p.is_file()]
    parquet = 0
    for path in files:
        if not path.exists():
            continue
        assert CANARY.encode() not in path.read_bytes(), path
        if path.suffix == ".parquet":
            parquet += 1
            decoded = json.dumps(pq.read_table(path).to_pylist(), default=str)
            assert CANARY not in decoded, path
    assert parquet >= 3
    billing = zone.read("billing_accounts", D1).to_pylist()
    assert json.loads(billing[0]["extra"]) == {"note": {"nested": [{"ok": 1}]}}


# --- lock ------------------------------------------------------------------------------------------

HOLD_LOCK = """
import sys, time
from pathlib import Path
from membersync.warehouse.landing.zone import LandingZone
from membersync.warehouse.landing.paths import DataDir
with LandingZone(DataDir(Path(sys.argv[1]))).lock():
    print("locked", flush=True)
    sys.stdin.readline()
"""


def test_a_second_sync_fails_at_once_naming_the_holder(zone: LandingZone) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(zone.data_dir.root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(AlreadyRunning) as caught, zone.lock():
            pass
        text = str(caught.value)
        assert text.startswith(f"another writer is running on {zone.data_dir.root}: `"), text
        assert f", pid {holder.pid}, since " in text, text
        with pytest.raises(AlreadyRunning):
            zone.recover()  # recovery, too, waits for no one
    finally:
        holder.communicate("\n", timeout=30)
    with zone.lock():  # released by the holder's exit
        pass
    with zone.lock(), pytest.raises(AlreadyRunning, match=f"pid {os.getpid()}"), zone.lock():
        pass  # a second lock in the same process is refused too


# --- crashes (real SIGKILL) --------------------------------------------------------------------------


def worker(
    data_dir: Path, night: dt.date, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(data_dir), night.isoformat(), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, list[str]]:
    out, err = proc.communicate(timeout=300)
    assert "Traceback" not in err, err
    return proc.returncode, out.splitlines()


def check_after_crash(zone: LandingZone, before: dict[str, list[object]]) -> None:
    """The committed night is intact; nothing partial is published; recover leaves no temp."""
    for path in zone.data_dir.landing.rglob("*.parquet"):
        if "_staging" not in path.parts:
            pq.read_metadata(path)  # complete (a footer), even when not yet named by a manifest
    assert zone.read("memberships", D1).column("membership_id").to_pylist() == before["ids"]
    with zone.lock():
        zone.recover()
    assert temp_files(zone) == []
    assert published_files(zone) == named_files(zone)
    assert_committed_readable(zone)
    assert zone.read("memberships", D1).column("membership_id").to_pylist() == before["ids"]


def rerun_and_check(zone: LandingZone, batches: int, rows: int) -> list[str]:
    code, lines = finish(worker(zone.data_dir.root, D2, str(batches), str(rows)))
    assert code == 0 and lines[-1].startswith("committed"), lines
    table = zone.read("memberships", D2)
    ids = table["membership_id"].to_pylist()
    assert len(ids) == len(set(ids)) == batches * rows  # each row exactly once
    assert zone.read("_quarantine", D2).num_rows == batches
    assert temp_files(zone) == []
    assert_named_once_swept(zone)
    assert not (zone.data_dir.staging / D2.isoformat()).exists()
    assert zone.state().committed == [D1, D2]
    return lines


@pytest.mark.slow
@pytest.mark.parametrize(
    "point",
    ["after_batch_landed:2", "before_commit", "after_publish", "after_commit", "after_state_saved"],
)
def test_sigkill_at_each_step_loses_nothing(zone: LandingZone, point: str) -> None:
    land_night(zone, D1, batches=2, rows=3)
    before = {"ids": zone.read("memberships", D1).column("membership_id").to_pylist()}
    code, lines = finish(worker(zone.data_dir.root, D2, "4", "50", env={"MEMBERSYNC_CRASH_AT": point}))
    assert code == -signal.SIGKILL, lines
    committed = point in ("after_commit", "after_state_saved")
    assert (zone.manifest(D2) is not None) == committed
    check_after_crash(zone, before)
    if committed:
        assert zone.read("memberships", D2).num_rows == 200
        assert zone.state().committed == [D1, D2]
        return
    assert zone.state().committed == [D1]  # state never ahead of the commits
    lines = rerun_and_check(zone, 4, 50)
    assert lines[0].endswith("resumed=True")
    wrote_before = 2 if point.startswith("after_batch_landed") else 4
    assert sum(line.startswith("skipped") for line in lines) == wrote_before


@pytest.mark.slow
def test_sigkill_at_arbitrary_moments_while_writing(zone: LandingZone) -> None:
    """Kill after the n-th batch of each run plus a little while: mid-file, mid-rename, mid-commit."""
    land_night(zone, D1, batches=2, rows=3)
    before = {"ids": zone.read("memberships", D1).column("membership_id").to_pylist()}
    batches = 12
    for written, delay in ((0, 0.0), (0, 0.05), (2, 0.01), (1, 0.03), (-1, 0.0), (-1, 0.02)):
        proc = worker(zone.data_dir.root, D2, str(batches), "3000")
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("ready")
        # -1: once every batch is written or skipped (a batch an earlier run landed, whether or not
        # it lived to say so), i.e. in the commit
        wrote = done = 0
        while (wrote < written) if written >= 0 else (done < batches):
            line = proc.stdout.readline()
            assert line, "the worker ended early"
            wrote += line.startswith("wrote")
            done += line.startswith(("wrote", "skipped"))
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        check_after_crash(zone, before)
        if zone.manifest(D2) is not None:  # the kill came after the commit: a rerun replaces it
            break
    lines = rerun_and_check(zone, 12, 3000)
    assert any(line.startswith(("wrote", "skipped")) for line in lines)


@pytest.mark.slow
@pytest.mark.parametrize("limit_at", ["write", "commit"])
def test_a_failed_write_keeps_the_previous_night_published(zone: LandingZone, limit_at: str) -> None:
    land_night(zone, D2, batches=2, rows=3)  # the night that will be rerun
    before = zone.manifest(D2)
    assert before is not None
    size = "4096" if limit_at == "write" else "600"  # commit: batches fit, the manifest does not
    code, lines = finish(
        worker(zone.data_dir.root, D2, "3", "400", "--fsize-limit", size, "--limit-at", limit_at)
    )
    assert code == 3, lines
    assert "write-error" in lines[-1] and "File too large" in lines[-1]
    assert zone.manifest(D2) == before  # the previous state of this night is still the commit
    assert zone.read("memberships", D2).num_rows == 6
    for path in zone.data_dir.landing.rglob("*"):
        if "_staging" not in path.parts:
            assert landing_mod.TMP_MARK not in path.name  # no temp file in published paths
    with zone.lock():
        zone.recover()
    assert temp_files(zone) == []
    assert published_files(zone) == named_files(zone)
    assert [m.snapshot_date for m in read_manifests(zone.data_dir.manifests)] == [D2]
    code, lines = finish(worker(zone.data_dir.root, D2, "3", "400"))  # without the limit: done
    assert code == 0, lines
    assert zone.read("memberships", D2).num_rows == 1200


def test_a_staged_batch_fits_only_its_own_client_set(zone: LandingZone) -> None:
    """Defect 1 of issue 8: a batch is reused by its recorded client set, never by its number alone."""
    with zone.lock():
        run = zone.open_night(D1, "full")
        tables, quarantine = members(0, 2)
        run.write_batch("00000", tables, quarantine, clients=["000001", "000002"])
        assert run.batch_fits("00000", ["000001", "000002"])
        assert not run.batch_fits("00000", ["000001", "000002", "000003"])  # cut by a bigger batch size
        assert not run.batch_fits("00000", ["000001"])
        run.write_batch("00001", *members(2, 2))  # a marker without a client set never fits
        assert not run.batch_fits("00001", [])
        run.discard_batch("00001")
        assert run.done_batches() == {"00000"}
