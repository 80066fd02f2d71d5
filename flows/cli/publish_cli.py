"""What ``membersync publish`` does: the warehouse brought into the PostgreSQL database of
``MEMBERSYNC_PUBLISH_URL`` (:mod:`membersync.warehouse.exports.postgres`), and its roles.

Exit codes as everywhere: 0 done (or up to date), 1 the database refused or could not be
reached (it still holds what it held: the previous night, whole), 2 bad input.
"""

from __future__ import annotations

from membersync.extract.settings import UsageError
from membersync.flows.cli.reports_cli import existing_data_dir
from membersync.flows.console import error, out
from membersync.warehouse.exports import postgres as P
from membersync.warehouse.landing.paths import DataDir
from membersync.warehouse.landing.remote import refresh_mirror
from membersync.warehouse.landing.zone import AlreadyRunning, LandingZone


def run_publish_cli(*, full: bool, roles: bool, dry_run: bool, wait: bool) -> int:
    url = P.configured()
    if url is None:
        raise UsageError("no database to publish to: set MEMBERSYNC_PUBLISH_URL (docs/postgres.md)")
    if dry_run and not roles:
        raise UsageError("--dry-run shows what --roles would run: give both")
    data_dir = existing_data_dir()
    try:
        if roles:
            return _roles(data_dir, url, dry_run)
        with LandingZone(data_dir).lock(wait):  # one writer: a build may not swap the catalog meanwhile
            refresh_mirror(data_dir)
            done = P.publish_warehouse(data_dir, url=url, full=full)
    except AlreadyRunning as exc:
        error(f"{exc}; run `membersync publish` again after it (its build publishes too)")
        return 1
    except P.PublishError as exc:
        error(str(exc))
        return 1
    out.print(_summary(P.where(url), done), soft_wrap=True)
    return 0


def _roles(data_dir: DataDir, url: str, dry_run: bool) -> int:
    statements = P.roles_plan(data_dir, url)
    if dry_run:
        for statement in statements:
            out.print(f"{statement};", soft_wrap=True, markup=False, highlight=False)
        return 0
    P.apply_roles(statements, url)
    out.print(f"{P.where(url)}: roles, grants and row security set ({len(statements)} statements)")
    return 0


def _summary(where: str, done: P.Publication) -> str:
    if not done.changed:
        return f"{where}: up to date"
    what = (
        f"{len(done.nights)} night(s) whole in one transaction"
        if done.whole
        else f"{len(done.nights)} night(s)"
    )
    removed = f", {len(done.removed)} removed" if done.removed else ""
    return f"{where}: {what}{removed}, {done.rows:,} rows, {done.bytes:,} bytes in {done.seconds:.1f} s"
