"""``membersync demo``: a sandbox, one night through the Prefect flow, and where it all landed.

Starts a sandbox on loopback (in this process, on its own thread), points the sync at it
through the environment (the same way ``membersync sync`` is configured), runs one full night
through the Prefect flow on Prefect's ephemeral server, and shows the landed tables, the
night's manifest, the warehouse and the report CSVs, with a peek at one report.

The data dir is ``MEMBERSYNC_DATA_DIR`` when set, else ``warehouse/data/demo`` in the
repository. The demo always runs a *full* night (its sandbox is new each time).
"""

from __future__ import annotations

import csv
import datetime as dt
import os
from pathlib import Path

from membersync.extract import eventloop
from membersync.extract.settings import Settings
from membersync.warehouse.paths import DEFAULT_DATA_DIR, DataDir
from rich.console import Console
from rich.table import Table

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

DEMO_DATA_DIR = DEFAULT_DATA_DIR / "demo"
PEEK_REPORT = "outstanding_balances_by_store"


def run_demo(clients: int = 300) -> int:
    from membersync.extract.sandbox.server import SandboxConfig, start_in_thread
    from membersync.flows import nightly
    from membersync.flows.progress import RichProgress
    from membersync.flows.sync_cli import print_summary

    chosen = Settings.load().data_dir
    data_dir = DataDir(Path(chosen).resolve()) if chosen else DataDir(DEMO_DATA_DIR)
    night = dt.date.today()
    config = SandboxConfig(clients=clients, username="demo", password="demo-sandbox-password")
    out.print(
        f"[bold]membersync demo[/]: a sandbox with {clients:,} clients, one night, data dir {data_dir.root}"
    )
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
        from membersync.flows import prefect_flow
        from membersync.flows.prefect_api import night_api

        bar = RichProgress(err)
        nightly.progress_factory = lambda: bar
        try:
            with night_api():  # PREFECT_API_URL's server, else one in this process
                result = eventloop.run(prefect_flow.nightly_sync(night=night, full=True))
        except Exception as exc:
            bar.close()
            err.print(f"[bold red]error:[/] the demo night failed: {nightly.unwrap(exc)}")
            return 1
        finally:
            nightly.progress_factory = None
    summary = nightly.summary_from_flow_result(result)
    print_summary(summary, out)
    show_landing(data_dir, night)
    return 0 if summary.status == "committed" and summary.build.startswith("ok") else 1


def show_landing(data_dir: DataDir, night: dt.date) -> None:
    """Where the night landed: Parquet per table, manifest, warehouse, reports."""
    from membersync.warehouse.manifest import manifest_path, read_manifest

    manifest = read_manifest(data_dir.manifests, night)
    if manifest is None:
        out.print(f"[red]no committed manifest for {night}[/]")
        return
    landed = Table(title=f"landing zone: {data_dir.landing}", title_justify="left")
    landed.add_column("table")
    landed.add_column("rows", justify="right")
    landed.add_column("files", justify="right")
    landed.add_column("where")
    for name, files in sorted(manifest.tables.items()):
        where = str(Path(files.files[0]).parent) + "/" if files.files else "-"
        landed.add_row(name, f"{files.rows:,}", str(len(files.files)), where)
    landed.add_row(
        "(quarantine)", f"{manifest.quarantine.rows:,}", str(len(manifest.quarantine.files)), "_quarantine/"
    )
    out.print(landed)
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
        peek = report_dir / f"{PEEK_REPORT}_{night.isoformat()}.csv"
        if peek.exists():
            _show_csv(peek)


def _show_csv(path: Path, limit: int = 12) -> None:
    with open(path, newline="", encoding="utf-8-sig") as handle:  # the CSVs start with a BOM (Excel)
        rows = list(csv.reader(handle))
    if not rows:
        return
    table = Table(title=path.name, title_justify="left")
    for name in rows[0]:
        table.add_column(name)
    for row in rows[1 : limit + 1]:
        table.add_row(*row)
    out.print(table)
