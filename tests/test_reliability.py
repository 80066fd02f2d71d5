"""Issue 5: every promise of membersync as a test with a measured result.

Real parts only: the sandbox over loopback (its fault rate, rate limit and latency knobs), real
``membersync sync`` processes (forked from a pre-imported parent, or exec'd where start-up is
part of the promise) killed with SIGKILL as whole process groups, real Parquet and DuckDB files.
Ground truth is the sandbox's own state (:mod:`truth`), never our own SQL.

Each scenario calls :func:`reliability.record` with its measured figures; with
``MEMBERSYNC_RELIABILITY_RESULTS=<file>`` they are collected for the README's "Reliability" table
(``python tests/reliability_table.py <file>``).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import os
import random
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import duckdb
import pyarrow.parquet as pq
import pytest
import truth
from membersync.extract.sandbox.server import RunningSandbox, SandboxConfig, start_in_thread
from membersync.warehouse.crashpoints import POINTS
from reliability import (
    Outcome,
    Workspace,
    inspect,
    manifest_stats,
    published_digest,
    record,
    reports_digest,
    state_problems,
)

ANCHOR = dt.datetime.now(dt.UTC).date()
KILLS = int(os.environ.get("MEMBERSYNC_RELIABILITY_KILLS", "8"))
# Kills run the CLI without Prefect by default (landing, commit and build are the same code; Prefect
# only wraps the steps in task runs and costs ~10-40 s of start-up per run). "on": exec'd CLI on
# Prefect's ephemeral server, whose process is in the killed group too.
KILL_WITH_PREFECT = os.environ.get("MEMBERSYNC_RELIABILITY_PREFECT", "off") == "on"


@pytest.fixture
def tmp_root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="reliability-") as tmp:
        yield Path(tmp)


@pytest.fixture
def sandboxes(fresh_sandbox: Callable[..., RunningSandbox]) -> Callable[..., RunningSandbox]:
    """``fresh_sandbox`` with the scenarios' fixed anchor date (stable, comparable nights)."""

    def make(**kw: Any) -> RunningSandbox:
        kw.setdefault("anchor_date", ANCHOR)
        return fresh_sandbox(**kw)

    return make


def assert_ok(outcome: Outcome) -> None:
    assert outcome.ok, outcome.describe()


def assert_clean(ws: Workspace) -> None:
    problems = inspect(ws.data_dir).problems()
    assert problems == [], problems


def one_line_error(outcome: Outcome) -> str:
    lines = [line for line in outcome.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr:\n{outcome.describe()}"
    return lines[0]


def touch_sandbox(sandbox: RunningSandbox, n: int, salt: int) -> None:
    """A few changes straight on the service (points and a ledger payment), so a night has work."""

    def change(service: Any) -> None:
        clients = list(service.iter_clients())
        rng = random.Random(salt)
        for client in rng.sample(clients, n):
            store = client.home_store
            service.insert_points(
                {"clientNumber": client.client_number, "storecode": store, "points": 5, "reason": "touch"}
            )
            if client.ledger.get(store, 0) > 1:
                service.post_account_ledger_payment(
                    {
                        "clientNumber": client.client_number,
                        "storecode": store,
                        "amount": "0.99",
                        "paymentType": service.store_payment_types[store][0].code,
                    }
                )

    sandbox.call(change)


# --- 1. fault storm ------------------------------------------------------------------------------------


def test_fault_storm_night_is_exact_and_retries_bounded(
    sandboxes: Callable[..., RunningSandbox], tmp_root: Path
) -> None:
    sandbox = sandboxes(clients=100, seed=1, fault_rate=0.05, rate=150.0, burst=20.0)
    ws = Workspace(tmp_root, sandbox.url, ANCHOR)
    outcome = ws.sync()
    assert_ok(outcome)
    truth.assert_night_exact(sandbox, ws.data_dir, ANCHOR)
    assert_clean(ws)
    stats = manifest_stats(ws.data_dir, ANCHOR)
    faults = sandbox.stats.faults
    injected = sum(faults[k] for k in ("error_500", "unavailable_503", "html_502", "dropped", "truncated"))
    limited = sandbox.stats.rate_limited
    attempts, retries = int(stats["requests"]), int(stats["retries"])
    logical = attempts - retries
    # Sends the night's client did not count: the CLI's probe before the night (one storelist
    # GET on its own client, retried like any request), and the re-sends aiohttp makes by itself
    # when the server dropped a reused keep-alive connection.
    extra = sandbox.stats.requests - attempts
    resent = extra - 1  # at most: the probe's own retries are among these
    assert injected > 0 and limited > 0, (dict(faults), limited)
    assert resent >= 0, (extra, dict(faults))
    # Every failed send was a fault or a 429 and was sent again (by a client's retry, or once by
    # aiohttp for a dropped connection); a request retried more than max_retries fails the night.
    assert retries + resent == injected + limited, (retries, resent, injected, limited)
    assert retries <= 5 * logical
    record(
        "1 fault storm",
        f"exact; {injected} faults ({', '.join(f'{k} {v}' for k, v in sorted(faults.items()))}) and "
        f"{limited} 429s over {logical} requests: {retries} client retries + {resent} silent aiohttp "
        f"re-sends of dropped connections = every failed send; none over the bound of 5 retries",
        seconds=round(outcome.seconds, 1),
    )


# --- 2. SIGKILL at random moments -----------------------------------------------------------------------


@pytest.mark.slow
def test_sigkill_at_random_moments_then_rerun(
    sandboxes: Callable[..., RunningSandbox], tmp_root: Path
) -> None:
    sandbox = sandboxes(clients=50, seed=2)
    how = "exec" if KILL_WITH_PREFECT else "fork"
    extra = {"MEMBERSYNC_PREFECT": "on"} if KILL_WITH_PREFECT else {}
    kept = Workspace(tmp_root / "kept", sandbox.url, ANCHOR, batch_size=10, extra_env=extra)
    reference = kept.sync(how=how)
    assert_ok(reference)
    truth.assert_night_exact(sandbox, kept.data_dir, ANCHOR)
    digest = reports_digest(kept.data_dir, ANCHOR)
    full_time = reference.seconds
    rng = random.Random(20261121)
    tally = {"exact": 0, "duplicates": 0, "unreadable": 0, "temp_left": 0, "exact_after_kill": 0}
    hit = {"before commit": 0, "after commit": 0}
    started = time.monotonic()
    for i in range(KILLS):
        # Even cycles: a rerun of a committed night is killed (readers must still see that night);
        # odd cycles: the very first night of a fresh data dir is killed.
        ws = (
            kept
            if i % 2 == 0
            else Workspace(tmp_root / f"fresh{i}", sandbox.url, ANCHOR, batch_size=10, extra_env=extra)
        )
        before = ws.data_dir.manifests / f"{ANCHOR}.json"
        run_id = json.loads(before.read_text())["run_id"] if before.exists() else None
        moment = rng.uniform(0.05, 1.0) * full_time
        running = ws.start(how=how)
        time.sleep(moment)
        running.kill_group()
        killed = running.wait(60)
        after_kill = inspect(ws.data_dir)
        tally["unreadable"] += len(after_kill.unreadable)
        tally["duplicates"] += after_kill.duplicate_keys
        assert after_kill.missing == [] and after_kill.state_problems == [], after_kill.problems()
        now_id = json.loads(before.read_text())["run_id"] if before.exists() else None
        hit["after commit" if now_id not in (None, run_id) else "before commit"] += 1
        if ws is kept:  # readers still see a whole night: the old one or the new one
            truth.assert_night_exact(sandbox, ws.data_dir, ANCHOR)
            tally["exact_after_kill"] += 1
        rerun = ws.sync(how=how)
        assert_ok(rerun)
        truth.assert_night_exact(sandbox, ws.data_dir, ANCHOR)
        health = inspect(ws.data_dir)
        tally["duplicates"] += health.duplicate_keys
        tally["unreadable"] += len(health.unreadable)
        tally["temp_left"] += len(health.temp_files) + len(health.staging_files) + len(health.orphans)
        assert health.problems() == [], (i, moment, killed.status, health.problems())
        assert reports_digest(ws.data_dir, ANCHOR) == digest, "a rerun changed the CSV bytes"
        tally["exact"] += 1
    elapsed = time.monotonic() - started
    record(
        "2 SIGKILL anywhere",
        f"{KILLS} kills{' (Prefect on)' if KILL_WITH_PREFECT else ''} (seeded, "
        f"{hit['before commit']} before / {hit['after commit']} after the "
        f"killed run's commit): {tally['exact']}/{KILLS} reruns exact and byte-identical, "
        f"{tally['duplicates']} duplicate keys, {tally['unreadable']} unreadable files, "
        f"{tally['temp_left']} temporary files left; readers saw a whole night after "
        f"{tally['exact_after_kill']}/{(KILLS + 1) // 2} kills of a rerun",
        seconds=round(elapsed, 1),
        full_run_s=round(full_time, 1),
    )


# --- 3. crash at named points ------------------------------------------------------------------------


@pytest.mark.slow
def test_crash_at_every_named_point_recovers(
    sandboxes: Callable[..., RunningSandbox], tmp_root: Path
) -> None:
    sandbox = sandboxes(clients=60, seed=3)
    ws = Workspace(tmp_root, sandbox.url, ANCHOR, batch_size=15)
    results: dict[str, str] = {}
    previous: dict[str, str] = {}
    last: tuple[dt.date, truth.Reports] | None = None
    for k, point in enumerate(POINTS):
        night = ANCHOR - dt.timedelta(days=len(POINTS) - 1 - k)  # one night per point, up to today
        if k:
            touch_sandbox(sandbox, 5, salt=k)
        try:
            results[point] = _crash_and_recover(sandbox, ws, point, night, previous, last)
            last = (night, truth.truth_of(sandbox, night))
        except AssertionError as exc:
            results[point] = "FAILED: " + str(exc).splitlines()[0][:200]
            assert_ok(ws.sync(ws.argv(night)))  # leave a committed night for the next point
            last = (night, truth.assert_night_exact(sandbox, ws.data_dir, night))
        previous = published_digest(ws.data_dir)
    ok = sum(not r.startswith("FAILED") for r in results.values())
    record(
        "3 crash at named points",
        f"{ok}/{len(POINTS)} recover exact, state never ahead of the manifests: "
        + "; ".join(f"{p}: {r}" for p, r in results.items()),
    )
    assert ok == len(POINTS), results


def _crash_and_recover(
    sandbox: RunningSandbox,
    ws: Workspace,
    point: str,
    night: dt.date,
    previous: dict[str, str],
    last: tuple[dt.date, truth.Reports] | None,
) -> str:
    # the 2nd batch of the first night (so the rerun resumes), the first time everywhere else
    where = f"{point}:2" if point == "after_batch_landed" else point
    crashed = ws.sync(ws.argv(night), env=ws.env(MEMBERSYNC_CRASH_AT=where))
    assert crashed.status == -9, f"crash point {point} was not reached (exit {crashed.status})"
    health = inspect(ws.data_dir)
    assert health.unreadable == [] and health.missing == [] and health.duplicate_keys == 0, health
    assert state_problems(ws.data_dir) == [], state_problems(ws.data_dir)
    # committed nights before this one are untouched, and readers still see the last whole night
    now = published_digest(ws.data_dir)
    changed = sorted(p for p in previous if previous[p] != now.get(p) and _night_of(p) != night)
    assert changed == [], f"a crash changed published files of earlier nights: {changed[:5]}"
    if last is not None:
        problems = truth.report_differences(truth.warehouse_reports(ws.data_dir, last[0]), last[1])
        problems += truth.csv_differences(ws.data_dir, last[0], last[1])
        assert problems == [], problems[:5]
    rerun = ws.sync(ws.argv(night))
    assert_ok(rerun)
    truth.assert_night_exact(sandbox, ws.data_dir, night)
    assert_clean(ws)
    reused = rerun.summary_value("batches") or ""
    return "exact" + (f" ({reused.split(' (')[-1].rstrip(')')})" if "reused" in reused else "")


def _night_of(relative: str) -> dt.date | None:
    for part in relative.replace(".json", "").split("/"):
        with contextlib.suppress(ValueError):
            return dt.date.fromisoformat(part.removeprefix("snapshot_date="))
    return None


# --- 4. reruns ----------------------------------------------------------------------------------------


def test_same_night_three_times_gives_byte_identical_reports(
    sandboxes: Callable[..., RunningSandbox], tmp_root: Path
) -> None:
    sandbox = sandboxes(clients=60, seed=4)
    ws = Workspace(tmp_root, sandbox.url, ANCHOR)
    digests = []
    for _ in range(3):
        assert_ok(ws.sync())
        digests.append(reports_digest(ws.data_dir, ANCHOR))
    truth.assert_night_exact(sandbox, ws.data_dir, ANCHOR)
    assert_clean(ws)
    assert len(set(digests)) == 1, digests
    record("4 reruns", f"3 runs of one night: 1 distinct CSV hash ({digests[0][:12]}), exact")


# --- 5. two runs at once ------------------------------------------------------------------------------


def test_second_run_exits_at_once_and_readers_see_whole_nights(
    sandboxes: Callable[..., RunningSandbox], tmp_root: Path
) -> None:
    sandbox = sandboxes(clients=60, seed=5, latency_ms=15.0)
    ws = Workspace(tmp_root, sandbox.url, ANCHOR)
    assert_ok(ws.sync())
    expected = truth.truth_of(sandbox, ANCHOR)
    reads, bad = 0, []
    stop = threading.Event()

    def reader() -> None:
        nonlocal reads
        while not stop.is_set():
            try:
                problems = truth.report_differences(truth.warehouse_reports(ws.data_dir, ANCHOR), expected)
                problems += truth.csv_differences(ws.data_dir, ANCHOR, expected)
            except Exception as exc:  # a reader must never fail to read
                problems = [f"{type(exc).__name__}: {exc}"]
            reads += 1
            bad.extend(problems[:3])

    first = ws.start()
    deadline = time.monotonic() + 60
    while not ws.data_dir.lock_file.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    second = ws.sync(how="exec", timeout=120)
    still_running = first.poll() is None
    done = first.wait(300)
    stop.set()
    thread.join(60)
    assert still_running, "the first run ended before the second was tried: make it slower"
    assert second.status == 1, second.describe()
    line = one_line_error(second)
    assert "already running" in line, line
    assert_ok(done)
    truth.assert_night_exact(sandbox, ws.data_dir, ANCHOR)
    assert bad == [], bad[:10]
    assert reads > 0
    record(
        "5 two runs at once",
        f"second run: exit 1 in {second.seconds:.1f} s (process start included) with "
        f"'{line.strip()[:80]}'; {reads} concurrent reads, 0 saw a half-written night",
    )


# --- 6 / 7 / 12 / 13: failures that must not touch the previous night ---------------------------------


@pytest.fixture(scope="module")
def committed() -> Iterator[tuple[RunningSandbox, Workspace]]:
    """A data dir holding one committed night (shared by the tests that must leave it untouched)."""
    sandbox = start_in_thread(SandboxConfig(clients=60, seed=6, anchor_date=ANCHOR))
    with tempfile.TemporaryDirectory(prefix="reliability-committed-") as tmp:
        ws = Workspace(Path(tmp), sandbox.url, ANCHOR)
        assert_ok(ws.sync())
        truth.assert_night_exact(sandbox, ws.data_dir, ANCHOR)
        try:
            yield sandbox, ws
        finally:
            sandbox.stop()


def _fails_fast_and_touches_nothing(
    sandbox: RunningSandbox, ws: Workspace, env: dict[str, str], night: dt.date
) -> tuple[Outcome, str, int]:
    before = published_digest(ws.data_dir)
    served = sandbox.stats.requests
    outcome = ws.sync(ws.argv(night), how="exec", env=env, timeout=180)
    assert outcome.status == 1, outcome.describe()
    line = one_line_error(outcome)
    assert published_digest(ws.data_dir) == before
    assert state_problems(ws.data_dir) == []
    truth.assert_night_exact(sandbox, ws.data_dir, ANCHOR)
    return outcome, line, sandbox.stats.requests - served


def test_wrong_credentials_fail_in_one_request(committed: tuple[RunningSandbox, Workspace]) -> None:
    sandbox, ws = committed
    night = ANCHOR + dt.timedelta(days=1)
    outcome, line, requests = _fails_fast_and_touches_nothing(
        sandbox, ws, ws.env(MEMBERSYNC_PASSWORD="not-the-password", MEMBERSYNC_PREFECT="on"), night
    )
    assert "wrong credentials (user 'sandbox')" in line and "401" in line, line
    assert requests == 1, f"{requests} requests reached the server after a 401"
    assert "not-the-password" not in outcome.stdout + outcome.stderr
    record(
        "6 wrong credentials (Prefect on)",
        f"exit 1 in {outcome.seconds:.1f} s after {requests} request: '{line[:100]}'",
    )


def test_wrong_base_url_fails_in_one_request(committed: tuple[RunningSandbox, Workspace]) -> None:
    sandbox, ws = committed
    night = ANCHOR + dt.timedelta(days=1)
    outcome, line, requests = _fails_fast_and_touches_nothing(
        sandbox, ws, ws.env(MEMBERSYNC_BASE_URL=sandbox.url + "/not-the-api", MEMBERSYNC_PREFECT="on"), night
    )
    assert requests == 1, f"{requests} requests reached the server after a 404"
    record(
        "6 wrong base URL (Prefect on)",
        f"exit 1 in {outcome.seconds:.1f} s after {requests} request: '{line[:100]}'",
    )


def test_server_down_fails_cleanly(committed: tuple[RunningSandbox, Workspace]) -> None:
    sandbox, ws = committed
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    outcome, line, _ = _fails_fast_and_touches_nothing(
        sandbox,
        ws,
        ws.env(MEMBERSYNC_BASE_URL=f"http://127.0.0.1:{port}", MEMBERSYNC_PREFECT="on"),
        ANCHOR + dt.timedelta(days=1),
    )
    assert outcome.seconds < 90, outcome.describe()
    record("7 server down, refused (Prefect on)", f"exit 1 in {outcome.seconds:.1f} s: '{line[:100]}'")


class BadServer:
    """A TCP server that accepts and then never answers (``stall``) or trickles a body (``trickle``)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            conn.settimeout(1)
            with contextlib.suppress(TimeoutError):
                conn.recv(65536)
            if self.mode == "trickle":
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
                )
                conn.sendall(b'{"stores": [')
                while not self.stop.is_set():
                    conn.sendall(b" ")
                    time.sleep(0.2)
            else:
                self.stop.wait()

    def close(self) -> None:
        self.stop.set()
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.close()
        self.sock.close()


@pytest.mark.parametrize("mode", ["stall", "trickle"])
def test_stalling_server_every_request_ends_within_its_timeout(
    committed: tuple[RunningSandbox, Workspace], mode: str
) -> None:
    """In process, with short timeouts (the CLI has no knob for them: 30 s read timeout x 6 attempts)."""
    from membersync.extract.client import ClientOptions
    from membersync.extract.errors import ServiceError
    from membersync.extract.settings import ServiceSettings, Settings
    from membersync.flows.nightly import SyncOptions, run_night

    sandbox, ws = committed
    server = BadServer(mode)
    before = published_digest(ws.data_dir)
    options = SyncOptions(
        client_options=ClientOptions(
            connect_timeout=1.0,
            read_timeout=1.0,
            write_timeout=1.0,
            pool_timeout=5.0,
            request_timeout=2.0,
            max_retries=1,
            backoff_base=0.05,
            backoff_max=0.1,
        )
    )
    settings = ServiceSettings.from_settings(Settings.load(ws.env(MEMBERSYNC_BASE_URL=server.url)))
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            run_night(settings, ws.data_dir, ANCHOR + dt.timedelta(days=1), options=options)
            box["result"] = "succeeded"
        except BaseException as exc:
            box["error"] = exc

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    elapsed = time.monotonic() - started
    hung = thread.is_alive()
    server.close()
    thread.join(30)
    if hung:
        record(
            f"7 server {mode}s",
            "FAILS: the night was still running after 30 s (read timeout 1 s, request deadline 2 s)",
        )
    assert not hung, f"{mode}: the night was still running after 30 s (no overall deadline per request)"
    error = box.get("error")
    assert isinstance(error, ServiceError), box
    text = str(error)
    assert "\n" not in text
    # 2 attempts x 1 s read timeout + backoff, for each request in flight at once: well under 15 s
    assert elapsed < 15, f"{mode}: failed only after {elapsed:.1f} s"
    assert published_digest(ws.data_dir) == before
    truth.assert_night_exact(sandbox, ws.data_dir, ANCHOR)
    record(
        f"7 server {mode}s",
        f"night failed in {elapsed:.1f} s (read timeout 1 s, request deadline 2 s, 1 retry): '{text[:90]}'",
    )


# --- 9. wire drift ------------------------------------------------------------------------------------


def test_wire_drift_reports_stay_exact(sandboxes: Callable[..., RunningSandbox], tmp_root: Path) -> None:
    sandbox = sandboxes(clients=80, seed=9, drift=True)
    ws = Workspace(tmp_root, sandbox.url, ANCHOR)
    outcome = ws.sync()
    assert_ok(outcome)
    truth.assert_night_exact(sandbox, ws.data_dir, ANCHOR)
    assert_clean(ws)
    quarantined = outcome.summary_value("rows: quarantined")
    assert quarantined == "0", outcome.stdout
    record(
        "9 wire drift",
        f"numbers as strings, re-cased statuses, unannounced fields: exact, {quarantined} quarantined",
    )


# --- 10. disk full ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("limit_kb", [2, 700])
def test_disk_full_fails_clearly_and_keeps_previous_night(
    sandboxes: Callable[..., RunningSandbox], tmp_root: Path, limit_kb: int
) -> None:
    """RLIMIT_FSIZE in the sync process: 2 KB breaks the landing, 700 KB the warehouse build."""
    sandbox = sandboxes(clients=60, seed=10)
    ws = Workspace(tmp_root, sandbox.url, ANCHOR)
    assert_ok(ws.sync())
    truth1 = truth.assert_night_exact(sandbox, ws.data_dir, ANCHOR)
    touch_sandbox(sandbox, 8, salt=10)
    night2 = ANCHOR + dt.timedelta(days=1)
    before = published_digest(ws.data_dir)
    full = ws.sync(ws.argv(night2), rlimit_fsize=limit_kb * 1024)
    assert full.status == 1, full.describe()
    line = one_line_error(full)
    assert any(w in line.lower() for w in ("too large", "no space", "disk", "efbig", "write")), line
    # the previous night stays published: the warehouse and CSVs readers use are untouched
    after = published_digest(ws.data_dir)
    kept = {p: h for p, h in before.items() if p.startswith(("warehouse.duckdb", "reports/"))}
    assert {p: after.get(p) for p in kept} == kept
    problems = truth.report_differences(truth.warehouse_reports(ws.data_dir, ANCHOR), truth1)
    problems += truth.csv_differences(ws.data_dir, ANCHOR, truth1)
    assert problems == [], problems
    health = inspect(ws.data_dir)
    assert health.unreadable == [] and health.missing == [] and health.state_problems == [], health
    committed = night2 in health.nights
    rerun = ws.sync(ws.argv(night2))
    assert_ok(rerun)
    truth.assert_night_exact(sandbox, ws.data_dir, night2)
    assert_clean(ws)
    record(
        f"10 disk full ({limit_kb} KB file limit)",
        f"exit 1 '{line[:160]}'; previous night still published and exact "
        f"(new night {'committed, build failed' if committed else 'not committed'}); "
        "rerun after lifting: exact",
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


# --- 12. file permissions ------------------------------------------------------------------------------


def test_everything_under_the_data_dir_is_owner_only(committed: tuple[RunningSandbox, Workspace]) -> None:
    _, ws = committed
    loose = []
    checked = 0
    for path in [ws.data_dir.root, *ws.data_dir.root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        checked += 1
        if mode & 0o077:
            loose.append(f"{oct(mode)} {path.relative_to(ws.data_dir.root)}")
    assert loose == [], loose
    record("12 file permissions", f"{checked} files and folders under the data dir: all owner-only (0 loose)")


# --- 13. bad configuration -----------------------------------------------------------------------------


def test_bad_configuration_one_line_exit_2_nothing_written(
    committed: tuple[RunningSandbox, Workspace], tmp_root: Path
) -> None:
    _, ws = committed
    bad_profile = tmp_root / "tenant.toml"
    bad_profile.write_text("[paging\npage = ")
    blocker = tmp_root / "a-file"
    blocker.write_text("not a folder")
    nowhere = str(tmp_root / "never-created")
    cases = {
        "malformed tenant profile": (
            ws.argv(),
            {"MEMBERSYNC_PROFILE": str(bad_profile), "MEMBERSYNC_DATA_DIR": nowhere},
        ),
        "bad date": (["sync", "--date", "2026-02-30", "--no-progress"], {"MEMBERSYNC_DATA_DIR": nowhere}),
        "data dir not writable": (ws.argv(), {"MEMBERSYNC_DATA_DIR": str(blocker / "data")}),
        "missing password": (ws.argv(), {"MEMBERSYNC_PASSWORD": "", "MEMBERSYNC_DATA_DIR": nowhere}),
        "unknown report name": (["reports", "--report", "no_such_report"], {}),
    }
    before = published_digest(ws.data_dir)
    lines = {}
    for label, (argv, overrides) in cases.items():
        outcome = ws.sync(argv, how="exec", env=ws.env(**overrides), timeout=120)
        assert outcome.status == 2, f"{label}: {outcome.describe()}"
        lines[label] = one_line_error(outcome)
        assert not Path(nowhere).exists(), f"{label}: wrote {nowhere}"
    assert "no_such_report" in lines["unknown report name"]
    assert "2026-02-30" in lines["bad date"]
    assert (
        "tenant.toml" in lines["malformed tenant profile"]
        or "profile" in lines["malformed tenant profile"].lower()
    )
    assert published_digest(ws.data_dir) == before
    record(
        "13 bad configuration",
        f"{len(cases)}/{len(cases)} cases exit 2 with one line, nothing written: "
        + "; ".join(f"{k}: '{v.removeprefix('error: ')[:70]}'" for k, v in lines.items()),
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
    crashing.kill_group()  # the crash point kills the sync alone: its Prefect server is left over
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
