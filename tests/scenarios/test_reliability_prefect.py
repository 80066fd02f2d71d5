"""Issue 5 with Prefect on, and the secrets scenario: the reliability scenarios that run the exec'd CLI.

In a file of their own so that the test runner can spread the longest scenarios over its workers;
helpers and ground truth as in tests/scenarios/test_reliability.py.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import duckdb
import pyarrow.parquet as pq
import pytest
import truth
from membersync.extract.sandbox.running import RunningSandbox
from reliability import (
    ANCHOR,
    Workspace,
    assert_clean,
    assert_ok,
    inspect,
    record,
    touch_sandbox,
)

# --- 11. secrets ---------------------------------------------------------------------------------------

USERNAME = "canary-user-5Hq"
PASSWORD = "Cn4ry+P@ss/wörd 77!"


def _plant_canaries(service: Any) -> dict[str, str]:
    """Canary values in every secret field the service holds; returns name -> value."""
    planted: dict[str, str] = {}
    for i, cred in enumerate(service.credentials):
        cred.username = planted[f"cred{i}.username"] = f"CANARYCREDUSER{i:03d}"
        cred.password = planted[f"cred{i}.password"] = f"CANARYCREDPASS{i:03d}"
        cred.api_key = planted[f"cred{i}.apiKey"] = f"CANARYAPIKEY{i:03d}"
    for i, account in enumerate(service.billing_accounts.values()):
        if account.type == "CARD":
            account.token_id = planted[f"ba{i}.tokenId"] = f"CANARYTOKEN{i:04d}"
            account.vault_token = planted[f"ba{i}.vaultToken"] = f"CANARYVAULT{i:04d}"
        else:
            account.account_no = planted[f"ba{i}.accountNo"] = f"7319{i:06d}5517"
            account.routing_no = planted[f"ba{i}.routingNo"] = f"93{i:04d}571"
    return planted


def _needles(planted: dict[str, str]) -> dict[str, bytes]:
    needles = {name: value.encode() for name, value in planted.items()}
    needles["password"] = PASSWORD.encode()
    needles["username"] = USERNAME.encode()
    needles["base64(user:password)"] = base64.b64encode(f"{USERNAME}:{PASSWORD}".encode())
    needles["base64(password)"] = base64.b64encode(PASSWORD.encode()).rstrip(b"=")
    needles["urlencoded(password)"] = quote(PASSWORD, safe="").encode()
    needles["urlencoded+(password)"] = quote(PASSWORD, safe="").replace("%20", "+").encode()
    return needles


def _texts_of(path: Path) -> list[bytes]:
    """What a file says: raw bytes, plus decoded cells for Parquet and DuckDB (compressed on disk)."""
    out = [path.read_bytes()]
    if path.suffix == ".parquet":
        out.append(json.dumps(pq.read_table(path).to_pylist(), default=str).encode())
    elif path.name.endswith(".duckdb"):
        with contextlib.closing(duckdb.connect(str(path), read_only=True)) as con:
            tables = con.execute(
                "SELECT table_catalog, table_schema, table_name FROM information_schema.tables"
            ).fetchall()
            for catalog, schema, name in tables:
                rows = con.execute(f'SELECT * FROM "{catalog}"."{schema}"."{name}"').fetchall()
                out.append(repr(rows).encode())
    elif path.suffix == ".db":
        import sqlite3

        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as con:
            out.append("\n".join(con.iterdump()).encode())
    return out


@pytest.mark.slow
def test_secrets_never_written_anywhere(sandboxes: Callable[..., RunningSandbox], tmp_root: Path) -> None:
    sandbox = sandboxes(clients=60, seed=11, fault_rate=0.05, username=USERNAME, password=PASSWORD)
    planted = sandbox.call(_plant_canaries)
    assert len(planted) > 20
    ws = Workspace(tmp_root, sandbox.url, ANCHOR, username=USERNAME, password=PASSWORD)
    debug_log = tmp_root / "out" / "debug.log"
    assert_ok(ws.sync(log_file=debug_log))
    assert debug_log.stat().st_size > 10_000, "DEBUG logging did not reach the log file"
    prefect_env = ws.env(
        MEMBERSYNC_PREFECT="on",
        PREFECT_LOGGING_LEVEL="DEBUG",
        PREFECT_LOGGING_ROOT_LEVEL="DEBUG",
        PREFECT_LOGGING_EXTRA_LOGGERS="membersync,httpx,httpcore,aiohttp",
    )
    with_prefect = ws.sync(how="exec", env=prefect_env, timeout=600)
    assert_ok(with_prefect)
    truth.assert_night_exact(sandbox, ws.data_dir, ANCHOR)
    needles = _needles(planted)
    hits, scanned = [], 0
    for path in sorted(p for p in tmp_root.rglob("*") if p.is_file()):
        scanned += 1
        for text in _texts_of(path):
            hits += [f"{path.relative_to(tmp_root)}: {name}" for name, n in needles.items() if n in text]
    assert sandbox.stats.faults_injected > 0
    assert list(ws.prefect_home.rglob("*.db")), "Prefect's database was not where expected"
    assert sorted(set(hits)) == [], sorted(set(hits))[:20]
    record(
        "11 secrets",
        f"{len(needles)} canaries (every secret field, password plain / base64(user:password) / "
        f"URL-encoded), DEBUG logs, {sandbox.stats.faults_injected} faults, with and without Prefect: "
        f"0 hits in {scanned} files (Parquet and DuckDB decoded, CSVs, logs, PREFECT_HOME)",
    )


# --- 1-3 again, the way production runs: Prefect on -----------------------------------------------------


@pytest.mark.slow
def test_with_prefect_on_a_fault_storm_a_sigkill_and_a_crash_point_recover_exact(
    sandboxes: Callable[..., RunningSandbox], tmp_root: Path
) -> None:
    """The default path (Prefect's flow and tasks on its ephemeral server), once per scenario:
    a fault storm night; a SIGKILL of the whole process group at a seeded random moment, then
    the rerun; a crash at a named point (before the commit), then the rerun. Exact each time."""
    sandbox = sandboxes(clients=60, seed=11, fault_rate=0.05, rate=150.0, burst=20.0)
    ws = Workspace(tmp_root, sandbox.url, ANCHOR, batch_size=15, extra_env={"MEMBERSYNC_PREFECT": "on"})
    first = ANCHOR - dt.timedelta(days=2)
    storm = ws.sync(ws.argv(first), how="exec")
    assert_ok(storm)
    truth.assert_night_exact(sandbox, ws.data_dir, first)
    faults = sum(sandbox.stats.faults[k] for k in ("error_500", "unavailable_503", "html_502", "dropped"))
    assert faults > 0

    first_truth = truth.truth_of(sandbox, first)  # before the service changes again
    second = ANCHOR - dt.timedelta(days=1)
    touch_sandbox(sandbox, 5, salt=21)
    moment = random.Random(20261123).uniform(0.3, 0.9) * storm.seconds
    running = ws.start(ws.argv(second), how="exec")
    time.sleep(moment)
    running.kill_group()
    running.wait(60)
    health = inspect(ws.data_dir)
    assert health.unreadable == [] and health.missing == [] and health.duplicate_keys == 0, health
    # readers still see the last whole night, as it was
    assert truth.report_differences(truth.warehouse_reports(ws.data_dir, first), first_truth) == []
    assert_ok(ws.sync(ws.argv(second), how="exec"))
    truth.assert_night_exact(sandbox, ws.data_dir, second)

    touch_sandbox(sandbox, 5, salt=22)
    crashing = ws.start(ws.argv(ANCHOR), how="exec", env=ws.env(MEMBERSYNC_CRASH_AT="before_commit"))
    crashed = crashing.wait(600)
    crashing.kill_group()  # the crash point kills the sync alone: any child of it would be left over
    assert crashed.status == -9, f"the crash point was not reached (exit {crashed.status})"
    assert_ok(ws.sync(ws.argv(ANCHOR), how="exec"))
    truth.assert_night_exact(sandbox, ws.data_dir, ANCHOR)
    assert_clean(ws)
    record(
        "1-3 with Prefect on",
        f"fault storm ({faults} faults) exact; SIGKILL at {moment:.1f} s then rerun exact; "
        "crash before_commit then rerun exact; readers saw the last whole night after the kill",
        seconds=round(storm.seconds, 1),
    )
