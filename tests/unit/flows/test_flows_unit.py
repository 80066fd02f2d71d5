"""Unit tests of the night's plain logic (no server, no Prefect): discovery, windows, batches,
options, and the CLI's one-line errors."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
from pathlib import Path

import pytest
from membersync.extract.settings import Settings, SettingsError
from membersync.flows.night import batches as B
from membersync.flows.night.nightly import summary_from_flow_result
from membersync.flows.night.options import SyncOptions
from membersync.flows.night.summary import RunSummary
from repo_root import MEMBERSYNC, REPO


def summary(number: str, last_modified: str | None, store: str = "DOWNTOWN  ") -> dict[str, object]:
    return {
        "clientNumber": number,
        "homeStore": store,
        "lastModified": last_modified,
        "email": "x@example.com",
    }


def test_discovery_dedupes_sorts_and_takes_the_servers_newest_last_modified() -> None:
    found = [
        summary("000417", "2026-01-02T03:04:05Z"),
        summary("000010", "2026-01-03T00:00:00Z", store="UPTOWN    "),
        summary("000417", "2026-01-02T03:04:05Z"),  # seen on two pages (an insert shifted it)
        summary("0009", "2025-12-31T23:59:59+00:00"),
    ]
    got = B.summarize_discovery(found, previous_watermark="2025-01-01T00:00:00Z")
    assert got.client_numbers == ["000010", "000417", "0009"]  # string order: numbers stay opaque
    assert got.watermark == "2026-01-03T00:00:00Z"
    # only what synced_clients needs is kept (and saved with the night)
    assert got.clients[0].wire() == {
        "clientNumber": "000010",
        "homeStore": "UPTOWN    ",
        "lastModified": "2026-01-03T00:00:00Z",
    }


def test_discovery_keeps_the_previous_watermark_when_nothing_changed() -> None:
    assert B.summarize_discovery([], "2026-01-01T00:00:00Z").watermark == "2026-01-01T00:00:00Z"
    assert B.summarize_discovery([summary("1", None)], None).watermark is None


def test_discovery_skips_summaries_without_a_client_number() -> None:
    got = B.summarize_discovery([{"lastModified": "2026-01-01T00:00:00Z"}, summary("7", None)], None)
    assert got.client_numbers == ["7"]


def test_modified_since_subtracts_the_overlap_from_the_server_watermark() -> None:
    assert B.modified_since("2026-01-02T00:10:00Z", dt.timedelta(minutes=15)) == "2026-01-01T23:55:00Z"
    assert B.modified_since(None, dt.timedelta(minutes=15)) is None


def test_window_whole_history_by_default_a_lookback_only_when_opted_in() -> None:
    night = dt.date(2026, 3, 10)
    first = B.Window.for_night(night, None, full=False, lookback_days=7, points_start=dt.date(2000, 1, 1))
    assert first.history_start is None and first.points_start == dt.date(2000, 1, 1)
    assert first.end == dt.date(2026, 3, 11)
    later = B.Window.for_night(
        night, dt.date(2026, 3, 9), full=False, lookback_days=7, points_start=dt.date(2000, 1, 1)
    )
    # a later night: the synced clients' whole histories (points too: a back-dated adjustment)
    assert later.history_start is None and later.points_start == dt.date(2000, 1, 1)
    windowed = B.Window.for_night(
        night,
        dt.date(2026, 3, 9),
        full=False,
        lookback_days=7,
        points_start=dt.date(2000, 1, 1),
        whole_history=False,
    )
    assert windowed.history_start == windowed.points_start == dt.date(2026, 3, 2)
    forced = B.Window.for_night(
        night, dt.date(2026, 3, 9), full=True, lookback_days=7, points_start=dt.date(2001, 1, 1)
    )
    assert forced.history_start is None and forced.points_start == dt.date(2001, 1, 1)


def test_batches_are_stable_chunks_of_the_sorted_list() -> None:
    clients = [B.ClientRef(f"{i:06d}", None, None) for i in range(7)]
    planned = B.plan_batches(clients, 3)
    assert [b.id for b in planned] == ["00000", "00001", "00002"]
    assert [len(b.clients) for b in planned] == [3, 3, 1]
    assert planned[2].clients[0].number == "000006"
    assert B.plan_batches([], 3) == []
    with pytest.raises(ValueError):
        B.plan_batches(clients, 0)


def test_share_lookups_only_for_owners_of_affiliated_packages() -> None:
    packages = {
        "1": [{"packageId": "PKG-A", "sharedFromClientNumber": None}],  # owns an affiliated package
        "2": [{"packageId": "PKG-A", "sharedFromClientNumber": "1"}],  # uses one shared from 1
        "3": [{"packageId": "PKG-B", "sharedFromClientNumber": ""}],  # owns a non-affiliated one
        "4": [],
    }
    assert B.clients_to_ask_about_shares(packages, frozenset({"PKG-A"})) == {"1"}


def test_store_codes_are_byte_exact_and_unique() -> None:
    stores = [{"storecode": "DOWNTOWN  "}, {"storecode": "DOWNTOWN  "}, {"storecode": "UP        "}, {}]
    assert B.store_codes(stores) == ["DOWNTOWN  ", "UP        "]


def test_sync_options_from_env() -> None:
    assert SyncOptions.from_settings(Settings.load({})) == SyncOptions()
    got = SyncOptions.from_settings(
        Settings.load(
            {
                "MEMBERSYNC_BATCH_SIZE": "100",
                "MEMBERSYNC_LOOKBACK_DAYS": "3",
                "MEMBERSYNC_POINTS_START": "2010-01-01",
                "MEMBERSYNC_WATERMARK_OVERLAP_MINUTES": "5",
            }
        )
    )
    assert (got.batch_size, got.lookback_days, got.points_start) == (100, 3, dt.date(2010, 1, 1))
    assert got.watermark_overlap == dt.timedelta(minutes=5)
    with pytest.raises(SettingsError, match="MEMBERSYNC_BATCH_SIZE"):
        SyncOptions.from_settings(Settings.load({"MEMBERSYNC_BATCH_SIZE": "zero"}))
    with pytest.raises(SettingsError, match="MEMBERSYNC_BATCHES_IN_FLIGHT"):
        SyncOptions.from_settings(Settings.load({"MEMBERSYNC_BATCHES_IN_FLIGHT": "0"}))


def test_summary_round_trips_through_the_flow_result_and_holds_no_secret() -> None:
    s = RunSummary(night=dt.date(2026, 1, 2), run_id="r", status="committed", clients=3, rows={"clients": 3})
    s.requests, s.duration_s = 30, 2.0
    back = summary_from_flow_result(s.as_dict())
    assert back == s
    rows = {r["item"]: r["value"] for r in s.table_rows()}
    assert rows["requests/s (night average)"] == "15" and rows["rows: clients"] == "3"


@pytest.mark.parametrize("missing", ["MEMBERSYNC_BASE_URL", "MEMBERSYNC_USERNAME", "MEMBERSYNC_PASSWORD"])
def test_sync_with_a_missing_setting_is_one_line_naming_it_exit_2(missing: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMBERSYNC_")}
    env.update(
        MEMBERSYNC_BASE_URL="http://127.0.0.1:9",
        MEMBERSYNC_USERNAME="u",
        MEMBERSYNC_PASSWORD="p-secret-value",
        MEMBERSYNC_DATA_DIR=str(tmp_path / "data"),
        PREFECT_HOME=str(tmp_path / "prefect"),
        COLUMNS="200",
    )
    del env[missing]
    proc = subprocess.run(
        [*MEMBERSYNC, "sync", "--date", "2026-01-02"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert missing in lines[0]
    assert "p-secret-value" not in proc.stderr + proc.stdout


def test_first_night_rerun_and_backfill_are_full_nights() -> None:
    from membersync.flows.night.nightly import needs_full_night

    day = dt.date(2026, 3, 10)
    assert needs_full_night(day, None)
    assert needs_full_night(day, day)  # a rerun replaces the night's files: it must hold everyone
    assert needs_full_night(day, day + dt.timedelta(days=1))
    assert not needs_full_night(day, day - dt.timedelta(days=1))


def test_an_empty_batch_still_types_every_client_table_with_its_schema() -> None:
    from membersync.models import tables as T
    from membersync.models.coerce import TimezoneLookup

    typed = B.type_batch(B.RawBatch(B.Batch("00000", ()), {}, []), TimezoneLookup())
    assert set(typed.tables) == set(B.BATCH_TABLES)
    for name, table in typed.tables.items():
        assert table.num_rows == 0 and table.schema == T.table(name).schema
    assert typed.quarantine_table is None


def test_client_options_from_the_environment() -> None:
    from membersync.extract.client import ClientOptions
    from membersync.extract.settings import SettingsError
    from membersync.flows.night.options import SyncOptions

    options = SyncOptions.from_settings(
        Settings.load(
            {"MEMBERSYNC_RATE": "180", "MEMBERSYNC_MAX_CONCURRENCY": "12", "MEMBERSYNC_REQUEST_TIMEOUT": "20"}
        )
    ).client_options
    assert isinstance(options, ClientOptions)
    assert (options.rate, options.max_concurrency, options.request_timeout) == (180.0, 12, 20.0)
    assert ClientOptions.from_settings(Settings.load({})) == ClientOptions()
    for variable, raw in (
        ("MEMBERSYNC_RATE", "fast"),
        ("MEMBERSYNC_MAX_RETRIES", "-1"),
        ("MEMBERSYNC_RATE", "nan"),
    ):
        with pytest.raises(SettingsError, match=variable):
            ClientOptions.from_settings(Settings.load({variable: raw}))


# --- which nights may run (issue 8, defect 6) ---------------------------------------------------------


def test_a_future_night_is_refused() -> None:
    from membersync.flows.cli.sync_cli import check_night

    today = dt.date(2026, 11, 23)
    assert check_night(today + dt.timedelta(days=1), [], today, force=False) is None  # a store east of us
    refusal = check_night(today + dt.timedelta(days=2), [], today, force=True)
    assert refusal is not None and "in the future" in refusal


def test_an_older_night_than_the_newest_committed_needs_force() -> None:
    from membersync.flows.cli.sync_cli import check_night

    today = dt.date(2026, 11, 23)
    committed = [dt.date(2026, 11, 20), dt.date(2026, 11, 22)]
    refusal = check_night(dt.date(2026, 11, 20), committed, today, force=False)
    assert refusal is not None and "--force" in refusal and "2026-11-22" in refusal
    assert check_night(dt.date(2026, 11, 20), committed, today, force=True) is None
    assert check_night(dt.date(2026, 11, 22), committed, today, force=False) is None  # tonight's rerun
    assert check_night(today, committed, today, force=False) is None


def test_sync_of_a_future_night_is_one_line_exit_2(tmp_path: Path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MEMBERSYNC_")},
        "MEMBERSYNC_BASE_URL": "http://127.0.0.1:9",
        "MEMBERSYNC_USERNAME": "u",
        "MEMBERSYNC_PASSWORD": "p",
        "MEMBERSYNC_DATA_DIR": str(tmp_path / "data"),
    }
    night = (dt.date.today() + dt.timedelta(days=5)).isoformat()
    proc = subprocess.run(
        [*MEMBERSYNC, "sync", "--date", night],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "in the future" in lines[0], proc.stderr


def test_the_rate_matrix_measures_each_cell_once() -> None:
    """Burst ``R`` at 20/s is burst 20: one night, not two (the issue's grid names it twice)."""
    from membersync.flows.benchmarks.sync import matrix_grid

    grid = matrix_grid([20.0, 50.0], ["1", "20", "R"], [0.0, 20.0], announced=False)
    assert len(grid) == len(set(grid)) == 10  # 2 rates x 3 bursts x 2 latencies, less (20, 20) twice
    assert (20.0, 20.0, 0.0, False) in grid and (50.0, 50.0, 20.0, False) in grid
    assert len(matrix_grid([20.0], ["R"], [0.0], announced=True)) == 2  # silent and announced


def test_case_a_cell_of_several_nights_reads_its_median_lowest_and_nights_met() -> None:
    """``bench --rate-matrix --nights 3``: one 15-s night is a coin toss near the line, so a cell
    measured three nights reads the median of its % of the limit, the lowest, the median % 429,
    and how many nights met it; the footer counts the cells met every night and in most."""
    from membersync.flows.benchmarks.sync import NightsOfACell, RateCell, _nights_markdown

    def night(share: float, steady_429: float) -> RateCell:
        return RateCell(50.0, 1.0, 0.0, False, 1072, 16, share, 0.015, steady_429, 20.0)

    shaky = NightsOfACell((night(0.962, 0.0033), night(0.925, 0.0023), night(0.970, 0.0046)))
    steady = NightsOfACell((night(0.99, 0.004), night(0.98, 0.002)))
    # Truth, by hand: the middle of three sorted values; two met (>= 95 %, < 1 % 429) of three.
    assert shaky.median_share == 0.962 and shaky.lowest_share == 0.925
    assert shaky.median_429 == 0.0033 and shaky.met == 2
    assert steady.median_share == pytest.approx(0.985) and steady.met == 2
    table = _nights_markdown([shaky, steady])
    assert "| 50 | 1 | 0 ms | silent | 96.2% | 92.5% | 0.33% | 2 of 3 | 96.2%, 92.5%, 97.0% |" in table
    assert "| 98.5% | 98.0% | 0.30% | 2 of 2 | 99.0%, 98.0% |" in table
    assert "1 of 2 cells met in every night, 2 in most" in table


def test_case_the_rate_matrix_measures_from_the_measured_nights_first_second() -> None:
    """The caller subtracts the server's counts from before the night (a probe's, or with
    ``--next-night`` the whole first night's): the seconds left at 0 are not the night's, so the
    first 5 s are skipped from its first request, not from the night before (which put a
    second night at 42 % of its limit: two nights and the gap between them in one span)."""
    from membersync.flows.benchmarks.sync import server_share

    night_before = {str(s): 0 for s in range(100, 130)}  # all subtracted away
    passed = {**night_before, **{str(s): 19 for s in range(200, 215)}, "215": 7}
    refused = {**night_before, "203": 2, "208": 1}
    share, whole_429, steady_429, span = server_share(
        {"passed_per_second": passed, "refused_per_second": refused}, rate=20.0
    )
    # measured: seconds 205..213 (from the 6th second to the last whole one, exclusive)
    assert span == 9.0
    assert share == pytest.approx(19 * 9 / 9 / 20)
    assert steady_429 == pytest.approx(1 / (19 * 9 + 1))  # the refusal at 208; 203 is the discovery's
    assert whole_429 == pytest.approx(3 / (19 * 15 + 7 + 3))


def test_case_whole_nights_measure_a_window_s_wait_and_a_cap_s_limit_is_n_over_the_latency() -> None:
    """Case: a fixed window's night asks in bursts with waits between (the server's due): the
    share is over every second from the first request to the last, waits included. A cap of 4 at
    20 ms sustains 200/s. The rows are each limit once (burst ``R`` is the rate)."""
    from membersync.flows.benchmarks.whole_night import ServerLimit, asked_share, limits_from

    # Truth, by hand: 1,200 let through in seconds 0-9 and 600 in 60-69, 3 refused at 10: 70 s.
    passed = {**{str(s): 120 for s in range(10)}, **{str(s): 60 for s in range(60, 70)}}
    share, share_429, seconds = asked_share(
        {"passed_per_second": passed, "refused_per_second": {"10": 3}}, {}, sustained=20.0
    )
    assert seconds == 70 and share == pytest.approx(1800 / 70 / 20) and share_429 == pytest.approx(3 / 1803)
    assert ServerLimit(cap=4).sustained(20.0) == pytest.approx(200.0)
    assert ServerLimit(cap=16).sustained(50.0) == pytest.approx(320.0)
    assert ServerLimit(rate=20.0, window=60.0).label == "1,200 per 60 s"
    assert ServerLimit(cap=4).told() == {"MEMBERSYNC_MAX_CONCURRENCY": "4"}
    assert limits_from([200.0], ["5", "R", "200"], 0.0, []) == [
        ServerLimit(rate=200.0, burst=5.0),
        ServerLimit(rate=200.0, burst=200.0),
    ]
    assert limits_from([20.0, 200.0], ["5"], 60.0, []) == [
        ServerLimit(rate=20.0, window=60.0),
        ServerLimit(rate=200.0, window=60.0),
    ]
    assert limits_from([20.0], ["5"], 60.0, [4, 16, 4]) == [ServerLimit(cap=4), ServerLimit(cap=16)]


def test_the_collector_is_off_while_loading_then_on_again_and_what_was_loaded_is_frozen() -> None:
    """Case: nightgc.quiet_while_loading around an import (Prefect's, at a night's start)."""
    import gc

    from membersync.flows.night import nightgc

    assert gc.isenabled()
    frozen_before = gc.get_freeze_count()
    try:
        with nightgc.quiet_while_loading():
            assert not gc.isenabled()
            loaded = [[i] for i in range(1000)]  # objects the collector tracks, made while loading
        assert gc.isenabled()
        assert gc.get_freeze_count() >= frozen_before + len(loaded)
        gc.disable()  # a caller that had it off keeps it off
        with nightgc.quiet_while_loading():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()  # (the test process's later collections see everything again)
