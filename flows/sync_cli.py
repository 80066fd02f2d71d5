"""``membersync sync``: one night from the command line, on Prefect's ephemeral server.

Checks everything it can *before* starting Prefect (whose ephemeral server takes seconds to
start): settings and profile (a missing one is a one-line error naming it, exit 2), the
data dir (exit 2), and the sync lock (another sync on the same data dir: "already running",
exit 1, at once). Then runs the flow, shows a progress bar, prints the run summary, and
exits 0 when the night was committed and the warehouse built, 1 otherwise.

``MEMBERSYNC_PREFECT=off`` runs the same night without Prefect (for embedding, debugging a
machine without a Prefect home, and the benchmark's comparison).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
from typing import Any

from membersync.extract.profile import ProfileError
from membersync.extract.settings import ServiceSettings, SettingsError
from membersync.flows import nightly
from membersync.flows.progress import NullProgress, Progress, RichProgress
from membersync.warehouse.paths import DataDir
from rich.console import Console
from rich.table import Table

err = Console(stderr=True, highlight=False)
out = Console(highlight=False)


def _fail(message: str, code: int) -> int:
    err.print(f"[bold red]error:[/] {message}", soft_wrap=True, markup=True)
    return code


def run_sync_cli(night: dt.date | None, full: bool = False, progress: bool = True) -> int:
    from membersync.warehouse.landing import AlreadyRunning

    try:
        settings = ServiceSettings.from_env()
        settings.profile()
        options = nightly.SyncOptions.from_env()
        data_dir = DataDir.from_env()
    except (SettingsError, ProfileError) as exc:
        return _fail(str(exc), 2)
    try:
        data_dir.ensure()
    except OSError as exc:
        return _fail(f"cannot use the data dir {data_dir.root}: {exc.strerror or exc}", 2)
    night = night or dt.date.today()
    use_prefect = os.environ.get("MEMBERSYNC_PREFECT", "on").strip().lower() not in (
        "off",
        "0",
        "false",
        "no",
    )

    try:
        with nightly.holding_lock(data_dir):
            bar: Progress = RichProgress(err) if progress else NullProgress()
            try:
                summary = _run(settings, data_dir, night, full, options, bar, use_prefect)
            except Exception as exc:
                bar.close()
                error = nightly.unwrap(exc)
                return _fail(f"night {night} failed: {_one_line(error)}", 1)
    except AlreadyRunning as exc:
        return _fail(f"already running: {exc}", 1)
    print_summary(summary)
    if summary.status != "committed" or not summary.build.startswith(("ok", "skipped")):
        return 1
    return 0


def _run(
    settings: ServiceSettings,
    data_dir: DataDir,
    night: dt.date,
    full: bool,
    options: nightly.SyncOptions,
    bar: Progress,
    use_prefect: bool,
) -> nightly.RunSummary:
    if not use_prefect:
        return nightly.run_night(settings, data_dir, night, full=full, options=options, progress=bar)
    bar.phase("starting Prefect")
    nightly.prepare_prefect_env()
    if isinstance(bar, RichProgress):
        # One line per task run would scroll the bar away; the flow's own lines stay.
        logging.getLogger("prefect.task_runs").setLevel(logging.WARNING)
    nightly.progress_factory = lambda: bar
    try:
        result: dict[str, Any] = asyncio.run(nightly.nightly_sync(night=night, full=full))
    finally:
        nightly.progress_factory = None
    return nightly.summary_from_flow_result(result)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def print_summary(summary: nightly.RunSummary, console: Console | None = None) -> None:
    table = Table(title=f"membersync night {summary.night}", show_header=False, title_justify="left")
    table.add_column("item", style="bold")
    table.add_column("value", justify="right")
    for row in summary.table_rows():
        table.add_row(row["item"], row["value"])
    (console or out).print(table)
