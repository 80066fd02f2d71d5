"""The README's first command and the commands no other test ran (issue 53, defect 7):
``membersync demo``, ``report-html`` and ``docs``, each as a user runs it (the installed
command, a fresh data dir and Prefect home), on one demo night shared by the module.

The demo's sandbox is the default one (``SandboxConfig(clients=N)``: its data depend only on its
seed and size), so the test starts its own twin in this process to compute the truth of the
demo's night from the sandbox's own state (``tests/support/truth.py``), never from our SQL.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import truth
from membersync.extract.sandbox.running import RunningSandbox, start_in_thread
from membersync.extract.sandbox.server import SandboxConfig
from membersync.warehouse.landing.paths import DataDir
from repo_root import MEMBERSYNC

CLIENTS = 40
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
    done = run(["demo", "--clients", str(CLIENTS)], env)
    return DataDir(root / "data"), env, done


@pytest.fixture(scope="module")
def twin() -> Iterator[RunningSandbox]:
    """The demo's sandbox again (same size and seed): the truth's source."""
    sandbox = start_in_thread(SandboxConfig(clients=CLIENTS))
    yield sandbox
    sandbox.stop()


def test_case_the_demo_syncs_a_night_whose_reports_equal_the_truth(demo, twin: RunningSandbox) -> None:
    data_dir, _, done = demo
    assert done.returncode == 0, done.stderr[-2000:]
    night = dt.date.today()
    assert f"membersync night {night}" in done.stdout
    assert "committed" in done.stdout and f"landing zone: {data_dir.landing}" in done.stdout
    truth.assert_night_exact(twin, data_dir, night)  # every report of the night, to the cent


def test_case_the_demo_peek_shows_the_reports_first_rows_whole(demo) -> None:
    """The peek at the end of the demo shows the report's first rows as its CSV holds them."""
    data_dir, _, done = demo
    night = dt.date.today()
    path = next((data_dir.reports / night.isoformat()).glob("outstanding_balances_by_store_*.csv"))
    header, *rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8-sig"))))
    shown = done.stdout.split(path.name, 1)[1]
    for row in rows[:12]:
        for name, cell in zip(header, row, strict=True):
            if name.endswith(("amount", "balance", "owed")) and cell:
                assert cell in shown, (name, cell)


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
