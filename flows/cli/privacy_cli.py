"""``membersync forget``: erase people's identity from every layer
(:mod:`membersync.warehouse.lifecycle.forget`).

Exit codes like ``sync``: 0 done, 1 the work failed or another command holds the data dir
(without ``--wait``), 2 bad input (no client number, an unreadable file, a bad setting).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from membersync.extract.settings import Settings, SettingsError, UsageError
from membersync.flows.console import error, out
from membersync.warehouse.exports.postgres import PublishError
from membersync.warehouse.exports.table_print import print_table
from membersync.warehouse.landing.paths import DataDir

if TYPE_CHECKING:
    from membersync.warehouse.lifecycle.forget import Outcome, Plan, Target
    from membersync.warehouse.lifecycle.retention import RetentionOutcome

log = logging.getLogger(__name__)


def client_numbers(numbers: list[str], from_file: Path | None) -> list[str]:
    """The numbers given, then those of the file (one a line; blank lines and ``#`` comments
    skipped), in order, without duplicates; a number is kept verbatim (leading zeros)."""
    given = [n.strip() for n in numbers]
    if from_file is not None:
        try:
            text = from_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(
                f"cannot read --from-file {from_file}: {getattr(exc, 'strerror', None) or exc}"
            ) from None
        given += [
            line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")
        ]
    bad = [n for n in given if not n or any(c.isspace() for c in n)]
    if bad:
        raise UsageError(f"bad client number {bad[0]!r}: a client number has no blanks")
    if not given:
        raise UsageError("no client number given (pass them as arguments or with --from-file)")
    return list(dict.fromkeys(given))


def run_forget_cli(
    numbers: list[str], from_file: Path | None, reason: str, dry_run: bool, wait: bool, exact: bool = False
) -> int:
    from membersync.warehouse.landing.identity import ErasureKeyError, erasure_key
    from membersync.warehouse.landing.remote import refresh_mirror
    from membersync.warehouse.landing.storage import StoreError
    from membersync.warehouse.landing.zone import AlreadyRunning, LandingZone
    from membersync.warehouse.lifecycle import forget as F
    from membersync.warehouse.lifecycle.upkeep import upkeep

    wanted = client_numbers(numbers, from_file)
    try:
        config = Settings.load()
        data_dir = DataDir.from_settings(config)
    except SettingsError as exc:
        raise UsageError(str(exc)) from None
    if data_dir.remote is None and not data_dir.root.is_dir():
        raise UsageError(f"data dir {data_dir.root} does not exist (set MEMBERSYNC_DATA_DIR)")
    zone = LandingZone(data_dir, erasure_key_file=config.erasure_key_file)
    try:
        with zone.lock(wait=wait):
            refresh_mirror(data_dir)
            upkeep(zone)
            key = erasure_key(zone, create=True) if not dry_run else _dry_key(zone)
            targets = F.resolve(zone, wanted, key)
            done = F.already_forgotten(zone, targets)
            targets = [t for t in targets if t.hmac not in done]
            F.refuse_unheld(targets, exact)
            if dry_run:
                show_plan(targets, F.plan(zone, [t.key for t in targets], _values(zone, targets)), len(done))
                return 0
            if not targets:
                out.print(f"{len(done)} client(s) already forgotten: nothing to do", soft_wrap=True)
                return 0
            erasure = F.start(zone, targets, reason, key)
            outcome = F.finish(zone, erasure.id)
    except AlreadyRunning as exc:
        error(f"{exc}; run `membersync forget` again after it, or with --wait")
        return 1
    except (ErasureKeyError, F.ForgetError) as exc:
        raise UsageError(str(exc)) from None
    except (StoreError, OSError, PublishError) as exc:
        error(f"forget failed: {exc}; run it again to finish")
        return 1
    show_outcome(outcome, len(done))
    return 0


def _dry_key(zone: Any) -> bytes:
    """A dry run's key: the register's (it recognises clients forgotten before; missing or
    wrong, the dry run fails as the real one would), else, before any erasure, a throwaway one."""
    import secrets

    from membersync.warehouse.landing.identity import erasure_key, read_register

    register = read_register(zone.store)
    if register.erasures or register.key_check is not None:
        return erasure_key(zone, create=False)
    return secrets.token_bytes(32)


def _values(zone: Any, targets: list[Target]) -> list[str]:
    from membersync.warehouse.lifecycle import forget as F

    return F.identity_values(zone, [t.key for t in targets if t.held])


def show_plan(targets: list[Target], plan: Plan, already: int) -> None:
    held = sum(t.held for t in targets)
    out.print(
        f"dry run: {len(targets)} client(s) to forget, {held} held, {already} already forgotten; "
        "nothing changed",
        soft_wrap=True,
    )
    rows: list[tuple[str, str]] = []
    for name, removed in sorted(plan.rows().items()):
        rows.append((f"rows: {name}", f"{removed:,}"))
    files: dict[str, int] = {}
    for _, name, _, _ in plan.files:
        files[name] = files.get(name, 0) + 1
    for name, count in sorted(files.items()):
        rows.append((f"files rewritten: {name}", f"{count:,}"))
    rows.append(("nights touched", ", ".join(plan.nights) or "-"))
    rows.append(("reports written again (nights)", ", ".join(plan.reports) or "-"))
    rows.append(("logs and state files scrubbed", f"{len(plan.texts):,}"))
    rows.append(("interrupted nights discarded", f"{len(plan.staging):,}"))
    print_table(["what", "count"], rows, title="would remove", out=out)


def show_outcome(outcome: Outcome, already: int = 0) -> None:
    never_held = f"{outcome.not_held} never held: suppressed from now on"
    rows = [("clients", f"{outcome.clients:,} ({never_held})")]
    if already:
        rows.append(("already forgotten (nothing done)", f"{already:,}"))
    for name, removed in sorted(outcome.rows.items()):
        rows.append((f"rows removed: {name}", f"{removed:,}"))
    for name, count in sorted(outcome.files.items()):
        rows.append((f"files rewritten: {name}", f"{count:,}"))
    rows.append(("nights touched", ", ".join(outcome.nights) or "-"))
    rows.append(("reports written again (nights)", ", ".join(outcome.reports) or "-"))
    if outcome.reports_removed:
        rows.append(("reports removed, not in the warehouse (nights)", ", ".join(outcome.reports_removed)))
    rows.append(("logs and state files scrubbed", f"{outcome.logs:,}"))
    rows.append(("interrupted nights discarded", f"{outcome.staging:,}"))
    print_table(["what", "count"], rows, title=f"forgotten: erasure {outcome.erasure}", out=out)


def run_retention_cli(dry_run: bool, wait: bool) -> int:
    """``membersync retention``: apply ``MEMBERSYNC_RETENTION`` now (or list what it would remove)."""
    from membersync.warehouse.build.builder import build_warehouse
    from membersync.warehouse.build.errors import BuildError
    from membersync.warehouse.landing.identity import ErasureKeyError
    from membersync.warehouse.landing.remote import refresh_mirror
    from membersync.warehouse.landing.storage import StoreError
    from membersync.warehouse.landing.zone import AlreadyRunning, LandingZone
    from membersync.warehouse.lifecycle.retention import RetentionRefused, apply_retention, check_clock
    from membersync.warehouse.lifecycle.upkeep import upkeep

    try:
        config = Settings.load()
        data_dir = DataDir.from_settings(config)
    except SettingsError as exc:
        raise UsageError(str(exc)) from None
    policy = config.retention
    if policy is None or policy.keeps_everything:
        out.print("MEMBERSYNC_RETENTION is not set: every night and every identity is kept", soft_wrap=True)
        return 0
    zone = LandingZone(data_dir, erasure_key_file=config.erasure_key_file)
    try:
        with zone.lock(wait=wait):
            refresh_mirror(data_dir)
            if not dry_run:
                upkeep(zone)
            check_clock(zone.manifests())  # before the build: a night dated wrongly changes nothing
            if zone.manifests():
                build_warehouse(data_dir)  # the identity horizon reads marts.client_activity
            outcome = apply_retention(zone, policy, dry_run=dry_run)
    except AlreadyRunning as exc:
        error(f"{exc}; run it again after it, or with --wait")
        return 1
    except ErasureKeyError as exc:
        raise UsageError(str(exc)) from None
    except RetentionRefused as exc:
        error(str(exc))
        return 1
    except (StoreError, BuildError, OSError, PublishError) as exc:
        error(f"retention failed: {exc}; run it again to finish")
        return 1
    show_retention(outcome, dry_run)
    return 0


def show_retention(outcome: RetentionOutcome, dry_run: bool) -> None:
    verb = "would remove" if dry_run else "removed"
    out.print(
        f"retention {outcome.policy}: {verb} {len(outcome.removed)} night(s), kept {outcome.kept}",
        soft_wrap=True,
    )
    for night in outcome.removed:
        out.print(f"  {night}", soft_wrap=True)
    forgotten = "would forget" if dry_run else "forgot"
    out.print(f"{forgotten} {outcome.forgotten} inactive client(s)", soft_wrap=True)
    starts = outcome.starts
    if starts:
        out.print(
            f"history starts {starts.get('history')}; every night from {starts.get('daily') or '-'}",
            soft_wrap=True,
        )
