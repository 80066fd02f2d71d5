"""``membersync demo``: five weeks of a small chain's history, synced night by night, and what a
manager reads the next morning.

A sandbox on loopback (in a child process: on a thread of ours it took turns with the night at
one GIL) is generated up to the first night,
35 nights ago; before each night its stores do a day's business (``extract/sandbox/days.py``:
sales, payments, freezes, cancellations, points, now and then a late void), and the night syncs
it:

- the **first night** runs through the Prefect flow on Prefect's ephemeral server, as a
  production night does (a full night: every client), its build left to the end as the others';
- the **other nights** run as fast as the product can: the same night code without Prefect
  (``nightly.arun_night``; Prefect's server adds seconds a night and shows nothing new), each
  committing its night, with the warehouse build left to the end: one incremental build of
  the 35 nights is the chain of their nightly builds (the build's own test proves the two
  equal) in one dbt run instead of 35, and the reports are exported once, for the last night.

Then the newest night's reports, workbook and morning report are written, and the closing
screen shows the chain's figures with their change over the week, where everything is, and
what to try next. ``--open`` opens the morning report in the desktop's browser.

The data dir is ``MEMBERSYNC_DATA_DIR`` when set (it must hold no night yet), else
``warehouse/data/demo`` in the repository (the demo's own, emptied at each run).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import os
import shutil
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

from membersync.extract.settings import Settings, UsageError
from membersync.flows.console import err, error, out
from membersync.warehouse.landing.paths import DEFAULT_DATA_DIR, DataDir
from rich.table import Table
from rich.text import Text

DEMO_DATA_DIR = DEFAULT_DATA_DIR / "demo"
DEMO_NIGHTS = 35  # five weeks: every week-ago and month-ago comparison has its night
DEMO_RECENT_DAYS = 14  # business days generated before the first night: its eve has sales too
FIGURES = (  # the closing screen: (label, store_scorecard column, money)
    ("Owed", "amount_owed", True),
    ("Frozen memberships", "frozen_memberships", False),
    ("MRR", "mrr", True),
    ("Revenue, 7 days", "revenue_7d", True),
)


@dataclasses.dataclass(frozen=True)
class DemoPlan:
    clients: int
    nights: tuple[dt.date, ...]
    data_dir: DataDir

    @property
    def first(self) -> dt.date:
        return self.nights[0]

    @property
    def last(self) -> dt.date:
        return self.nights[-1]


def demo_nights(count: int, last: dt.date | None = None) -> tuple[dt.date, ...]:
    last = last or dt.date.today()
    return tuple(last - dt.timedelta(days=count - 1 - i) for i in range(count))


def _data_dir() -> DataDir:
    chosen = Settings.load().data_dir
    if not chosen:
        shutil.rmtree(DEMO_DATA_DIR, ignore_errors=True)  # the demo's own: a new sandbox, a new history
        return DataDir(DEMO_DATA_DIR)
    data_dir = DataDir(Path(chosen).resolve())
    if any(data_dir.manifests.glob("????-??-??.json")):
        raise UsageError(
            f"the demo needs a data dir with no night yet: {data_dir.root} holds committed nights "
            "(unset MEMBERSYNC_DATA_DIR to use the demo's own)"
        )
    return data_dir


def run_demo(clients: int = 300, nights: int = DEMO_NIGHTS, open_report: bool = False) -> int:
    from membersync.extract.sandbox.running import start_in_process
    from membersync.extract.sandbox.server import SandboxConfig

    plan = DemoPlan(clients, demo_nights(nights), _data_dir())
    config = SandboxConfig(
        clients=clients,
        anchor_date=plan.first,
        recent_days=DEMO_RECENT_DAYS,
        username="demo",
        password="demo-sandbox-password",
    )
    intro = f": {config.stores} stores, {clients:,} clients, {nights} nights, data dir {plan.data_dir.root}"
    out.print(Text.assemble(("membersync demo", "bold"), intro), soft_wrap=True)
    try:
        with start_in_process(config) as sandbox:
            out.print(f"sandbox serving on {sandbox.url} (loopback)")
            os.environ.update(
                MEMBERSYNC_BASE_URL=sandbox.url,
                MEMBERSYNC_USERNAME=config.username,
                MEMBERSYNC_PASSWORD=config.password,
                MEMBERSYNC_DATA_DIR=str(plan.data_dir.root),
            )
            if not _first_night(sandbox, config.seed, plan) or not _later_nights(sandbox, config.seed, plan):
                return 1
    except RuntimeError as exc:  # the sandbox did not start, or its process ended: one line
        error(f"the demo's sandbox failed: {exc}")
        return 1
    report = _build_and_export(plan)
    show_closing(plan)
    if open_report:
        _open(report)
    return 0


def business_day(sandbox: Any, seed: int, day: dt.date) -> None:
    """The stores' business of ``day``, made in the sandbox before its night is synced."""
    from membersync.extract.sandbox.days import run_day

    sandbox.call(run_day, day, seed)


def _first_night(sandbox: Any, seed: int, plan: DemoPlan) -> bool:
    """The first night through the Prefect flow, its run summary shown."""
    from membersync.flows.cli.sync_cli import print_summary
    from membersync.flows.night import nightly
    from membersync.flows.night.context import NightContext, handed_down
    from membersync.flows.night.progress import RichProgress

    business_day(sandbox, seed, plan.first)
    out.print(
        f"night 1 of {len(plan.nights)}, {plan.first}: through the Prefect flow (a local server starts) ..."
    )
    nightly.prepare_prefect_env()
    from membersync.flows.night import prefect_flow
    from membersync.flows.night.prefect_api import night_api

    context = NightContext.load()  # the environment just set, read once
    context.options = dataclasses.replace(context.options, build=False)  # built once, after the last
    context.progress = bar = RichProgress(err)
    try:
        with night_api(), handed_down(context) as key:  # PREFECT_API_URL's server, else its own
            result = asyncio.run(prefect_flow.nightly_sync(night=plan.first, full=True, context=key))
    except Exception as exc:
        bar.close()
        error(f"the demo's first night failed: {nightly.unwrap(exc)}")
        return False
    summary = nightly.summary_from_flow_result(result)
    print_summary(summary, out)
    return summary.status == "committed"


def _later_nights(sandbox: Any, seed: int, plan: DemoPlan) -> bool:
    """Every other night, one after another, without Prefect and without a build each."""
    from membersync.flows.night import nightly
    from membersync.flows.night.context import NightContext
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    context = NightContext.load()
    options = dataclasses.replace(context.options, build=False)  # one build at the end
    later = plan.nights[1:]
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task("nights", total=len(later))
        for night in later:
            progress.update(task, description=f"night {night}")
            business_day(sandbox, seed, night)
            try:
                asyncio.run(nightly.arun_night(context.settings, plan.data_dir, night, options=options))
            except Exception as exc:
                error(f"the demo's night {night} failed: {nightly.unwrap(exc)}")
                return False
            progress.advance(task)
    out.print(f"nights 2-{len(plan.nights)}, {later[0]} to {plan.last}: synced, each committed")
    return True


def _build_and_export(plan: DemoPlan) -> Path:
    """One incremental build of the nights, then the newest night's exports; the morning report."""
    from membersync.warehouse.build.builder import build_warehouse
    from membersync.warehouse.exports import open_tables
    from membersync.warehouse.exports.reports import export_night

    with err.status("building the warehouse from the new nights ..."):
        built = build_warehouse(plan.data_dir)
        if open_tables.enabled():  # the Delta tables: one commit each for the new nights, not one a night
            open_tables.publish_nights(plan.data_dir, built.built_nights, whole=True)
            open_tables.owner_only(plan.data_dir)
        exported = export_night(plan.data_dir, plan.last)
    out.print(
        f"warehouse: {len(built.nights)} nights, {len(built.built_nights)} built in {built.seconds:.1f} s, "
        f"{built.checks} checks passed",
        soft_wrap=True,
    )
    return next(p for p in exported.paths if p.suffix == ".html")


def chain_figures(data_dir: DataDir, night: dt.date) -> list[tuple[str, Any, Any, bool]]:
    """(label, tonight, a week ago, money) of the whole chain, from the stores' scorecard."""
    from membersync.warehouse.exports.export import open_at_night

    sums = ", ".join(f"sum({c}), sum({c}_week_ago)" for _, c, _ in FIGURES)
    with open_at_night(data_dir, night) as (con, night):
        row = con.execute(
            f"select {sums} from reports.store_scorecard where snapshot_date = ?", [night]
        ).fetchone()
    assert row is not None
    return [(label, row[2 * i], row[2 * i + 1], money) for i, (label, _, money) in enumerate(FIGURES)]


def _shown(value: Any, money: bool, sign: bool = False) -> str:
    if value is None:
        return "–"
    places = 2 if money else 0
    return f"{Decimal(value):{'+' if sign else ''},.{places}f}"


def show_closing(plan: DemoPlan) -> None:
    """What a manager reads, fitted to the terminal; where everything is; what to try next."""
    figures = Table(
        title=f"the chain on {plan.last} ({len(plan.nights)} nights of history)", title_justify="left"
    )
    for heading in ("", "tonight", "a week ago", "change"):
        figures.add_column(heading, justify="left" if not heading else "right", no_wrap=True)
    for label, now, before, money in chain_figures(plan.data_dir, plan.last):
        change = None if now is None or before is None else Decimal(now) - Decimal(before)
        figures.add_row(label, _shown(now, money), _shown(before, money), _shown(change, money, sign=True))
    out.print(figures)
    night = Path("reports") / plan.last.isoformat()
    page = night / f"morning_report_{plan.last}.html"
    where = [
        ("morning report", page),
        ("workbook", night / f"reports_{plan.last}.xlsx"),
        ("report CSVs", f"{night}/"),
        ("warehouse", plan.data_dir.warehouse_db.relative_to(plan.data_dir.root)),
    ]
    out.print(
        Text.assemble(("where it is", "bold"), f" (in the data dir {plan.data_dir.root})"), soft_wrap=True
    )
    for label, path in where:
        out.print(f"  {label:<16}{path}", soft_wrap=True, highlight=False)
    out.print(Text("try next", style="bold"))
    tries = (
        f"cd {plan.data_dir.root}",
        "export MEMBERSYNC_DATA_DIR=$PWD",
        'membersync sql "select * from reports.store_scorecard limit 5"',
        "membersync report-html",
        f"{'open' if sys.platform == 'darwin' else 'xdg-open'} {page}",
    )
    for command in tries:
        out.print(f"  {command}", soft_wrap=True, highlight=False, markup=False)


def _open(page: Path) -> None:
    """The morning report in the desktop's browser, where there is one."""
    import webbrowser

    desktop = sys.platform == "darwin" or os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    if not desktop or not webbrowser.open(page.as_uri()):
        out.print(f"no desktop browser here: open {page}", soft_wrap=True)
