"""Politeness at the limit against the sandbox's token bucket, over loopback (issue 12).

Not timed: the figures (share of the limit held, share of 429s) live in the benchmark
(`membersync bench --rate-matrix`). These tests check behaviour: the rate a night finds is
remembered for the next one, an announced limit is obeyed, and the estimate is the server's.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from membersync.extract import constants as K
from membersync.extract.client import ClientOptions, ServiceClient
from membersync.extract.sandbox.server import STATS_PATH
from membersync.extract.settings import ServiceSettings
from membersync.flows.benchmarks.sync import PASSWORD as SANDBOX_PASSWORD
from membersync.flows.benchmarks.sync import USERNAME as SANDBOX_USERNAME
from membersync.flows.benchmarks.sync import sandbox_process
from membersync.flows.night.nightly import NightRun, remember_rate, remembered_rate, run_night
from membersync.flows.night.options import SyncOptions
from membersync.warehouse.landing.paths import DataDir
from nights import settings_for
from pydantic import SecretStr

TODAY = dt.date.today()


def test_a_night_remembers_the_rate_it_found_and_the_next_starts_there(tmp_path: Path) -> None:
    """The sandbox runs in its own process: in this one it shared our loop's GIL, and on a loaded
    machine (CI, 2026-12-03) a stall bunched the night's requests past an 80/s bucket of 4 while
    it sent about 35/s, and that was what it remembered."""
    data_dir = DataDir(tmp_path / "data")
    with sandbox_process(60, rate=80.0, burst=4.0) as url:
        settings = ServiceSettings(url, SecretStr(SANDBOX_USERNAME), SecretStr(SANDBOX_PASSWORD))
        run_night(settings, data_dir, TODAY, options=SyncOptions(build=False))
        served = httpx.get(f"{url}{STATS_PATH}").json()
    found = remembered_rate(data_dir)
    assert found is not None, "a night that met 429s must remember the rate it found"
    # Within a fifth above the server's 80/s (a bucket of 4 lets a moment run past it), and at
    # least three quarters of it: a night that ends slow-starting from a floor remembers what the
    # server accepted since, not the floor (CI once remembered 16.0/s so).
    late = served["loop_late_per_second"]
    assert 80.0 * 0.75 <= found <= 80.0 * 1.2, f"{found}/s; the server's loop was late: {late}"
    run = NightRun(settings, data_dir, TODAY, options=SyncOptions(build=False))
    assert run._client_options().initial_rate == found
    capped = SyncOptions(build=False, client_options=ClientOptions(rate=10.0))
    run = NightRun(settings, data_dir, TODAY, options=capped)
    client = ServiceClient.from_settings(settings, run._client_options())
    assert client.rate.rate == 10.0  # MEMBERSYNC_RATE still caps the remembered rate


def test_a_night_that_met_no_429_hands_what_the_server_took_to_the_next_night_s_slow_start(
    fresh_sandbox: Callable[..., Any], tmp_path: Path
) -> None:
    """A server with no limit: the night measures no rate, but keeps what the server took over a
    window, and the next night's slow start begins there; a rate found later replaces it."""
    sandbox = fresh_sandbox(clients=60, seed=8)
    data_dir = DataDir(tmp_path / "data")
    run_night(settings_for(sandbox), data_dir, TODAY, options=SyncOptions(build=False))
    start = remembered_rate(data_dir, "start")
    assert remembered_rate(data_dir) is None and start is not None and start > 0
    run = NightRun(settings_for(sandbox), data_dir, TODAY, options=SyncOptions(build=False))
    options = run._client_options()
    assert options.start_rate == start and options.initial_rate is None
    client = ServiceClient.from_settings(settings_for(sandbox), options)
    assert client.rate.rate == max(start, K.INITIAL_RATE) and client.rate.found is None
    remember_rate(data_dir, 55.0, start)
    assert run._client_options().initial_rate == 55.0 and run._client_options().start_rate is None


def test_a_malformed_rate_file_is_ignored(tmp_path: Path) -> None:
    data_dir = DataDir(tmp_path / "data")
    data_dir.rate_file.parent.mkdir(parents=True)
    for text in ("{", json.dumps({"rate": "fast"}), json.dumps({"rate": -3}), json.dumps([1])):
        data_dir.rate_file.write_text(text)
        assert remembered_rate(data_dir) is None


def test_an_announced_limit_is_followed_without_a_429_of_ours() -> None:
    """The sandbox runs in its own process here: in this one, our client's event loop and the
    server's threads share one GIL, and on a loaded machine (3 pytest workers on 2 cores) a
    stall let the server take several paced requests at once, past its 2-token bucket (CI,
    2026-11-24: the rate cut to 38.5/s). In its own process a stall of the server's still
    bunches what it handles (CI, 2026-11-25: 3 of 99 answered 429): the server notes how late
    its loop woke each second, so a 429 in a second it stalled is its own, not our pacing."""
    with sandbox_process(30, rate=40.0, burst=2.0, announce_limits=True) as url:
        refused, rate, requests = asyncio.run(_follow_the_announced_limit(url))
        served = httpx.get(f"{url}{STATS_PATH}").json()
    refused_per_second = {int(s): n for s, n in served["refused_per_second"].items()}
    stalled = {int(s) for s in served["loop_late_per_second"]}
    assert sum(refused_per_second.values()) == refused  # the server's count is ours
    # A stall noted at the wake-up that ends it: its bunch is handled then, or across a second's edge.
    ours = sum(n for s, n in refused_per_second.items() if not stalled & {s - 1, s, s + 1})
    assert ours <= 1, f"{ours} of {requests} answered 429 though the server announced its limit: {served}"
    # the server's 40/s, less 1 % (a bunch of 429s at once pauses, never cuts below its word)
    assert rate is not None and 39.0 <= rate <= 40.0, f"rate {rate}; {refused} of {requests} answered 429"


async def _follow_the_announced_limit(url: str) -> tuple[int, float | None, int]:
    async with ServiceClient(url, SANDBOX_USERNAME, SANDBOX_PASSWORD) as client:
        numbers: list[str] = []
        for store in await client.storelist():  # the first answer carries the headers
            async for page in client.search(storecode=store["storecode"]):
                numbers += [c["clientNumber"] for c in page.items]
        await asyncio.gather(*(client.clientdetails(n) for n in numbers * 3))
        return client.stats.status_429, client.rate.rate, client.stats.requests


def test_case_a_cap_on_requests_in_flight_is_learned_and_held_without_cutting_the_pace() -> None:
    """Case: a server that refuses more than 4 requests open at once (20 ms each). The client
    learns the cap from the 429s (one or two, then one a probe) and holds the wire at it; the
    server's count of refusals over its cap is ours. (Whether the pace was cut on the way is not
    asserted: on a loaded machine our loop reads answers late, a request sent with 5 of ours on
    the wire is then taken often enough that its level's first refusal is the pace's.)"""
    with sandbox_process(30, latency_ms=20.0, max_in_flight=4) as url:
        refused, requests, cap, _decreases = asyncio.run(_many_at_once(url, 800))
        served = httpx.get(f"{url}{STATS_PATH}").json()
    assert cap == 4
    assert served["over_in_flight"] == refused and refused <= 8, f"{refused} of {requests} answered 429"


def test_case_a_fixed_window_is_learned_and_later_windows_end_without_a_429() -> None:
    """Case: 160 requests a 4-s window (40/s). The first window's quota goes early and its end
    refuses a volley; from then on the pace spreads a window's quota over it, and the server
    refuses nothing after the first window."""
    with sandbox_process(30, rate=40.0, window=4.0) as url:
        refused, _requests, _cap, _decreases = asyncio.run(_many_at_once(url, 800))
        served = httpx.get(f"{url}{STATS_PATH}").json()
    passed = {int(s): n for s, n in served["passed_per_second"].items()}
    refusals = {int(s): n for s, n in served["refused_per_second"].items()}
    first = min(passed)
    assert refusals and max(refusals) <= first + 5, f"429s after the first window: {refusals}"
    assert served["rate_limited"] == refused


async def _many_at_once(url: str, count: int) -> tuple[int, int, int | None, int]:
    async with ServiceClient(url, SANDBOX_USERNAME, SANDBOX_PASSWORD) as client:
        await asyncio.gather(*(client.storelist() for _ in range(count)))
        return client.stats.status_429, client.stats.requests, client.cap.cap, client.rate.decreases
