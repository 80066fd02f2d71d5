"""``membersync serve``'s Prefect UI, seen in a real browser (headless Debian chromium via playwright).

The server ``serve`` launches must hand its UI its own API address: the UI fetches it from
``/ui-settings`` and calls it from the browser, so only a browser shows whether it is right.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from repo_root import MEMBERSYNC
from serving import running_serve

FLOW, DEPLOYMENT, ARTIFACT = "membersync-nightly", "nightly", "membersync-night-summary"
UNREACHABLE_API = "Can't connect to Server API"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def chromium_path() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail(
            "chromium is not installed: `tests/checks.py` installs it (tests/support/system.py; "
            "needs root), or run `apt-get install -y chromium`"
        )
    return path


def serve_env(sandbox: Any, tmp_path: Path) -> dict[str, str]:
    """Only the sandbox's settings: no inherited PREFECT_API_URL, so serve launches its own server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMBERSYNC_", "PREFECT_"))}
    env.update(
        MEMBERSYNC_BASE_URL=sandbox.url,
        MEMBERSYNC_USERNAME="sandbox",
        MEMBERSYNC_PASSWORD="sandbox",
        MEMBERSYNC_DATA_DIR=str(tmp_path / "data"),
        MEMBERSYNC_BUILD="off",  # the UI is under test, not the warehouse
        PREFECT_HOME=str(tmp_path / "prefect-home"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_RUNNER_POLL_FREQUENCY="2",  # the runner picks up the first scheduled night sooner
        COLUMNS="200",
    )
    return env


def wait_for_completed_run(api_url: str, timeout: float, alive: Callable[[], bool]) -> None:
    """Until the API holds a COMPLETED flow run (the UI shows what the API holds when it loads)."""
    body = {"flow_runs": {"state": {"type": {"any_": ["COMPLETED"]}}}, "limit": 1}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        if httpx.post(f"{api_url}/flow_runs/filter", json=body, timeout=5).json():
            return
        time.sleep(0.5)
    raise AssertionError(f"no completed flow run on {api_url} within {timeout:.0f} s")


def wait_for_texts(page: Any, texts: list[str], timeout: float, patterns: tuple[str, ...] = ()) -> str:
    """Poll the page's visible text until every one of ``texts`` is in it and every regular
    expression of ``patterns`` matches it (the UI fills a list's details in after the list
    itself); return that text."""
    deadline = time.monotonic() + timeout
    body = ""

    def missing() -> list[str]:
        return [t for t in texts if t not in body] + [p for p in patterns if not re.search(p, body)]

    while time.monotonic() < deadline:
        body = page.inner_text("body")
        assert UNREACHABLE_API not in body, f"the UI at {page.url} cannot reach its API:\n{body[:1000]}"
        if not missing():
            return body
        time.sleep(0.5)
    raise AssertionError(f"{page.url} never showed {missing()} within {timeout:.0f} s:\n{body[:2000]}")


@pytest.mark.slow
@pytest.mark.prefect
@pytest.mark.timeout(300)
def test_serve_ui_shows_the_deployment_a_completed_run_and_its_artifact(
    fresh_sandbox: Callable[..., Any], tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    chromium = chromium_path()
    sandbox = fresh_sandbox(clients=10)
    with running_serve(serve_env(sandbox, tmp_path), interval=3) as (proc, out):

        def alive() -> bool:
            return proc.poll() is None

        ui = out.wait_for(r"UI at (http://127\.0\.0\.1:\d+)\s*$", 200, alive).group(1)
        hint = f"PREFECT_API_URL={ui}/api prefect deployment run '{FLOW}/{DEPLOYMENT}'"
        out.wait_for(re.escape(hint), 30, alive)
        wait_for_completed_run(f"{ui}/api", 150, alive)

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1300})  # room for the runs list
                page.goto(f"{ui}/runs")
                # the completed run's row names its deployment (filled in after the row appears)
                wait_for_texts(page, [FLOW, "Completed"], 60, patterns=(rf"Deployment\s+{DEPLOYMENT}\b",))
                page.screenshot(path=tmp_path / "serve-ui-runs.png")
                page.goto(f"{ui}/artifacts")
                wait_for_texts(page, [ARTIFACT], 60)
                page.screenshot(path=tmp_path / "serve-ui-artifacts.png")
            finally:
                browser.close()


@pytest.mark.prefect
@pytest.mark.timeout(300)
def test_case_serve_schedules_the_night_by_its_cron_in_its_timezone(
    fresh_sandbox: Callable[..., Any], tmp_path: Path
) -> None:
    """Case: ``serve --cron '30 3 * * 1-5' --timezone Europe/Paris``: the deployment the Prefect
    server holds has that cron in that timezone; a timezone that does not exist is one line and
    exit 2."""
    sandbox = fresh_sandbox(clients=5)
    env = serve_env(sandbox, tmp_path)
    bad = subprocess.run(
        [*MEMBERSYNC, "serve", "--timezone", "Mars/Olympus"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "unknown timezone 'Mars/Olympus'" in bad.stderr, bad.stderr
    schedule = ("--cron", "30 3 * * 1-5", "--timezone", "Europe/Paris")
    with running_serve(env, schedule=schedule) as (proc, out):

        def alive() -> bool:
            return proc.poll() is None

        out.wait_for(re.escape("serving the nightly sync cron '30 3 * * 1-5' (Europe/Paris)"), 60, alive)
        ui = out.wait_for(r"UI at (http://127\.0\.0\.1:\d+)\s*$", 200, alive).group(1)
        api = f"{ui}/api"
        deployment = wait_for_deployment(api, 60, alive)
        [held] = [s["schedule"] for s in deployment["schedules"]]
        assert (held["cron"], held["timezone"]) == ("30 3 * * 1-5", "Europe/Paris"), held


def wait_for_deployment(api_url: str, timeout: float, alive: Callable[[], bool]) -> dict[str, Any]:
    """The deployment ``serve`` registered, once the API holds it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        answer = httpx.get(f"{api_url}/deployments/name/{FLOW}/{DEPLOYMENT}", timeout=5)
        if answer.status_code == 200:
            deployment: dict[str, Any] = answer.json()
            return deployment
        time.sleep(0.5)
    raise AssertionError(f"no deployment {FLOW}/{DEPLOYMENT} on {api_url} within {timeout:.0f} s")
