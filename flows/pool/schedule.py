"""``membersync serve``: the nightly flow as a Prefect deployment on a schedule.

Prefect's ephemeral server (what ``membersync sync`` uses) cannot run schedules, so serving
needs a real Prefect server: the one ``PREFECT_API_URL`` names when it is set, otherwise a
``prefect server start`` this command starts on loopback (and says so; its log goes to
``DATA_DIR/logs/prefect-server.log``; it stops when ``serve`` stops).

Scheduled runs execute in a subprocess the Prefect runner starts, with this process's
environment, so settings and credentials reach them the same way as ``membersync sync``
(``MEMBERSYNC_*``), never as deployment parameters.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import httpx
from membersync.extract.settings import ServiceSettings, Settings, SettingsError
from membersync.flows.console import err
from membersync.flows.night.notify import Notifier
from membersync.warehouse.landing.paths import DataDir

log = logging.getLogger(__name__)

DEPLOYMENT_NAME = "nightly"
SERVER_START_TIMEOUT = 180.0  # seconds; a cold `prefect server start` migrates its database first


def check_schedule(cron: str, timezone: str, interval: int | None) -> None:
    """Reject a bad timezone, cron string or interval with a one-line SettingsError."""
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise SettingsError(
            f"unknown timezone {timezone!r} (expected an IANA name such as Europe/Paris)"
        ) from None
    if interval is not None:
        if interval < 1:
            raise SettingsError(f"--interval must be at least 1 second, got {interval}")
        return
    from prefect.schedules import Cron

    try:
        Cron(cron, timezone=timezone)
    except ValueError:
        raise SettingsError(
            f"invalid cron schedule {cron!r} (expected five fields, e.g. '0 2 * * *')"
        ) from None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(api_url: str, timeout: float, process: subprocess.Popen[bytes] | None = None) -> None:
    """Wait until the Prefect API answers its health check; RuntimeError on timeout or exit."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(
                f"the Prefect server exited with code {process.returncode} before it was ready"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{api_url}/health", timeout=2.0).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"the Prefect server at {api_url} did not become ready within {timeout:.0f} s")


def ui_url(api_url: str) -> str:
    """The UI's address on a Prefect server: its API URL without the trailing ``/api``."""
    return api_url.removesuffix("/").removesuffix("/api")


def server_env(port: int) -> dict[str, str]:
    """The environment of the ``prefect server start`` child listening on 127.0.0.1:``port``.

    The UI asks its server for the API address to call from the browser (``/ui-settings``); left
    alone that is Prefect's default ``127.0.0.1:4200/api`` (derived from the host/port settings,
    not from ``--port``), and the browser shows "Can't connect to Server API". So the server's
    own host, port and URLs are set, under every name Prefect 3 reads them from.
    """
    api_url = f"http://127.0.0.1:{port}/api"
    return {
        **os.environ,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_API_HOST": "127.0.0.1",
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_SERVER_UI_API_URL": api_url,
        "PREFECT_UI_API_URL": api_url,  # the legacy alias, so an inherited value cannot win
        "PREFECT_UI_URL": ui_url(api_url),
    }


def run_hint(api_url: str, flow_name: str) -> str:
    """The command that starts a run of the deployment now, from any shell."""
    return f"PREFECT_API_URL={api_url} prefect deployment run '{flow_name}/{DEPLOYMENT_NAME}'"


@contextlib.contextmanager
def prefect_server(log_dir: Path) -> Iterator[str]:
    """``PREFECT_API_URL`` when set; else a ``prefect server start`` on loopback, stopped on exit."""
    existing = os.environ.get("PREFECT_API_URL")
    if existing:
        err.print(f"using the Prefect server at {existing} (PREFECT_API_URL)")
        yield existing
        return
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "prefect-server.log"
    err.print(
        f"PREFECT_API_URL is not set: starting a Prefect server on http://127.0.0.1:{port} "
        f"(log: {log_path}); it stops when this command stops"
    )
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=server_env(port),
        )
    try:
        wait_healthy(api_url, SERVER_START_TIMEOUT, process)
        err.print(f"Prefect server ready: UI at {ui_url(api_url)}", soft_wrap=True)
        yield api_url
    finally:
        stop_process(process)


def run_serve_cli(cron: str = "0 2 * * *", timezone: str = "UTC", interval: int | None = None) -> int:
    """Serve ``membersync-nightly/nightly`` until interrupted. Bad input raises SettingsError."""
    from membersync.flows.night.nightly import prepare_prefect_env

    config = Settings.load()
    ServiceSettings.from_settings(config)  # a missing setting is reported now, not at 02:00
    Notifier.from_settings(config)  # so is a MEMBERSYNC_NOTIFY Apprise cannot use
    prepare_prefect_env()
    data_dir = DataDir.from_settings(config)
    check_schedule(cron, timezone, interval)
    try:
        data_dir.ensure()
    except OSError as exc:
        raise SettingsError(f"cannot use the data dir {data_dir.root}: {exc.strerror or exc}") from None

    with prefect_server(data_dir.logs) as api_url:
        os.environ["PREFECT_API_URL"] = api_url  # the runner's flow-run subprocesses inherit it
        from membersync.flows.night.prefect_flow import nightly_sync
        from prefect.schedules import Cron, Interval
        from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings
        from prefect.types.entrypoint import EntrypointType

        schedule = (
            Interval(dt.timedelta(seconds=interval), timezone=timezone)
            if interval is not None
            else Cron(cron, timezone=timezone)
        )
        what = f"every {interval} s" if interval is not None else f"cron {cron!r} ({timezone})"
        err.print(f"serving the nightly sync {what}; data dir {data_dir.root}; Ctrl-C stops")
        # soft_wrap: a URL or a command cut by the console's width cannot be copied.
        # Prefect's own starting message suggests `prefect deployment run` without the API URL,
        # which from another shell would reach no server (or the ephemeral one): ours names it.
        with temporary_settings(updates={PREFECT_API_URL: api_url}):
            ui = PREFECT_UI_URL.value()  # Prefect's own derivation (Prefect Cloud's UI differs)
            where = f": runs at {ui}/runs" if ui else ""
            err.print(f"deployment {nightly_sync.name}/{DEPLOYMENT_NAME}{where}", soft_wrap=True)
            err.print(f"run a night now: {run_hint(api_url, nightly_sync.name)}", soft_wrap=True)
            nightly_sync.serve(
                name=DEPLOYMENT_NAME,
                schedules=[schedule],
                entrypoint_type=EntrypointType.MODULE_PATH,
                description="membersync: one night of sync, then the warehouse build and reports",
                limit=1,  # one night at a time (the data dir's lock would refuse a second anyway)
                print_starting_message=False,
            )
    return 0


def stop_process(process: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    """Ask a child to stop (SIGTERM), and kill it if it has not within ``grace`` seconds."""
    process.terminate()
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
