"""A resumed night lands exactly the clients its discovery found (issue 8, defect 1).

The run is killed (SIGKILL, through the named crash point) right after its first client batch
is staged with a batch size of 50; the rerun uses the default batch size of 250. Before the
fix the rerun cut the saved discovery into batches of 250, took staged batch ``00000`` (50
clients) as the new batch ``00000`` (250 clients) by its number alone, and committed 300 of 500
clients while saying "clients synced 500". Truth: the sandbox's own client numbers.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
from landed import synced_numbers
from membersync.models import tables as T
from membersync.warehouse.landing.manifest import read_manifest
from membersync.warehouse.landing.night import LandingError
from membersync.warehouse.landing.paths import DataDir
from membersync.warehouse.landing.zone import LandingZone
from nights import TONIGHT as NIGHT
from nights import sync_env
from repo_root import MEMBERSYNC, REPO


def _sync(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cmd = [*MEMBERSYNC, "sync", "--date", NIGHT.isoformat(), "--no-progress"]
    return subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_resume_after_a_batch_size_change_lands_every_discovered_client(
    fresh_sandbox: Callable[..., Any], tmp_path: Path
) -> None:
    sandbox = fresh_sandbox(clients=500, seed=11, anchor_date=NIGHT)
    truth = sorted(sandbox.call(lambda service: list(service.clients)))
    data_dir = tmp_path / "data"
    # Prefect off: resuming is NightRun's and the landing zone's job, the same code on both paths.
    env = sync_env(sandbox, data_dir, tmp_path, MEMBERSYNC_BUILD="off", MEMBERSYNC_PREFECT="off")

    # after_batch_landed:2 = the first *client* batch (the configuration is batch 1)
    killed = _sync({**env, "MEMBERSYNC_BATCH_SIZE": "50", "MEMBERSYNC_CRASH_AT": "after_batch_landed:2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    staged = data_dir / "landing" / "_staging" / NIGHT.isoformat() / "batches"
    client_batches = [p.name for p in staged.glob("0*.done")]
    # two batches are in flight (written in threads): one, or both, may be staged at the kill
    assert 1 <= len(client_batches) <= 2, client_batches

    rerun = _sync(env)  # the default batch size (250)
    assert rerun.returncode == 0, rerun.stderr
    dd = DataDir(data_dir)
    manifest = read_manifest(dd.manifests, NIGHT)
    assert manifest is not None
    landed = sorted(synced_numbers(dd, NIGHT))
    assert landed == truth  # all 500, each once
    assert manifest.clients_synced == 500 and manifest.tables["clients"].rows == 500
    # The resumed run kept the first run's plan (batches of 50), reusing the staged one.
    assert manifest.stats["batches"] == 10 and manifest.stats["batches_skipped"] == len(client_batches)
    assert "clients synced" in rerun.stdout and "500" in rerun.stdout


def test_a_commit_that_would_lose_clients_is_refused(
    fresh_sandbox: Callable[..., Any], tmp_path: Path
) -> None:
    """The landing zone's own guard: staged batches must hold exactly the discovered clients."""

    zone = LandingZone(DataDir(tmp_path / "data"))

    schema = T.table("synced_clients").schema
    one = pa.Table.from_pylist(
        [{name: None for name in schema.names} | {"client_number": "000001"}], schema=schema
    )
    with zone.lock():
        night = zone.open_night(NIGHT, "full")
        night.write_batch("00000", {"synced_clients": one}, clients=["000001"])
        try:
            night.commit(None, 2, {})
        except LandingError as exc:
            assert "hold 1 clients but the night discovered 2" in str(exc)
        else:
            raise AssertionError("a night missing a client was committed")
    assert read_manifest(DataDir(tmp_path / "data").manifests, NIGHT) is None
