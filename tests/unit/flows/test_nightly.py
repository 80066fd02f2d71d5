"""The nightly sync against the sandbox over loopback: real HTTP, real Parquet, real DuckDB.

Ground truth is the sandbox's own in-memory state (``RunningSandbox.service``), read on the
sandbox's loop thread (``.call``) so it is consistent.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest_prefect import prefect_harness  # noqa: F401  (session fixture)
from landed import read_numbered, synced_numbers
from membersync.flows.night import batches as B
from membersync.flows.night.nightly import run_night
from membersync.flows.night.options import SyncOptions
from membersync.models import tables as T
from membersync.warehouse.landing.manifest import read_manifest
from membersync.warehouse.landing.paths import DataDir
from membersync.warehouse.landing.zone import LandingZone
from nights import settings_for, sync_env, truth_counts
from repo_root import MEMBERSYNC, REPO

TODAY = dt.date.today()
# today's night, as a user types it (run as a real process)
SYNC_CMD = [*MEMBERSYNC, "sync"]
SYNC_CMD += ["--date", TODAY.isoformat(), "--no-progress"]


def published_rows(data_dir: DataDir, night: dt.date) -> dict[str, Any]:
    """Every table of a committed night, read from the files its manifest names."""
    manifest = read_manifest(data_dir.manifests, night)
    assert manifest is not None, f"night {night} is not committed"
    zone = LandingZone(data_dir)
    return {name: zone.read(name, night) for name in manifest.tables}


def assert_unique_keys(tables: dict[str, Any]) -> None:
    for name, table in tables.items():
        key = T.landed(name).key
        if table.num_rows == 0:
            continue
        grouped = table.group_by(list(key)).aggregate([([], "count_all")])
        worst = pc.max(grouped["count_all"]).as_py()
        assert worst == 1, f"{name}: duplicate key {key}"


# --- a full night ---------------------------------------------------------------------------------


def test_full_night_lands_every_table_with_the_sandboxs_counts(
    fresh_sandbox: Callable[..., Any], tmp_path: Path
) -> None:
    sandbox = fresh_sandbox(clients=150, seed=7)
    data_dir = DataDir(tmp_path / "data")
    summary = run_night(settings_for(sandbox), data_dir, TODAY, options=SyncOptions(batch_size=40))

    assert summary.status == "committed" and summary.mode == "full"
    assert summary.batches == 4 and summary.clients == 150
    truth = sandbox.call(truth_counts)
    manifest = read_manifest(data_dir.manifests, TODAY)
    assert manifest is not None
    landed = {name: files.rows for name, files in manifest.tables.items()}
    assert landed == truth
    assert manifest.quarantine.rows == 0
    tables = published_rows(data_dir, TODAY)
    assert {n: t.num_rows for n, t in tables.items()} == truth
    assert_unique_keys(tables)
    # the watermark is the server's newest lastModified, not this machine's clock
    newest = sandbox.call(lambda s: max(c.last_modified for c in s.clients.values()))
    assert summary.watermark == newest.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert summary.build.startswith("ok") and data_dir.warehouse_db.exists()
    assert summary.requests >= 9 * 150 and summary.status_429 == 0


def test_a_client_that_cannot_be_fetched_fails_the_batch_naming_it(fresh_sandbox: Callable[..., Any]) -> None:
    import asyncio

    from membersync.extract.client import ServiceClient
    from membersync.models.coerce import TimezoneLookup

    sandbox = fresh_sandbox(clients=5)
    known = sandbox.call(lambda s: sorted(s.clients))[0]
    batch = B.Batch("00000", (B.ClientRef(known, None, None), B.ClientRef("99999999", None, None)))
    window = B.Window.for_night(TODAY, None, full=True, lookback_days=7, points_start=dt.date(2000, 1, 1))

    async def fetch() -> None:
        async with ServiceClient.from_settings(settings_for(sandbox)) as client:
            await B.fetch_batch(client, batch, window, frozenset(), TimezoneLookup())

    with pytest.raises(B.BatchFailed) as caught:
        asyncio.run(fetch())
    text = str(caught.value)
    # never a client number (the message reaches logs, notifications and Prefect): its place
    assert "batch 00000" in text and "client #2 of the batch" in text and "404" in text
    assert "99999999" not in text and known not in text
    keyed = str(caught.value.naming(lambda number: f"k-of-{number[-2:]}"))
    assert "client k-of-99" in keyed and "99999999" not in keyed
    named = [text.index(f"{name}: HTTP 404") for name in B.FANOUT_ENDPOINTS]
    assert named == sorted(named)  # every read that failed, in read order


def test_case_a_batch_sets_up_its_clients_a_few_at_a_time_and_the_earlier_batch_ends_first(
    sandbox: Any,
) -> None:
    """A batch's start set up all its clients' reads at once (2,250 requests), holding the event
    loop 100-200 ms at 500 req/s; and two batches in flight ended together (the first one's
    second round queued behind the second's reads), draining the pipeline. Now: at most
    CLIENTS_AT_ONCE clients of a batch have reads under way, every client's answer is its own,
    and of two batches in flight (one real client, against the real sandbox) the one started
    first ends while the other still has most of its clients to fetch."""
    import asyncio
    from collections import Counter

    from membersync.extract.client import ClientOptions, ServiceClient

    numbers = sandbox.call(lambda s: sorted(s.clients))
    assert len(numbers) >= 200
    first = B.Batch("00000", tuple(B.ClientRef(n, None, None) for n in numbers[:100]))
    second = B.Batch("00001", tuple(B.ClientRef(n, None, None) for n in numbers[100:200]))
    window = B.Window.for_night(TODAY, None, full=True, lookback_days=7, points_start=dt.date(2000, 1, 1))
    open_reads: Counter[str] = Counter()  # client -> its reads under way
    most_open = 0
    done_when_first_ended: list[int] = []
    clients_done = {"00000": 0, "00001": 0}

    async def fetch() -> tuple[B.RawBatch, B.RawBatch]:
        options = ClientOptions(max_concurrency=8, adaptive=False)
        async with ServiceClient.from_settings(settings_for(sandbox), options) as client:
            real_get = client.get

            async def get(endpoint: str, **params: Any) -> Any:
                nonlocal most_open
                number = params.get("clientNumber")
                if number is not None:
                    open_reads[number] += 1
                    most_open = max(most_open, len(open_reads))
                try:
                    return await real_get(endpoint, **params)
                finally:
                    if number is not None:
                        open_reads[number] -= 1
                        if not open_reads[number]:
                            del open_reads[number]

            client.get = get  # type: ignore[method-assign]

            async def one(batch: B.Batch) -> B.RawBatch:
                def advance(n: int) -> None:
                    clients_done[batch.id] += n

                raw = await B.fetch_batch_raw(client, batch, window, frozenset(), advance)
                if batch is first:
                    done_when_first_ended.append(clients_done["00001"])
                return raw

            got = await asyncio.gather(one(first), one(second))
            return got[0], got[1]

    raw_first, raw_second = asyncio.run(fetch())
    # each batch CLIENTS_AT_ONCE at a time, not all of its 100 at once
    assert 1 < most_open <= 2 * B.CLIENTS_AT_ONCE < len(first.clients) + len(second.clients)
    for raw, batch in ((raw_first, first), (raw_second, second)):
        assert list(raw.answers) == [c.number for c in batch.clients]
        for number, answer in raw.answers.items():  # each answer is its own client's
            assert answer["clientdetails"]["clientNumber"] == number
    assert done_when_first_ended and done_when_first_ended[0] < len(second.clients) // 2


# --- an incremental night -------------------------------------------------------------------------


def change_some_clients(service: Any) -> list[str]:
    """Writes through the service's own operations (each stamps lastModified)."""
    service.materialize_all()
    numbers = sorted(service.clients)
    a, b, c = numbers[3], numbers[10], numbers[20]
    service.update_demographics({"clientNumber": a, "lastName": "Changed-Tonight"})
    store = service.clients[b].home_store
    service.insert_points({"clientNumber": b, "storecode": store, "points": 25, "reason": "test"})
    service.update_comm_prefs({"clientNumber": c, "sms": True})
    return [a, b, c]


def test_incremental_night_fetches_only_changed_clients_and_current_state_covers_everyone(
    fresh_sandbox: Callable[..., Any], tmp_path: Path
) -> None:
    sandbox = fresh_sandbox(clients=120, seed=11)
    settings = settings_for(sandbox)
    data_dir = DataDir(tmp_path / "data")
    options = SyncOptions(batch_size=50)
    first = run_night(settings, data_dir, TODAY, options=options)
    assert first.mode == "full"
    # The truth, from the sandbox's own state: the first night's watermark is the newest
    # lastModified it discovered; tonight re-lists from there less the overlap (a setting).
    newest = sandbox.call(lambda s: max(c.last_modified for c in s.clients.values()))
    assert first.watermark is not None
    assert dt.datetime.fromisoformat(first.watermark.replace("Z", "+00:00")) == newest

    changed = sandbox.call(change_some_clients)
    since = newest - options.watermark_overlap
    expected = sandbox.call(lambda s: sorted(n for n, c in s.clients.items() if c.last_modified >= since))
    assert set(changed) <= set(expected) and len(expected) < 120  # the overlap may add a few

    night2 = TODAY + dt.timedelta(days=1)
    second = run_night(settings, data_dir, night2, options=options)
    assert second.mode == "incremental" and second.clients == len(expected)
    assert sorted(synced_numbers(data_dir, night2)) == expected
    # requests: configuration (8 + 5 per store) + one search page per store + nine reads per
    # changed client + a share lookup per membership of a package owner among them, plus the
    # self-audit's nine reads per sampled client (issue 9; default: at least 20 clients)
    stores = sandbox.call(lambda s: len(s.stores))
    n = len(expected)
    audit = 9 * second.audit_counts["sampled"]
    assert second.audit_counts["sampled"] == 20 and second.audit_counts["differed"] == 0
    assert 9 * n + audit <= second.requests <= 8 + 5 * stores + stores + 9 * n + 3 * n + audit
    assert second.requests - audit < first.requests / 4

    # the warehouse's current state still covers every client, with tonight's change in it
    with duckdb.connect(str(data_dir.identified_db), read_only=True) as con:
        count = con.execute("SELECT count(*) FROM marts.current_clients").fetchone()
        assert count is not None and count[0] == 120
        name = con.execute(
            "SELECT last_name FROM identity.clients WHERE client_number = ?", [changed[0]]
        ).fetchone()
        assert name == ("Changed-Tonight",)
    points_now = sandbox.call(lambda s: dict(s.clients[changed[1]].points))
    balances = read_numbered(data_dir, "points_balances", night2).to_pylist()
    landed = {r["storecode"]: r["points"] for r in balances if r["client_number"] == changed[1]}
    assert landed == points_now


# --- SIGKILL mid-landing, then resume -------------------------------------------------------------


@pytest.mark.slow
def test_sigkill_mid_landing_then_rerun_resumes_without_refetching(
    fresh_sandbox: Callable[..., Any], tmp_path: Path
) -> None:
    sandbox = fresh_sandbox(clients=200, seed=5, latency_ms=2.0)
    data_dir = tmp_path / "data"
    env = sync_env(sandbox, data_dir, tmp_path, MEMBERSYNC_BATCH_SIZE="10", MEMBERSYNC_BUILD="off")
    batches_dir = data_dir / "landing" / "_staging" / TODAY.isoformat() / "batches"

    proc = subprocess.Popen(
        SYNC_CMD, env=env, cwd=REPO, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 180  # Prefect's ephemeral server starts slowly on a busy machine
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if batches_dir.exists() and len(list(batches_dir.glob("0*.done"))) >= 4:
                break
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the sync (its Prefect server a thread of it)
        _, stderr = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, (
        f"the sync ended by itself ({proc.returncode}): {stderr[-2000:]!r}"
    )
    done_at_kill = {p.name for p in batches_dir.glob("0*.done")}
    assert 4 <= len(done_at_kill) < 20, "the kill must land mid-night"
    assert read_manifest(DataDir(data_dir).manifests, TODAY) is None

    # The rerun is the same command; it skips Prefect (MEMBERSYNC_PREFECT=off) only to spare the
    # suite a second ephemeral-server start: resuming is the landing zone's and NightRun's job,
    # the same code on both paths (the Prefect path is covered by the flow test below).
    rerun_env = {**env, "MEMBERSYNC_PREFECT": "off"}
    rerun = subprocess.run(SYNC_CMD, env=rerun_env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr

    dd = DataDir(data_dir)
    manifest = read_manifest(dd.manifests, TODAY)
    assert manifest is not None and manifest.stats["resumed"] is True
    assert manifest.stats["batches_skipped"] >= len(done_at_kill)
    # not refetched: the rerun asked only for the clients of the batches still to do
    remaining = 200 - 10 * manifest.stats["batches_skipped"]
    assert manifest.stats["requests"] <= 60 + 11 * remaining
    # every published file is readable, the counts are the sandbox's, no key twice
    for path in (dd.landing).rglob("*.parquet"):
        if "_staging" not in path.parts:
            pq.read_table(path)
    truth = sandbox.call(truth_counts)
    assert {name: files.rows for name, files in manifest.tables.items()} == truth
    assert_unique_keys(published_rows(dd, TODAY))
    assert not (dd.staging / TODAY.isoformat()).exists()


def test_a_second_sync_on_the_same_data_dir_says_already_running(
    fresh_sandbox: Callable[..., Any], tmp_path: Path
) -> None:
    sandbox = fresh_sandbox(clients=5)
    data_dir = tmp_path / "data"
    zone = LandingZone(DataDir(data_dir))
    env = sync_env(sandbox, data_dir, tmp_path)
    with zone.lock():
        proc = subprocess.run(
            [*MEMBERSYNC, "sync", "--no-progress"],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "already running" in lines[0], proc.stderr


# --- the Prefect flow -----------------------------------------------------------------------------


@pytest.mark.prefect
def test_prefect_flow_runs_a_task_per_batch_and_publishes_a_summary_artifact(
    prefect_harness: Path,  # noqa: F811
    fresh_sandbox: Callable[..., Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio

    from membersync.flows.night.prefect_flow import SUMMARY_ARTIFACT_KEY, nightly_sync
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterKey,
        FlowRunFilter,
        FlowRunFilterId,
    )

    sandbox = fresh_sandbox(clients=90)
    settings = settings_for(sandbox)
    secret = settings.password.get_secret_value()
    for key, value in sync_env(sandbox, tmp_path / "data", tmp_path, MEMBERSYNC_BATCH_SIZE="20").items():
        if key.startswith("MEMBERSYNC_"):
            monkeypatch.setenv(key, value)

    state = asyncio.run(nightly_sync(night=TODAY, return_state=True))
    assert state.is_completed(), state
    result = state.result()
    assert result["status"] == "committed" and result["clients"] == 90 and result["batches"] == 5

    async def inspect() -> tuple[list[Any], list[Any], Any]:
        async with get_client() as client:
            flow_run = await client.read_flow_run(state.state_details.flow_run_id)
            runs = await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id]))
            )
            artifacts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[SUMMARY_ARTIFACT_KEY])),
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])),
            )
            return runs, artifacts, flow_run

    # Task runs reach Prefect's database through its event pipeline, a moment after the flow run
    # ends (longer on a busy machine): wait for them rather than read too early.
    deadline = time.monotonic() + 60
    runs, artifacts, flow_run = asyncio.run(inspect())
    while len(runs) < 5 + 4 and time.monotonic() < deadline:
        time.sleep(0.5)
        runs, artifacts, flow_run = asyncio.run(inspect())
    names = sorted(r.name for r in runs)
    assert sum(n.startswith("batch-") for n in names) == 5  # one task run per batch, not per client
    assert len(runs) == 5 + 4
    assert secret not in repr(flow_run.parameters)
    assert set(flow_run.parameters) <= {"night", "full", "context"}  # context: a key, or None
    assert re.fullmatch(r"[0-9a-f]{32}", flow_run.parameters.get("context") or "0" * 32)
    assert artifacts and artifacts[0].type == "table"
    text = str(artifacts[0].data)
    assert "requests" in text and "rows: clients" in text and secret not in text


@pytest.mark.prefect
def test_case_the_default_path_records_its_flow_run_tasks_and_artifact_under_prefect_home(
    fresh_sandbox: Callable[..., Any], tmp_path: Path
) -> None:
    """Case: `membersync sync` with Prefect on and no PREFECT_API_URL (the default path): the
    local server it serves for the night (a thread of the command) leaves the flow run, one task
    run per batch and the summary artifact in PREFECT_HOME's database, read here with sqlite3."""
    import contextlib
    import sqlite3

    from membersync.flows.night.prefect_flow import SUMMARY_ARTIFACT_KEY, nightly_sync

    sandbox = fresh_sandbox(clients=50)
    env = sync_env(sandbox, tmp_path / "data", tmp_path, MEMBERSYNC_BATCH_SIZE="20", MEMBERSYNC_BUILD="off")
    proc = subprocess.run(SYNC_CMD, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]

    with contextlib.closing(sqlite3.connect(Path(env["PREFECT_HOME"]) / "prefect.db")) as db:
        runs = db.execute(
            "select r.id, r.state_type, r.parameters from flow_run r join flow f on f.id = r.flow_id "
            "where f.name = ?",
            (nightly_sync.name,),
        ).fetchall()
        assert len(runs) == 1, runs
        run_id, state, parameters = runs[0]
        tasks = db.execute(
            "select name, state_type from task_run where flow_run_id = ?", (run_id,)
        ).fetchall()
        artifacts = db.execute(
            "select type, data from artifact where key = ? and flow_run_id = ?",
            (SUMMARY_ARTIFACT_KEY, run_id),
        ).fetchall()
    assert state == "COMPLETED"
    batches = sorted(name for name, _ in tasks if name.startswith("batch-"))
    assert batches == ["batch-00000", "batch-00001", "batch-00002"]  # 50 clients, 20 a batch
    assert len(tasks) == 3 + 4 and {s for _, s in tasks} == {"COMPLETED"}, tasks
    assert len(artifacts) == 1 and artifacts[0][0] == "table"
    password = settings_for(sandbox).password.get_secret_value()
    assert password not in parameters and password not in artifacts[0][1]


@pytest.mark.prefect
def test_case_a_local_prefect_server_that_cannot_start_is_one_line_and_its_cause_is_in_the_log(
    fresh_sandbox: Callable[..., Any], tmp_path: Path
) -> None:
    """Case: the default path with a Prefect database that cannot be opened: the local server's
    start fails, the command says so in one line (exit 1), the log holds the cause and nothing is
    committed."""
    sandbox = fresh_sandbox(clients=5)
    data_dir = tmp_path / "data"
    env = sync_env(
        sandbox,
        data_dir,
        tmp_path,
        MEMBERSYNC_BUILD="off",
        PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{tmp_path}/no-such-dir/prefect.db",
    )
    proc = subprocess.run(SYNC_CMD, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert len(lines) == 1 and "the local Prefect server stopped during its start" in lines[0], lines
    log_text = "\n".join(p.read_text() for p in (data_dir / "logs").glob("sync-*.log"))
    assert "unable to open database file" in log_text
    assert read_manifest(DataDir(data_dir).manifests, TODAY) is None


def void_an_old_sale(service: Any, older_than: dt.date) -> str:
    """A void made at the till (the interface has no void endpoint): status and lastModified change."""
    service.materialize_all()
    old = next(
        t
        for _, t in sorted(service.transactions.items())
        if t.status == "Saved" and t.local_datetime.date() < older_than
    )
    old.status = "Voided"
    service.touch(service.clients[old.client_number])
    return str(old.receipt_number)


@pytest.mark.parametrize("whole_history", [False, True])
def test_a_void_older_than_the_lookback_is_seen_only_with_whole_history(
    fresh_sandbox: Callable[..., Any], tmp_path: Path, whole_history: bool
) -> None:
    sandbox = fresh_sandbox(clients=40, seed=3)
    settings = settings_for(sandbox)
    data_dir = DataDir(tmp_path / "data")
    options = SyncOptions(build=False, whole_history=whole_history)
    run_night(settings, data_dir, TODAY, options=options)
    receipt = sandbox.call(lambda s: void_an_old_sale(s, TODAY - dt.timedelta(days=60)))

    night2 = TODAY + dt.timedelta(days=1)
    second = run_night(settings, data_dir, night2, options=options)
    assert second.mode == "incremental"
    landed = published_rows(data_dir, night2)["transactions"].to_pylist()
    statuses = {r["receipt_number"]: r["status"] for r in landed}
    # The window (MEMBERSYNC_WHOLE_HISTORY=off, an opt-in) misses a change to a sale older than
    # the lookback; the default refetches the changed client's whole history and sees it.
    assert statuses.get(receipt) == ("Voided" if whole_history else None)
