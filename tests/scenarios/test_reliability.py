"""Issue 5: every promise of membersync as a test with a measured result.

Real parts only: the sandbox over loopback (its fault rate, rate limit and latency knobs), real
``membersync sync`` processes (forked from a pre-imported parent, or exec'd where start-up is
part of the promise) killed with SIGKILL as whole process groups, real Parquet and DuckDB files.
Ground truth is the sandbox's own state (:mod:`truth`), never our own SQL.

Each scenario calls :func:`reliability.record` with its measured figures; with
``MEMBERSYNC_RELIABILITY_RESULTS=<file>`` they are collected for the README's "Reliability" table
(``python tests/support/reliability_table.py <file>``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import truth
from membersync.extract.sandbox.running import RunningSandbox, start_in_thread
from membersync.extract.sandbox.server import SandboxConfig
from reliability import (
    ANCHOR,
    Outcome,
    Workspace,
    assert_clean,
    assert_ok,
    inspect,
    manifest_stats,
    one_line_error,
    published_digest,
    record,
    reports_digest,
    state_problems,
    touch_sandbox,
)

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
    from membersync.flows.night.nightly import run_night
    from membersync.flows.night.options import SyncOptions

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
