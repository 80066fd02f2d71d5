"""Issue 13: a large tenant's night fetched by shards, committed once (the pieces, without Prefect).

Real parts: the sandbox on loopback; the night's run (``NightRun`` + ``drive``, holding the data
dir's lock) in this process; every shard a real process (``tests/support/shard_worker.py``, what a shard
run does on a worker); the data location on local disk or on moto's S3 server. The first launch
of one shard is killed (SIGKILL, crash point ``after_shard_batch``) after its first batch, as a
lost worker: the night launches it again, the finished batch is kept, the night commits once and
every report equals the sandbox's truth. The first launch of another shard hangs: after ``STALL``
seconds without a beat or a finished batch the night gives it up (kills it) and launches it again.
The first launch of a third is reported crashed while its process works on (as when a busy
Prefect server drops heartbeats): the night waits for its beats to stop, and launches it only once.
The work-pool test (``tests/scenarios/test_work_pool.py``) runs the same through a Prefect server and workers.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import s3_prefix
from landed import synced_numbers
from membersync.extract.settings import ServiceSettings, Settings
from membersync.flows.night.nightly import NightRun, direct_steps, drive, holding_lock
from membersync.flows.night.options import SyncOptions
from membersync.flows.night.shards import fan_out
from membersync.warehouse.landing.paths import DataDir
from membersync.warehouse.landing.shard_area import ShardArea, ShardPlan, assign
from membersync.warehouse.landing.storage import s3_filesystem
from membersync.warehouse.landing.zone import LandingZone
from nights import TONIGHT as NIGHT
from nights import sync_env
from repo_root import REPO
from truth import assert_night_exact

WORKER = REPO / "tests" / "support" / "shard_worker.py"
SHARDS = 4
STALL = 20.0  # seconds without a beat or a finished batch before a running shard is given up


def test_batches_are_cut_into_contiguous_client_ranges() -> None:
    ids = [f"{i:05d}" for i in range(10)]
    shard_of = assign(ids, 4)
    assert [shard_of[b] for b in ids] == [0, 0, 0, 1, 1, 2, 2, 2, 3, 3]
    assert assign(ids[:2], 4) == {"00000": 0, "00001": 1}  # never an empty shard
    assert assign(["00003", "00001"], 1) == {"00001": 0, "00003": 0}


def test_launch_stats_sum_every_launch_and_skip_what_is_malformed(tmp_path: Path) -> None:
    area = ShardArea(DataDir(tmp_path), NIGHT, "run-1")
    counts = {"requests": 10, "retries": 1, "status_429": 1, "errors": 0, "bytes_received": 500}
    area.write_launch_stats(0, "a", 3, counts, {"200": 9, "429": 1})
    area.write_launch_stats(0, "b", 2, {**counts, "requests": 4}, {"200": 4})
    area.write_launch_stats(1, "c", 7, counts)  # a launch that recorded no answers by status
    stats = Path(area.base) / "stats"
    (stats / "1-d.json").write_text("{not json", encoding="utf-8")  # torn: counts nothing
    (stats / "2-e.json").write_text(json.dumps({"shard": 2, "beat": 1, "by_status": {"200": "x"}}))

    summed, statuses = area.launch_totals()
    assert summed == {
        "requests": 24,
        "retries": 3,
        "status_429": 3,
        "errors": 0,
        "bytes_received": 1500,
    }
    assert statuses == {"200": 13, "429": 1}
    assert (area.beats(0), area.beats(1), area.beats(2), area.beats(3)) == (5, 7, 1, 0)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_night_fetched_by_four_shards_one_killed_commits_once_exact(
    where: str, fresh_sandbox: Callable[..., Any], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    sandbox = fresh_sandbox(clients=120, seed=31, anchor_date=NIGHT)
    location = str(tmp_path / "data")
    extra: dict[str, str] = {"MEMBERSYNC_BATCH_SIZE": "10", "MEMBERSYNC_AUDIT_MAX_REQUESTS": "0"}
    if where == "s3":
        extra |= request.getfixturevalue("aws_env")
        location = s3_prefix("shards")
        extra["MEMBERSYNC_CACHE_DIR"] = str(tmp_path / "work")
    env = sync_env(sandbox, Path(location), tmp_path, **extra)
    env["MEMBERSYNC_DATA_DIR"] = location
    config = Settings.load(env)
    data_dir = DataDir.from_settings(config)
    launches: list[tuple[int, int | str, dict[str, Any] | None]] = []  # shard, exit code, counts
    running: list[asyncio.subprocess.Process] = []  # shards whose launch returned, still at work

    async def launch(plan: ShardPlan, shard: int, started: asyncio.Event) -> bool:
        started.set()  # (its process starts at once: the watchdog counts from now)
        first = not any(s == shard for s, _, _ in launches)
        cmd = [sys.executable, str(WORKER), str(shard), plan.night.isoformat(), plan.run_id]
        crash = {"MEMBERSYNC_CRASH_AT": "after_shard_batch:1"} if shard == 1 and first else {}
        if shard == 2 and first:  # a run that hangs: it never beats nor finishes a batch
            cmd = [sys.executable, "-c", "import time; time.sleep(3600)"]
        if shard == 3 and first:  # Prefect calls the run Crashed (heartbeats lost) while it works
            unread = asyncio.subprocess.DEVNULL  # (nobody reads its pipes)
            running.append(await asyncio.create_subprocess_exec(*cmd, env=env, stdout=unread, stderr=unread))
            launches.append((shard, "reported crashed", None))
            return False
        proc = await asyncio.create_subprocess_exec(
            *cmd, env={**env, **crash}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            out, _ = await proc.communicate()
        except asyncio.CancelledError:  # the night gave the shard up
            proc.kill()
            await proc.wait()
            launches.append((shard, "given up", None))
            raise
        assert proc.returncode is not None
        counts = json.loads(out) if proc.returncode == 0 else None
        launches.append((shard, proc.returncode, counts))
        return proc.returncode == 0

    async def night() -> Any:
        with holding_lock(data_dir) as zone:
            run = NightRun(
                ServiceSettings.from_settings(config),
                data_dir,
                NIGHT,
                options=SyncOptions.from_settings(config),
                zone=zone,
            )

            async def sharded(run: NightRun, pending: list[str]) -> None:
                await fan_out(run, pending, SHARDS, launch, stall=STALL)

            run.fan_out = sharded
            summary = await drive(run, direct_steps(run))
            codes = [await proc.wait() for proc in running]
            return summary, run.night.run_id, codes

    summary, run_id, codes = asyncio.run(night())

    assert summary.status == "committed" and summary.clients == 120
    # the night's requests include its shards' (the lost launches' up to their last batch)
    shard_requests = sum(c["requests"] for _, rc, c in launches if c is not None)
    served = sandbox.stats.requests
    assert shard_requests < summary.requests <= served, (shard_requests, summary.requests, served)
    # and its answers by status are the shards' too (a request in flight when a launch last beat
    # or was killed has no answer yet: at most one answer per request)
    answered = sum(summary.by_status.values())
    assert shard_requests < answered <= summary.requests, (summary.by_status, shard_requests)
    # shard 1 was lost after its first batch, launched again: that batch kept, the rest fetched;
    # shard 2's first run hung: given up after STALL seconds, launched again;
    # shard 3's run was reported crashed while it kept beating: waited for, never launched twice
    assert sorted((s, str(rc)) for s, rc, _ in launches) == [
        (0, "0"),
        (1, "-9"),
        (1, "0"),
        (2, "0"),
        (2, "given up"),
        (3, "reported crashed"),
    ]
    assert codes == [0]  # shard 3's process finished its batches on its own
    again = next(c for s, rc, c in launches if s == 1 and rc == 0)
    assert again is not None and again["kept"] == 1 and again["batches"] == 2
    # one commit of the night, every client once, the shard area gone
    zone = LandingZone(data_dir)
    assert [m.snapshot_date for m in zone.manifests()] == [NIGHT]
    landed = synced_numbers(zone, NIGHT)
    assert sorted(landed) == sorted(sandbox.call(lambda service: list(service.clients)))
    area = ShardArea(data_dir, NIGHT, run_id)
    assert area.done_batches() == set()
    if where == "s3":
        assert not s3_filesystem().exists(area.base)
    assert_night_exact(sandbox, data_dir, NIGHT)
