"""A word when a night fails or goes stale (issue 14), and ``membersync freshness`` (issue 10).

Real parts: ``membersync`` runs in a subprocess against a real sandbox on loopback, and the
notifications go through Apprise (``json://127.0.0.1:PORT/...``) to a real HTTP receiver that
this test starts on 127.0.0.1 and that records every request it gets. The service credentials
are canaries: no byte of any message (nor of the logs) holds them in any rendering.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import pytest
from membersync.extract.settings import Settings, SettingsError
from membersync.flows.benchmarks.synthetic import write_night
from membersync.flows.night.notify import Notifier, night_failed_message, split_urls, tenant_name
from membersync.warehouse.landing import freshness
from membersync.warehouse.landing.manifest import Manifest, manifest_path, read_manifest
from membersync.warehouse.landing.paths import DataDir
from receiver import HOOK_TOKEN, PASSWORD, USERNAME, Received, Receiver, base_env, membersync
from repo_root import MEMBERSYNC, REPO
from serving import running_serve

TENANT = "Riverside Spa & Gym"
TODAY = dt.date.today()


def night_env(sandbox: Any, receiver: Receiver, data_dir: Path, **extra: str) -> dict[str, str]:
    """A night against ``sandbox`` of the tenant TENANT, its messages sent to ``receiver``."""
    return base_env(
        data_dir,
        MEMBERSYNC_BASE_URL=sandbox.url,
        MEMBERSYNC_TENANT=TENANT,
        MEMBERSYNC_NOTIFY=receiver.url(),
        **extra,
    )


def prefect_home(tmp_path: Path) -> dict[str, str]:
    """Prefect's home (its database) for a test's own ``sync`` or ``serve`` with Prefect on."""
    return {"PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


def sync_args(night: dt.date = TODAY) -> list[str]:
    return ["sync", "--date", night.isoformat(), "--no-progress"]


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


# --- no secret anywhere ------------------------------------------------------------------------------


def secret_renderings() -> list[str]:
    pair = f"{USERNAME}:{PASSWORD}"
    return [
        USERNAME,
        PASSWORD,
        quote(PASSWORD, safe=""),
        quote_plus(PASSWORD),
        pair,
        base64.b64encode(pair.encode()).decode(),
    ]


def assert_no_secret(messages: list[Received]) -> None:
    for message in messages:
        texts = [message.raw.decode("utf-8", "replace"), json.dumps(message.json, ensure_ascii=False)]
        texts += [f"{k}: {v}" for k, v in message.headers.items()]
        for text in texts:
            for secret in secret_renderings():
                assert secret not in text, f"a credential reached a notification: {text[:300]!r}"


def assert_logs_clean(data_dir: Path) -> None:
    for path in (data_dir / "logs").rglob("*"):
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            for secret in (*secret_renderings(), HOOK_TOKEN):
                assert secret not in text, f"{path} holds a secret"


def assert_failed_night_message(message: Received, night: dt.date, error_part: str) -> dict[str, str]:
    body = message.json
    fields = message.fields()
    assert body["title"] == f"membersync {TENANT}: night {night} failed", body
    assert body["type"] == "failure", body
    assert fields["tenant"] == TENANT
    assert fields["night"] == night.isoformat()
    assert error_part in fields["error"], fields
    assert "\n" not in fields["error"]
    assert fields["resume"] == f"membersync sync --date {night.isoformat()}"
    assert message.path == f"/hook/{HOOK_TOKEN}"
    return fields


# --- a failed night ------------------------------------------------------------------------------------


def test_wrong_credentials_deliver_one_message_without_the_credentials(
    fresh_sandbox: Callable[..., Any], receiver: Receiver, tmp_path: Path
) -> None:
    sandbox = fresh_sandbox(clients=5, seed=14, password="the-right-one-9")
    env = night_env(sandbox, receiver, tmp_path / "data")
    done = membersync(*sync_args(), env=env)
    assert done.returncode == 1, done.stderr
    lines = error_lines(done.stderr)
    assert len(lines) == 1 and "wrong credentials" in lines[0], done.stderr
    assert len(receiver.got) == 1, receiver.got
    fields = assert_failed_night_message(receiver.got[0], TODAY, "wrong credentials")
    assert "HTTP 401" in fields["error"]
    assert_no_secret(receiver.got)
    assert_logs_clean(tmp_path / "data")


def test_a_night_that_fails_midway_delivers_one_message(
    fresh_sandbox: Callable[..., Any], receiver: Receiver, tmp_path: Path
) -> None:
    """The service answers, then the landing cannot write (a 2 KB file-size limit): a mid-way failure."""
    import resource

    sandbox = fresh_sandbox(clients=20, seed=15, username=USERNAME, password=PASSWORD)
    env = night_env(sandbox, receiver, tmp_path / "data")

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    done = membersync(*sync_args(), env=env, preexec_fn=limit_file_size)
    assert done.returncode == 1, done.stderr
    assert sandbox.stats.requests > 1  # past the probe: the night itself failed
    assert len(receiver.got) == 1, receiver.got
    fields = assert_failed_night_message(receiver.got[0], TODAY, f"night {TODAY} failed: cannot write batch")
    assert f"night {TODAY} failed" in done.stderr
    assert fields["error"] in " ".join(line.strip() for line in done.stderr.splitlines())
    assert_no_secret(receiver.got)
    assert_logs_clean(tmp_path / "data")


def test_an_interrupted_night_delivers_one_message(
    fresh_sandbox: Callable[..., Any], receiver: Receiver, tmp_path: Path
) -> None:
    sandbox = fresh_sandbox(clients=80, seed=16, username=USERNAME, password=PASSWORD, latency_ms=15.0)
    data_dir = tmp_path / "data"
    env = night_env(
        sandbox,
        receiver,
        data_dir,
        MEMBERSYNC_BATCH_SIZE="5",
    )
    cmd = [*MEMBERSYNC, *sync_args()]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    batches = DataDir(data_dir).staging / TODAY.isoformat() / "batches"
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline and not list(batches.glob("0*.done")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr[-2000:]
    assert len(receiver.got) == 1, receiver.got
    body, fields = receiver.got[0].json, receiver.got[0].fields()
    assert body["title"] == f"membersync {TENANT}: night {TODAY} was interrupted", body
    assert fields["night"] == TODAY.isoformat() and fields["tenant"] == TENANT
    assert fields["error"].startswith("interrupted (SIGTERM)"), fields
    assert fields["resume"] == f"membersync sync --date {TODAY.isoformat()}"
    assert_no_secret(receiver.got)


def change_password_after_requests(sandbox: Any, requests: int, password: str) -> threading.Thread:
    """Rotate the sandbox's password once it has answered ``requests`` requests (from a thread)."""

    def watch() -> None:
        deadline = time.monotonic() + 240
        while sandbox.stats.requests < requests and time.monotonic() < deadline:
            time.sleep(0.01)
        sandbox.call(lambda _: sandbox.server.change_password(password))

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.prefect
@pytest.mark.timeout(240)
def test_with_prefect_on_a_password_changed_midway_delivers_one_message(
    fresh_sandbox: Callable[..., Any], receiver: Receiver, tmp_path: Path
) -> None:
    """Case: the default path (Prefect on, the flow run is ``sync``'s own, not a deployment's):
    the probe passes, the password is rotated at the vendor before the night's first request,
    the night fails with a 401. ``sync`` sends the message; the flow does not send a second."""
    sandbox = fresh_sandbox(clients=10, seed=18, username=USERNAME, password=PASSWORD)
    env = night_env(
        sandbox,
        receiver,
        tmp_path / "data",
        MEMBERSYNC_PREFECT="on",
        **prefect_home(tmp_path),
    )
    rotation = change_password_after_requests(sandbox, 1, "rotated-by-the-admin-3")  # after the probe
    done = membersync(*sync_args(), env=env)
    rotation.join(5)
    assert done.returncode == 1, done.stderr
    assert sandbox.stats.by_status[401] >= 1, sandbox.stats.by_status  # the night itself was refused
    assert len(receiver.got) == 1, receiver.got
    fields = assert_failed_night_message(receiver.got[0], TODAY, f"night {TODAY} failed")
    assert "HTTP 401" in fields["error"], fields
    assert_no_secret(receiver.got)
    assert_logs_clean(tmp_path / "data")


@pytest.mark.prefect
@pytest.mark.timeout(300)
def test_serve_sends_a_message_for_a_scheduled_night_that_fails_and_none_for_one_committed(
    fresh_sandbox: Callable[..., Any], receiver: Receiver, tmp_path: Path
) -> None:
    """Case: ``membersync serve`` (it launches a real Prefect server; its runner runs nights every
    5 s): the first scheduled night lands all 10 clients and sends nothing; the password is
    rotated at the vendor, the next scheduled night fails with a 401 and sends one message,
    resume command included. (Also the test that ``serve`` runs scheduled nights at all.)"""
    sandbox = fresh_sandbox(clients=10, seed=19, username=USERNAME, password=PASSWORD)
    data_dir = tmp_path / "data"
    env = night_env(
        sandbox,
        receiver,
        data_dir,
        **prefect_home(tmp_path),
    )
    manifests = DataDir(data_dir).manifests
    deadline = time.monotonic() + 200
    with running_serve(env, interval=5) as (proc, out):
        while time.monotonic() < deadline and proc.poll() is None and not any(manifests.glob("*.json")):
            time.sleep(0.2)
        assert any(manifests.glob("*.json")), f"no scheduled night was committed:\n{out.text()[-2000:]}"
        sandbox.call(lambda _: sandbox.server.change_password("rotated-by-the-admin-4"))
        while time.monotonic() < deadline and proc.poll() is None and not receiver.got:
            time.sleep(0.2)
    stderr = out.text()
    assert "starting a Prefect server" in stderr  # no PREFECT_API_URL: serve launched its own
    committed = read_manifest(DataDir(data_dir).manifests, TODAY)
    assert committed is not None and committed.tables["clients"].rows == 10  # the scheduled night landed
    assert receiver.got, f"no message for the failed scheduled night:\n{stderr[-2000:]}"
    # Every message is a failed night's: a false alarm for the committed night would name no 401.
    for message in receiver.got:
        fields = assert_failed_night_message(message, TODAY, f"night {TODAY} failed")
        assert "HTTP 401" in fields["error"], fields
    assert_no_secret(receiver.got)
    assert_logs_clean(data_dir)


def test_a_receiver_that_is_down_or_refuses_never_changes_the_exit_code(
    fresh_sandbox: Callable[..., Any], receiver: Receiver, tmp_path: Path
) -> None:
    sandbox = fresh_sandbox(clients=5, seed=17, password="the-right-one-9")
    receiver.status = 500
    closed_port = _closed_port()
    env = base_env(
        tmp_path / "data",
        MEMBERSYNC_BASE_URL=sandbox.url,
        MEMBERSYNC_NOTIFY=f"{receiver.url()}, json://127.0.0.1:{closed_port}/down",
    )
    done = membersync(*sync_args(), env=env)
    assert done.returncode == 1, done.stderr
    assert len(error_lines(done.stderr)) == 1, done.stderr  # the warning goes to the log, not the terminal
    assert len(receiver.got) == 1
    # no MEMBERSYNC_TENANT: the service's host names the tenant
    assert receiver.got[0].fields()["tenant"] == "127.0.0.1"
    log_text = "".join(p.read_text() for p in (tmp_path / "data" / "logs").rglob("*.log"))
    assert "notification not delivered" in log_text


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- a stale warehouse ----------------------------------------------------------------------------------


def commit_night(data_dir: Path, night: dt.date, committed_at: dt.datetime | None = None) -> None:
    """A committed night (the real landing code); ``committed_at`` moved back when given."""
    dd = DataDir(data_dir)
    dd.ensure()
    write_night(dd, night, {"stores": [{"storecode": "DOWNTOWN  ", "name": "Downtown"}]})
    if committed_at is not None:
        path = manifest_path(dd.manifests, night)
        manifest = Manifest.from_json(path.read_text(encoding="utf-8"))
        moved = dataclasses.replace(manifest, committed_at=f"{committed_at:%Y-%m-%dT%H:%M:%SZ}")
        path.write_text(moved.to_json(), encoding="utf-8")


def test_a_stale_warehouse_delivers_one_message_and_exits_1(receiver: Receiver, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    old = dt.date(2026, 1, 10)
    commit_night(data_dir, old - dt.timedelta(days=1))
    commit_night(data_dir, old, committed_at=dt.datetime.now(dt.UTC) - dt.timedelta(hours=72))
    env = base_env(data_dir, MEMBERSYNC_TENANT=TENANT, MEMBERSYNC_NOTIFY=receiver.url())
    done = membersync("freshness", "--notify", env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"newest committed night {old}" in done.stdout and "stale" in done.stdout, done.stdout
    assert len(receiver.got) == 1, receiver.got
    body, fields = receiver.got[0].json, receiver.got[0].fields()
    assert body["title"].startswith(f"membersync {TENANT}: warehouse stale, newest night {old} is 72."), body
    assert body["type"] == "warning"
    assert fields["tenant"] == TENANT and fields["newest night"] == old.isoformat()
    assert fields["age"].startswith("72.") and fields["threshold"] == "36.0 h", fields
    assert_no_secret(receiver.got)


def test_no_night_committed_is_stale(receiver: Receiver, tmp_path: Path) -> None:
    env = base_env(tmp_path / "data", MEMBERSYNC_NOTIFY=receiver.url())
    done = membersync("freshness", "--notify", env=env)
    assert done.returncode == 1
    assert "no night committed yet" in done.stdout
    assert len(receiver.got) == 1
    assert receiver.got[0].fields()["newest night"] == "none"


def test_a_fresh_warehouse_sends_nothing_and_exits_0(receiver: Receiver, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    commit_night(
        data_dir, dt.date(2026, 1, 10), committed_at=dt.datetime.now(dt.UTC) - dt.timedelta(hours=30)
    )
    env = base_env(data_dir, MEMBERSYNC_NOTIFY=receiver.url())
    done = membersync("freshness", "--notify", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fresh" in done.stdout and "30." in done.stdout
    # the threshold from the option, then from the environment
    assert membersync("freshness", "--max-age-hours", "24", env=env).returncode == 1
    assert membersync("freshness", env={**env, "MEMBERSYNC_STALE_AFTER_HOURS": "12.5"}).returncode == 1
    assert receiver.got == []


# --- bad input: one line, exit 2 -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [f"json://127.0.0.1:9/{HOOK_TOKEN}, foo://{HOOK_TOKEN}", "not-a-url", f"slack://{HOOK_TOKEN}"],
)
def test_a_malformed_notify_setting_is_one_line_exit_2(value: str, tmp_path: Path) -> None:
    env = base_env(tmp_path / "data", MEMBERSYNC_BASE_URL="http://127.0.0.1:9", MEMBERSYNC_NOTIFY=value)
    for args in (sync_args(), ["freshness", "--notify"], ["serve"]):  # serve: before its server starts
        done = membersync(*args, env=env)
        lines = error_lines(done.stderr)
        assert done.returncode == 2, done.stderr
        assert len(lines) == 1 and "MEMBERSYNC_NOTIFY" in lines[0], done.stderr
        assert HOOK_TOKEN not in done.stderr + done.stdout  # the URL's text is never shown
    assert not (tmp_path / "data").exists()  # nothing was written


@pytest.mark.parametrize(
    ("args", "extra", "named"),
    [
        (["--max-age-hours", "abc"], {}, "--max-age-hours"),
        (["--max-age-hours", "0"], {}, "--max-age-hours"),
        (["--max-age-hours", "nan"], {}, "--max-age-hours"),
        ([], {"MEMBERSYNC_STALE_AFTER_HOURS": "-3"}, "MEMBERSYNC_STALE_AFTER_HOURS"),
        (["--notify"], {}, "MEMBERSYNC_NOTIFY"),  # --notify without anywhere to send
    ],
)
def test_a_bad_threshold_is_one_line_exit_2(
    args: list[str], extra: dict[str, str], named: str, tmp_path: Path
) -> None:
    done = membersync("freshness", *args, env=base_env(tmp_path / "data", **extra))
    lines = error_lines(done.stderr)
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and named in lines[0], done.stderr


# --- the plain functions -------------------------------------------------------------------------------


def test_freshness_reads_only_the_newest_manifest_and_ignores_temporary_files(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    committed = dt.datetime(2026, 1, 12, 2, 14, 3, tzinfo=dt.UTC)
    commit_night(data_dir, dt.date(2026, 1, 11))
    commit_night(data_dir, dt.date(2026, 1, 12), committed_at=committed)
    manifests = DataDir(data_dir).manifests
    (manifests / "2026-01-13.json.tmp").write_text("{half a manifest", encoding="utf-8")
    answer = freshness.check(manifests, 36, now=committed + dt.timedelta(hours=40))
    assert answer.newest == freshness.NewestNight(dt.date(2026, 1, 12), committed)
    assert answer.stale and answer.age == dt.timedelta(hours=40)
    assert freshness.describe(answer) == (
        "newest committed night 2026-01-12, committed 2026-01-12T02:14:03Z, 40.0 h ago: "
        "stale (threshold 36.0 h)"
    )
    # a clock set back after the commit reads as "just now", not a negative age
    earlier = freshness.check(manifests, 36, now=committed - dt.timedelta(hours=1))
    assert earlier.age == dt.timedelta(0) and not earlier.stale
    assert read_manifest(manifests, dt.date(2026, 1, 12)) is not None


def test_thresholds_urls_and_tenant() -> None:
    assert Settings.load({}).stale_after_hours == 36.0
    assert Settings.load({"MEMBERSYNC_STALE_AFTER_HOURS": " 6 "}).stale_after_hours == 6.0
    for bad in ("0", "-1", "inf", "six"):
        with pytest.raises(SettingsError, match="MEMBERSYNC_STALE_AFTER_HOURS"):
            Settings.load({"MEMBERSYNC_STALE_AFTER_HOURS": bad})
    assert split_urls(" json://a:1/x,  jsons://b/y\tmailtos://u:p@c ") == [
        "json://a:1/x",
        "jsons://b/y",
        "mailtos://u:p@c",
    ]
    acme = Settings.load({"MEMBERSYNC_BASE_URL": "https://acme.example.com/"})
    assert tenant_name(acme) == "acme.example.com"
    tenant = Settings.load({"MEMBERSYNC_TENANT": " Acme ", "MEMBERSYNC_BASE_URL": "https://x"})
    assert tenant_name(tenant) == "Acme"
    assert tenant_name(Settings.load({})) == "membersync"
    assert not Notifier.from_settings(Settings.load({})).enabled


def test_a_message_is_scrubbed_even_when_the_error_line_holds_a_credential() -> None:
    notifier = Notifier.from_settings(
        Settings.load({"MEMBERSYNC_USERNAME": USERNAME, "MEMBERSYNC_PASSWORD": PASSWORD})
    )
    line = f"wrong credentials (user {USERNAME!r}) password={PASSWORD} Authorization: Basic Zm9vOmJhcg=="
    message = night_failed_message("t", TODAY, line, "membersync sync --date x")
    clean = notifier.clean(message.body)
    assert all(secret not in clean for secret in secret_renderings()), clean
    assert "Zm9vOmJhcg" not in clean
