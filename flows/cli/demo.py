"""``membersync demo``: a sandbox, one night through the Prefect flow, and where it all landed.

Starts a sandbox on loopback (in this process, on its own thread), points the sync at it
through the environment (the same way ``membersync sync`` is configured), runs one full night
through the Prefect flow on Prefect's ephemeral server, and shows the landed tables, the
night's manifest, the warehouse and the report CSVs, with a peek at one report.

The data dir is ``MEMBERSYNC_DATA_DIR`` when set, else ``warehouse/data/demo`` in the
repository. The demo always runs a *full* night (its sandbox is new each time).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
from pathlib import Path

from membersync.extract.settings import Settings
from membersync.flows.console import err, error, out
from membersync.warehouse.exports.table_print import print_table
from membersync.warehouse.landing.paths import DEFAULT_DATA_DIR, DataDir
from rich.text import Text

DEMO_DATA_DIR = DEFAULT_DATA_DIR / "demo"
PEEK_REPORT = "outstanding_balances_by_store"


def run_demo(clients: int = 300) -> int:
    from membersync.extract.sandbox.running import start_in_thread
    from membersync.extract.sandbox.server import SandboxConfig
    from membersync.flows.cli.sync_cli import print_summary
    from membersync.flows.night import nightly
    from membersync.flows.night.context import NightContext, handed_down
    from membersync.flows.night.progress import RichProgress

    chosen = Settings.load().data_dir
    data_dir = DataDir(Path(chosen).resolve()) if chosen else DataDir(DEMO_DATA_DIR)
    night = dt.date.today()
    config = SandboxConfig(clients=clients, username="demo", password="demo-sandbox-password")
    intro = f": a sandbox with {clients:,} clients, one night, data dir {data_dir.root}"
    out.print(Text.assemble(("membersync demo", "bold"), intro))
    with start_in_thread(config) as sandbox:
        out.print(f"sandbox serving on {sandbox.url} (loopback)")
        os.environ.update(
            MEMBERSYNC_BASE_URL=sandbox.url,
            MEMBERSYNC_USERNAME=config.username,
            MEMBERSYNC_PASSWORD=config.password,
            MEMBERSYNC_DATA_DIR=str(data_dir.root),
        )
        out.print("starting a local Prefect server (takes a few seconds) ...")
        nightly.prepare_prefect_env()
        from membersync.flows.night import prefect_flow
        from membersync.flows.night.prefect_api import night_api

        context = NightContext.load()  # the environment just set, read once
        context.progress = bar = RichProgress(err)
        try:
            with night_api(), handed_down(context) as key:  # PREFECT_API_URL's server, else its own
                result = asyncio.run(prefect_flow.nightly_sync(night=night, full=True, context=key))
        except Exception as exc:
            bar.close()
            error(f"the demo night failed: {nightly.unwrap(exc)}")
            return 1
    summary = nightly.summary_from_flow_result(result)
    print_summary(summary, out)
    show_landing(data_dir, night)
    return 0 if summary.status == "committed" and summary.build.startswith("ok") else 1


def show_landing(data_dir: DataDir, night: dt.date) -> None:
    """Where the night landed: Parquet per table, manifest, warehouse, reports."""
    from membersync.warehouse.landing.manifest import manifest_path, read_manifest

    manifest = read_manifest(data_dir.manifests, night)
    if manifest is None:
        out.print(f"no committed manifest for {night}", style="red")
        return
    rows: list[tuple[object, ...]] = []
    for name, files in sorted(manifest.tables.items()):
        where = str(Path(files.files[0]).parent) + "/" if files.files else "-"
        rows.append((name, files.rows, len(files.files), where))
    rows.append(("(quarantine)", manifest.quarantine.rows, len(manifest.quarantine.files), "_quarantine/"))
    print_table(["table", "rows", "files", "where"], rows, title=f"landing zone: {data_dir.landing}", out=out)
    out.print(f"manifest (the commit):  {manifest_path(data_dir.manifests, night)}")
    out.print(f"state:                  {data_dir.state_file}")
    if data_dir.warehouse_db.exists():
        size = data_dir.warehouse_db.stat().st_size / 1e6
        out.print(f"warehouse (DuckDB):     {data_dir.warehouse_db} ({size:.1f} MB)")
        query = '"select * from reports.top_debtors limit 5"'
        out.print(f"  try: MEMBERSYNC_DATA_DIR={data_dir.root} membersync sql {query}")
    report_dir = data_dir.reports / night.isoformat()
    if report_dir.exists():
        out.print(f"report CSVs:            {report_dir}/")
        for path in sorted(report_dir.glob("*.csv")):
            out.print(f"  {path.name}")
        _show_report(data_dir, night)


def _show_report(data_dir: DataDir, night: dt.date, limit: int = 12) -> None:
    """The first rows of one report as its CSV holds them, through the CLI's one table printer
    (typed values, so an amount is never cut to fit the terminal)."""
    from membersync.warehouse.exports.export import REPORTS, open_at_night, read_report

    report = REPORTS[PEEK_REPORT]
    with open_at_night(data_dir, night) as (con, night):
        table = read_report(con, report, night)
    rows = [tuple(row) for row in table.rows[:limit]]
    title = f"{PEEK_REPORT}_{night.isoformat()}.csv"
    print_table(table.header, rows, title=title, null_text="", out=out, err=err)
