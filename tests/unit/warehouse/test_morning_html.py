"""The HTML morning report in a real browser: headless Debian chromium driven by playwright.

The report of the last night of the month scenario (``tests/support/morning_scenario.py``) is opened
from its file: no console error, no request but the file itself (every request is routed and
recorded; any other is refused and fails the test), every chart drawn as SVG with marks, the
page no wider than a phone's screen, the data-quality line (quarantine, self-audit, freshness),
and screenshots at phone (390x844) and desktop (1280x900) width under the test's tmp_path.
Without chromium the test fails with a message saying how to install it (never skipped).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import morning_scenario as ms
import pytest
from membersync.warehouse.build.builder import build_warehouse
from membersync.warehouse.exports.morning import morning_report_path, write_morning_report
from membersync.warehouse.landing.paths import DataDir
from playwright.sync_api import ConsoleMessage, Error, Request

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
CHARTS = (
    "debt",
    "frozen-rate",
    "active-members",
    "mrr",
    "revenue",
    "package-liability",
    "gift-certificates",
    "package-moves",
    "dues-billing",
    "cohort-retention",
)
VIEWPORTS = {"phone": (390, 844), "desktop": (1280, 900)}


def chromium_path() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail(
            "chromium is not installed: the morning report's browser test needs Debian's chromium "
            "(`apt-get install -y chromium`, as root; `tests/checks.py` installs SYSTEM_PACKAGES)"
        )
    return path


def listen(page: Any, errors: list[str]) -> None:
    """Record the page's console errors, uncaught exceptions and failed requests in ``errors``."""

    def console(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(message.text)

    def page_error(error: Error) -> None:
        errors.append(str(error))

    def request_failed(request: Request) -> None:
        errors.append(f"failed {request.url}")

    page.on("console", console)
    page.on("pageerror", page_error)
    page.on("requestfailed", request_failed)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[DataDir, Path, ms.Truth]:
    data_dir = DataDir(tmp_path_factory.mktemp("morning-html") / "data")
    scenario = ms.simulate()
    ms.land(data_dir, scenario)
    build_warehouse(data_dir)
    night = ms.NIGHTS[-1]
    audits = data_dir.state_file.parent / "audits"
    audits.mkdir(parents=True, exist_ok=True)
    (audits / f"{night.isoformat()}.json").write_text(
        json.dumps(
            {
                "format": 1,
                "audit": night.isoformat(),
                "sampled": ["000001", "000002", "000003"],
                "differed": {"000002": {"ledger_balances": ["DOWNTOWN  "]}},
                "tables": 1,
                "keys": 1,
            }
        )
    )
    path = write_morning_report(data_dir, night)
    return data_dir, path, ms.Truth(scenario)


def test_case_the_report_is_one_file_where_the_night_says(report) -> None:
    """Case: DATA_DIR/reports/<night>/morning_report_<night>.html, owner-only, nothing to fetch."""
    data_dir, path, _ = report
    assert path == data_dir.reports / "2026-03-07" / "morning_report_2026-03-07.html"
    assert path == morning_report_path(data_dir, ms.NIGHTS[-1])
    assert (path.stat().st_mode & 0o777) == 0o600
    text = path.read_text(encoding="utf-8")
    assert not re.search(r"""\b(src|href|action)\s*=\s*["']?(?!#)""", text), "a reference to fetch"
    assert "@import" not in text and "url(" not in text and "<script" not in text
    assert text.count("<svg") == len(CHARTS)


def test_case_every_chart_is_valid_vega_lite(report, monkeypatch: pytest.MonkeyPatch) -> None:
    """Case: a night's report renders its charts without validating their Vega-Lite specs (~0.2 s of
    CPU per report); every spec of the scenario's charts is validated against the schema here."""
    from membersync.warehouse.exports import export, morning, morning_charts

    data_dir, _, _ = report
    validated: list[dict[str, Any]] = []

    def validate(chart: Any) -> str:
        validated.append(chart.to_dict(validate=True))  # raises on a spec the schema refuses
        return "<svg></svg>"

    monkeypatch.setattr(morning_charts, "_render", validate)
    with export.open_at_night(data_dir, ms.NIGHTS[-1]) as (con, night):
        charts = morning.read_charts(con, night)
    assert [c.key for c in charts] == list(CHARTS) and len(validated) == len(CHARTS)
    assert all(spec["data"]["values"] for spec in validated)  # each drew the scenario's rows


def test_case_the_report_in_chromium_draws_every_chart_and_requests_nothing_else(report, tmp_path) -> None:
    """Case: a real browser at phone and desktop width: no console error, only the file requested,
    each chart an SVG with marks, figures and data quality shown, screenshots written."""
    from playwright.sync_api import sync_playwright

    chromium = chromium_path()
    _, path, truth = report
    url = path.as_uri()
    night = ms.NIGHTS[-1]
    owed = sum(v["amount_owed"] for (n, _), v in truth.scorecard().items() if n == night)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            for name, (width, height) in VIEWPORTS.items():
                context = browser.new_context(viewport={"width": width, "height": height})
                requests: list[str] = []
                errors: list[str] = []

                def route(r: Any, request: Any, requests: list[str] = requests) -> None:
                    requests.append(request.url)
                    if request.url == url:
                        r.continue_()
                    else:
                        r.abort()

                context.route("**/*", route)
                page = context.new_page()
                listen(page, errors)
                page.goto(url, wait_until="load")
                page.wait_for_timeout(300)
                shot = tmp_path / f"morning-report-{name}.png"
                page.screenshot(path=str(shot), full_page=True)
                assert shot.stat().st_size > 10_000
                assert errors == [], name
                assert requests == [url], name
                for chart in CHARTS:
                    figure = page.locator(f"#chart-{chart}")
                    assert figure.locator("svg").count() == 1, chart
                    marks = figure.locator("svg g[class*='mark-'] path, svg g[class*='mark-'] line").count()
                    assert marks > 0, chart
                    box = figure.locator("svg").bounding_box()
                    assert box is not None and 0 < box["width"] <= width, chart
                overflow = page.evaluate("document.documentElement.scrollWidth")
                assert overflow <= width, f"{name}: the page is {overflow}px wide"
                scorecard = page.locator("#scorecard").inner_text()
                assert "All stores" in scorecard and f"{owed:,}" in scorecard
                quality = page.locator("#data-quality").inner_text()
                assert "Quarantined rows: 2 (memberships 2)" in quality
                assert "Self-audit: 3 client(s) re-fetched, 1 differed (1 key(s))" in quality
                assert "Freshness: newest committed night 2026-03-07" in quality
                assert page.locator("#top-debtors table.debtors").count() >= 2
                context.close()
        finally:
            browser.close()
    if os.environ.get("MEMBERSYNC_KEEP_SCREENSHOTS"):
        keep = Path(os.environ["MEMBERSYNC_KEEP_SCREENSHOTS"])
        keep.mkdir(parents=True, exist_ok=True)
        for shot in tmp_path.glob("morning-report-*.png"):
            shutil.copy(shot, keep / shot.name)
    assert dt.date.fromisoformat(path.parent.name) == night


def _plotted(data_dir: DataDir, night: dt.date, monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Any]]:
    """Each chart's Vega-Lite spec as the report would render it, by what it plots."""
    from membersync.warehouse.exports import export, morning, morning_charts

    specs: dict[str, dict[str, Any]] = {}

    def capture(chart: Any) -> str:
        spec = chart.to_dict(validate=False)
        encoding = spec["encoding"]
        key = "revenue" if encoding["x"]["field"] == "day" else encoding["y"]["field"]
        specs[{"amount": "debt"}.get(key, key)] = spec
        return "<svg></svg>"

    monkeypatch.setattr(morning_charts, "_render", capture)
    with export.open_at_night(data_dir, night) as (con, at):
        morning.read_charts(con, at)
    return specs


def _expected_points(truth: ms.Truth, night: dt.date) -> dict[str, dict[tuple[str, str], Decimal]]:
    """What each chart must plot over the trend window ending ``night``, from the scenario's
    landed rows (plain Python): keyed by (night or day, bucket or store)."""
    from membersync.warehouse.exports.morning import TREND_NIGHTS
    from membersync.warehouse.exports.morning_charts import BUCKETS

    first = night - dt.timedelta(days=TREND_NIGHTS - 1)
    nights = [n for n in truth.nights if first <= n <= night]
    aging, mrr = truth.aging(), truth.mrr()
    points: dict[str, dict[tuple[str, str], Decimal]] = {k: {} for k in ("debt", "rate", "members", "mrr")}
    for n in nights:
        stores = truth.stores(n)
        for column, label in BUCKETS:
            points["debt"][(n.isoformat(), label)] = sum((aging[(n, s)][column] for s in stores), Decimal(0))
        statuses = truth.memberships(n)
        for code, name in stores.items():
            active = sum(1 for (_, s), m in statuses.items() if s == code and m["status"] == "active")
            frozen = sum(1 for (_, s), m in statuses.items() if s == code and m["status"] == "frozen")
            points["members"][(n.isoformat(), name)] = Decimal(active)
            if active + frozen:
                points["rate"][(n.isoformat(), name)] = Decimal(frozen) / Decimal(active + frozen)
        for (m_night, _), row in mrr.items():
            if m_night == n and row["store_name"] is not None:
                points["mrr"][(n.isoformat(), row["store_name"])] = row["mrr"]
    points["revenue"] = {
        (day.isoformat(), store.rstrip()): amount
        for (store, day), amount in truth.revenue().items()
        if first <= day <= night and amount != 0
    }
    return points


@pytest.mark.parametrize("which", ["first", "last"])
def test_case_every_chart_plots_the_report_rows(report, which: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Case: each chart's plotted values (its spec's data) equal what the scenario's truth says of
    every night (or day) and store (or age bucket) of the trend window, at the scenario's first
    night (one point a series) and its last (three months of them). A chart of last week's MRR, or
    of the frozen count as "Active members", fails here; drawing some marks does not."""
    data_dir, _, truth = report
    night = ms.NIGHTS[0] if which == "first" else ms.NIGHTS[-1]
    specs = _plotted(data_dir, night, monkeypatch)
    expected = _expected_points(truth, night)
    fields = {"debt": ("night", "bucket", "amount"), "revenue": ("day", "store", "amount")}
    for key, points in expected.items():
        x, series, value = fields.get(key, ("night", "store", key))
        plotted = {
            (p[x], p[series]): Decimal(str(p[value]))
            for p in specs[key]["data"]["values"]
            if key != "revenue" or p[value] != 0
        }
        places = Decimal("0.0001") if key == "rate" else Decimal("0.01")
        want = {k: v.quantize(places, rounding=ROUND_HALF_UP) for k, v in points.items()}
        got = {k: v.quantize(places, rounding=ROUND_HALF_UP) for k, v in plotted.items()}
        assert got == want, key
        assert want, f"{key}: the scenario gives this chart nothing to plot"


def test_case_the_first_night_s_debt_chart_draws_the_money_owed(
    report, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Case: on a history's first night the chart of what is owed, by age, has one night to show;
    an area over one night has no width (the chart was empty while the scorecard showed money
    owed): one night is drawn as a stacked bar, every bucket with money owed a visible mark."""
    import vl_convert

    data_dir, _, _ = report
    night = ms.NIGHTS[0]
    spec = _plotted(data_dir, night, monkeypatch)["debt"]
    owed = [p for p in spec["data"]["values"] if p["amount"] > 0]
    assert owed, "the scenario owes money on its first night"
    svg = vl_convert.vegalite_to_svg(spec)
    drawn = re.findall(r'<path[^>]*aria-roledescription="bar"[^>]*d="([^"]+)"', svg)
    assert len(drawn) == len(spec["data"]["values"]), svg[:400]
    assert sum(1 for d in drawn if not re.fullmatch(r"M[^h]*h[^v]*v-?0(\.0+)?h[^Z]*Z", d)) == len(owed)
