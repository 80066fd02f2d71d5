"""The README's first command and the commands no other test ran (issues 53, 65):
``membersync demo``, ``report-html`` and ``docs``, each as a user runs it (the installed
command, a fresh data dir and Prefect home), on one demo history shared by the module.

The demo's sandbox is the default one at its first night (its data and its days of business
depend only on its seed, size and days), so the test starts its own twin in this process, makes
each day's business again, and computes the truth of each night from the sandbox's own state
(``tests/support/truth.py``), never from our SQL.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest
import truth
from membersync.extract.sandbox.running import start_in_thread
from membersync.extract.sandbox.server import SandboxConfig
from membersync.warehouse.landing.manifest import read_manifests
from membersync.warehouse.landing.paths import DataDir
from repo_root import MEMBERSYNC

CLIENTS = 40
NIGHTS = 8  # the demo's default is 35; enough here for a week-ago comparison on the last night
COMMAND = [*MEMBERSYNC]
Demo = tuple[DataDir, dict[str, str], "subprocess.CompletedProcess[str]"]


def run(args: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    root = tmp_path_factory.mktemp("demo")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("MEMBERSYNC_", "PREFECT_"))},
        "MEMBERSYNC_DATA_DIR": str(root / "data"),
        "PREFECT_HOME": str(root / "prefect"),
        "COLUMNS": "80",
    }
    done = run(["demo", "--clients", str(CLIENTS), "--nights", str(NIGHTS)], env)
    return DataDir(root / "data"), env, done


def demo_nights() -> tuple[dt.date, ...]:
    from membersync.flows.cli.demo import demo_nights

    return demo_nights(NIGHTS)


@pytest.fixture(scope="module")
def twin_truths() -> dict[dt.date, truth.Reports]:
    """The demo's sandbox again (same size, seed and first night), its days of business made
    again one by one (they depend only on the seed and the day): the truth of each night, from
    the sandbox's own state when that night was synced."""
    from membersync.extract.sandbox.days import run_day
    from membersync.flows.cli.demo import DEMO_RECENT_DAYS

    nights = demo_nights()
    sandbox = start_in_thread(
        SandboxConfig(clients=CLIENTS, anchor_date=nights[0], recent_days=DEMO_RECENT_DAYS)
    )
    truths = {}
    try:
        for night in nights:
            sandbox.call(lambda service, night=night: run_day(service, night, sandbox.config.seed))
            truths[night] = truth.truth_of(sandbox, night)
    finally:
        sandbox.stop()
    return truths


def test_case_the_demo_syncs_every_night_and_each_nights_reports_equal_the_truth(demo, twin_truths) -> None:
    """Every night the demo ran: its snapshot reports (the history managers compare against)
    equal that night's truth; the last night: every report and CSV, to the cent."""
    data_dir, _, done = demo
    assert done.returncode == 0, done.stderr[-2000:]
    nights = demo_nights()
    assert [m.snapshot_date for m in read_manifests(data_dir.manifests)] == list(nights)
    snapshots = [n for n, spec in truth.SPECS.items() if spec.per_night]
    for night in nights[:-1]:
        expected = {n: rows for n, rows in twin_truths[night].items() if n in snapshots}
        assert (
            truth.report_differences(truth.warehouse_reports(data_dir, night, snapshots), expected) == []
        ), night
    problems = truth.report_differences(
        truth.warehouse_reports(data_dir, nights[-1]), twin_truths[nights[-1]]
    )
    assert problems + truth.csv_differences(data_dir, nights[-1], twin_truths[nights[-1]]) == []


def test_case_the_demo_has_sales_up_to_each_night(twin_truths) -> None:
    for night in demo_nights():
        days = {r["business_date"] for r in twin_truths[night]["revenue_by_store_day"]}
        assert night in days, night  # the sandbox's data reaches the night it serves


def test_case_the_closing_screen_fits_80_and_120_columns_and_says_where_to_look(demo) -> None:
    data_dir, env, done = demo
    assert done.returncode == 0, done.stderr[-2000:]
    closing = done.stdout[done.stdout.index("the chain on") :]
    assert all(len(line) <= 80 for line in closing.splitlines()), closing
    for label in ("Owed", "Frozen memberships", "MRR", "Revenue, 7 days", "a week ago", "change"):
        assert label in closing, label
    for where in ("morning report", "workbook", "report CSVs", "warehouse", "membersync sql", "report-html"):
        assert where in closing, where
    assert "xdg-open reports/" in closing or "open reports/" in closing
    wide = subprocess.run(
        [sys.executable, "-c", CLOSING, str(data_dir.root), str(NIGHTS)],
        env={**env, "COLUMNS": "120"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "Revenue, 7 days" in wide and max(len(line) for line in wide.splitlines()) <= 120


CLOSING = """
import sys, pathlib
from membersync.flows.cli.demo import DemoPlan, demo_nights, show_closing
from membersync.warehouse.landing.manifest import read_manifests
from membersync.warehouse.landing.paths import DataDir
show_closing(DemoPlan(0, demo_nights(int(sys.argv[2])), DataDir(pathlib.Path(sys.argv[1]))))
"""


def test_case_report_html_writes_the_nights_morning_report(demo) -> None:
    data_dir, env, _ = demo
    night = dt.date.today()
    done = run(["report-html"], env)
    assert done.returncode == 0, done.stderr
    page = data_dir.reports / night.isoformat() / f"morning_report_{night.isoformat()}.html"
    assert str(page) in done.stdout.replace("\n", "")
    html = page.read_text(encoding="utf-8")
    assert night.isoformat() in html and "<svg" in html
    bad = run(["report-html", "--date", "2026-13-01"], env)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_case_docs_generates_the_warehouse_documentation_site(demo) -> None:
    data_dir, env, _ = demo
    done = run(["docs"], env)
    assert done.returncode == 0, done.stderr
    page = Path(done.stdout.split("docs site:", 1)[1].split()[0])
    assert page.is_file() and page.stat().st_size > 10_000
    text = page.read_text(encoding="utf-8", errors="replace")
    assert "top_debtors" in text and "outstanding_balances_by_store" in text
    assert not any(p.suffix == ".html" for p in data_dir.root.parent.glob("*.html"))  # in the data dir


@pytest.mark.parametrize("command", ["forget", "retention", "sync", "sql", "reports", "audit"])
def test_case_a_flag_shows_as_a_flag_in_help(command: str) -> None:
    """Issue 60: `--help` showed every flag as `--dry-run <bool>`, as if it took a value; a flag
    has no type, an option that takes a value keeps its own."""
    from membersync.flows.cli.commands import app
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "160", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output
    assert "--help" in result.output
