"""The nightly self-audit (issue 9): silent vendor changes are found, queued, and healed.

The sandbox changes clients *silently* (:mod:`membersync.extract.sandbox.silent`: no
``lastModified`` bump), so an incremental night's discovery cannot see them. Ground truth is
what the sandbox says it changed (client, kind, and the storecode / membership / receipt it
touched), never our comparison; the reports' truth is ``tests/support/truth.py`` (plain Python,
``Decimal``, from the sandbox's own state). Nights run as real ``membersync`` processes
(``tests/support/reliability.py``'s :class:`Workspace`, Prefect off) against the sandbox on loopback.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import math
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import truth
from conftest_prefect import prefect_harness  # noqa: F401  (session fixture)
from landed import numbers_by_key, synced_numbers
from membersync.extract.sandbox.running import RunningSandbox, start_in_thread
from membersync.extract.sandbox.server import SandboxConfig
from membersync.extract.sandbox.silent import KINDS, SilentChange, change_silently
from membersync.extract.settings import ServiceSettings, Settings, SettingsError
from membersync.flows.cli.audit_cli import AuditUsageError, _audit, parse_clients
from membersync.flows.night import audit as A
from membersync.flows.night import batches as B
from membersync.flows.night.nightly import with_queued
from membersync.flows.night.options import SyncOptions
from membersync.models import tables as T
from membersync.warehouse.landing.manifest import read_manifest
from membersync.warehouse.landing.zone import LandingZone

# Three nights, the last one tomorrow (the latest night a sync accepts); data up to the first.
from nights import LAST_NIGHT as ANCHOR
from reliability import Outcome, Workspace

NIGHT1, NIGHT2, NIGHT3 = ANCHOR, ANCHOR + dt.timedelta(days=1), ANCHOR + dt.timedelta(days=2)
# The table each kind of silent change shows up in (and in no other). Every compared table has
# its own kind: one the audit would miss if that table were dropped from it (see
# test_every_audited_table_is_needed_to_find_its_kind_of_silent_change). None is only derived
# from another: a line, a payment or a points transaction can be corrected on its own.
TABLE_OF_KIND = {
    "ledger": "ledger_balances",
    "membership": "memberships",
    "transaction": "transactions",
    "points": "points_balances",
    "client": "clients",
    "identity": "client_identity",  # personal fields: compared as the identity's digest
    "package": "client_packages",
    "comm_prefs": "comm_prefs",
    "billing": "billing_accounts",
    "line": "transaction_lines",
    "payment": "transaction_payments",
    "points_event": "points_transactions",
}


def finding(change: SilentChange) -> tuple[str, str]:
    """The table and the row key (as the audit writes it) a silent change shows up as: a table
    keyed by the client alone shows ``-`` (the change's ident names the field there)."""
    table = TABLE_OF_KIND[change.kind]
    return table, "-" if T.landed(table).key == ("client_key",) else change.ident


def test_every_compared_table_has_a_kind_of_silent_change_and_every_kind_a_compared_table() -> None:
    """The coupling, without HTTP: dropping a table from ``AUDITED_TABLES`` fails here (and the
    end-to-end tests below show each kind is really found in its table)."""
    assert set(TABLE_OF_KIND) == set(KINDS)
    assert sorted(TABLE_OF_KIND.values()) == sorted(A.COMPARED)  # one kind per table, each compared


# --- sampling and settings (no HTTP) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "known", "candidates", "env", "expected"),
    [
        ("share of 100,000 known clients: 1% = 1,000", 100_000, 99_000, {}, 1_000),
        ("small tenant: at least 20", 200, 190, {}, 20),
        ("fewer candidates than the minimum: all of them", 200, 7, {}, 7),
        ("request budget caps the share: 900 requests = 100 clients", 100_000, 99_000,
         {"MEMBERSYNC_AUDIT_MAX_REQUESTS": "900"}, 100),
        ("request budget wins over the minimum: 90 requests = 10 clients", 200, 190,
         {"MEMBERSYNC_AUDIT_MAX_REQUESTS": "90"}, 10),
        ("budget 0 turns the audit off", 5_000, 5_000, {"MEMBERSYNC_AUDIT_MAX_REQUESTS": "0"}, 0),
        ("share 25% of 200", 200, 150, {"MEMBERSYNC_AUDIT_SHARE": "0.25"}, 50),
        ("minimum 0 and share 0: nothing", 200, 150,
         {"MEMBERSYNC_AUDIT_SHARE": "0", "MEMBERSYNC_AUDIT_MIN": "0"}, 0),
    ],
)  # fmt: skip
def test_sample_size_bounds(
    case: str, known: int, candidates: int, env: dict[str, str], expected: int
) -> None:
    assert A.sample_size(known, candidates, A.AuditOptions.from_settings(Settings.load(env))) == expected, (
        case
    )


def test_default_budget_affords_the_default_share_of_100000_clients() -> None:
    options = A.AuditOptions()
    assert A.REQUESTS_PER_CLIENT == 9  # the nine per-client reads, nothing else
    assert options.max_requests // A.REQUESTS_PER_CLIENT >= math.ceil(0.01 * 100_000)


def test_pick_sample_is_seeded_sorted_and_drawn_from_the_candidates() -> None:
    candidates = [f"{n:06d}" for n in range(500)]
    first = A.pick_sample(candidates, 40, "night-a")
    assert first == A.pick_sample(reversed(candidates), 40, "night-a")  # same seed, same sample
    assert first == sorted(first) and len(set(first)) == 40 and set(first) <= set(candidates)
    assert first != A.pick_sample(candidates, 40, "night-b")
    assert A.pick_sample(candidates[:5], 40, "night-a") == candidates[:5]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MEMBERSYNC_AUDIT_SHARE": "1.5"}, "MEMBERSYNC_AUDIT_SHARE"),
        ({"MEMBERSYNC_AUDIT_SHARE": "lots"}, "MEMBERSYNC_AUDIT_SHARE"),
        ({"MEMBERSYNC_AUDIT_MIN": "-1"}, "MEMBERSYNC_AUDIT_MIN"),
        ({"MEMBERSYNC_AUDIT_MAX_REQUESTS": "ten"}, "MEMBERSYNC_AUDIT_MAX_REQUESTS"),
        ({"MEMBERSYNC_AUDIT_HEAL": "later"}, "MEMBERSYNC_AUDIT_HEAL"),
    ],
)
def test_bad_audit_settings_are_one_line_naming_the_setting(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message) as caught:
        A.AuditOptions.from_settings(Settings.load(env))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("value", ["0", "-3", "many", "1.5", ""])
def test_bad_clients_option_is_refused(value: str) -> None:
    with pytest.raises(AuditUsageError, match="--clients"):
        parse_clients(value)


def test_clients_option_values() -> None:
    assert parse_clients(None) == -1 and parse_clients("all") is None and parse_clients("12") == 12


def test_comparison_ignores_the_ledgers_as_of_stamp_and_row_order_but_not_a_cent() -> None:
    schema = T.landed("ledger_balances").schema

    def ledger(rows: list[tuple[str, str, str, dt.date]]) -> pa.Table:
        from decimal import Decimal

        return pa.Table.from_pylist(
            [
                {"client_key": c, "storecode": s, "balance": Decimal(b), "as_of": d, "extra": None}
                for c, s, b, d in rows
            ],
            schema=schema,
        )

    day1, day2 = dt.date(2026, 1, 1), dt.date(2026, 1, 9)
    landed = A.keyed_rows(
        "ledger_balances", ledger([("0001", "A         ", "10.00", day1), ("0001", "B", "0.50", day1)])
    )
    same = A.keyed_rows(
        "ledger_balances", ledger([("0001", "B", "0.50", day2), ("0001", "A         ", "10.00", day2)])
    )
    cent = A.keyed_rows(
        "ledger_balances", ledger([("0001", "B", "0.51", day2), ("0001", "A         ", "10.00", day2)])
    )
    empty: dict[str, Any] = {name: {} for name in A.COMPARED}
    assert (
        A.differences({**empty, "ledger_balances": landed}, {**empty, "ledger_balances": same}, ["0001"])
        == {}
    )
    assert A.differences(
        {**empty, "ledger_balances": landed}, {**empty, "ledger_balances": cent}, ["0001"]
    ) == {"0001": {"ledger_balances": ["B"]}}
    # a row only on one side is a difference too (a ledger paid off to nothing, or a new one)
    assert A.differences({**empty, "ledger_balances": landed}, empty, ["0001"]) == {
        "0001": {"ledger_balances": ["A         ", "B"]}
    }


def test_queued_clients_join_the_discovery_without_moving_the_watermark() -> None:
    found = B.Discovery(
        [B.ClientRef("0005", "S", "2026-01-02T00:00:00Z")],
        "2026-01-02T00:00:00Z",
    )
    queued = A.queued_discovery(  # as the queue file holds them: by key, numbers from the links
        {
            "k5": {"homeStore": "S", "lastModified": "2025-01-01T00:00:00Z", "tables": ["clients"]},
            "k1": {"homeStore": "S", "lastModified": "2025-01-01T00:00:00Z", "tables": ["clients"]},
            "k9": {"homeStore": "S", "lastModified": "2025-01-01T00:00:00Z", "tables": ["clients"]},
        },
        {"k1": "0001", "k5": "0005"},  # k9 is linked to no one (forgotten since): skipped
    )
    merged = with_queued(found, queued)
    assert merged.client_numbers == ["0001", "0005"]
    assert merged.clients[1] == found.clients[0]  # discovery's own record wins
    assert merged.watermark == found.watermark


def test_queue_is_owner_only_and_forgets_only_synced_clients(tmp_path: Path) -> None:
    from membersync.warehouse.landing.paths import DataDir

    data_dir = DataDir(tmp_path / "data")
    result = A.AuditResult(
        ["0001", "0002", "0003"], {"0001": {"memberships": ["M1"]}, "0003": {"clients": ["0003"]}}
    )
    A.queue_for_resync(data_dir, result, "2026-01-01")
    path = A.resync_file(data_dir)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert sorted(A.read_queue(data_dir)) == ["0001", "0003"]
    assert A.forget_synced(data_dir, ["0002", "0003"]) == 1
    assert sorted(A.read_queue(data_dir)) == ["0001"]
    assert not [p for p in path.parent.iterdir() if ".tmp-" in p.name]


# --- end to end -------------------------------------------------------------------------------------


def make_workspace(tmp_path: Path, sandbox: RunningSandbox, **env: str) -> Workspace:
    return Workspace(tmp_path / "ws", sandbox.url, ANCHOR, batch_size=40, extra_env=env)


def sync(ws: Workspace, night: dt.date) -> Outcome:
    outcome = ws.sync(ws.argv(night))
    assert outcome.ok, outcome.describe()
    return outcome


def audit_report(ws: Workspace, label: str) -> dict[str, Any]:
    path = A.audit_report_file(ws.data_dir, label)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    return by_number(ws, json.loads(path.read_text()))


def on_demand_report(ws: Workspace, outcome: Outcome) -> dict[str, Any]:
    line = next(x for x in outcome.stdout.splitlines() if x.startswith("report: "))
    return by_number(ws, json.loads(Path(line.removeprefix("report: ").strip()).read_text()))


def by_number(ws: Workspace, report: dict[str, Any]) -> dict[str, Any]:
    """An audit report (client keys: it never names a number) as the sandbox names its clients."""
    numbers = numbers_by_key(ws.data_dir)
    sampled = [numbers[k] for k in report["sampled_clients"]]
    differed = {numbers[k]: tables for k, tables in report["differed"].items()}
    return {**report, "sampled": sampled, "differed": dict(sorted(differed.items()))}


def queued(ws: Workspace) -> list[str]:
    """The re-sync queue's clients (it holds keys) as numbers."""
    numbers = numbers_by_key(ws.data_dir)
    return sorted(numbers[k] for k in A.read_queue(ws.data_dir))


def synced_on(ws: Workspace, night: dt.date) -> set[str]:

    return set(synced_numbers(ws.data_dir, night))


def expected_findings(changes: dict[str, SilentChange], clients: set[str]) -> dict[str, dict[str, list[str]]]:
    """What the audit must report for ``clients``: each silently changed one, with the one table
    and key the sandbox says it changed; nothing for any other client."""
    expected: dict[str, dict[str, list[str]]] = {}
    for number, change in sorted(changes.items()):
        if number in clients:
            table, key = finding(change)
            expected[number] = {table: [key]}
    return expected


def relisted(ws: Workspace, stamps: dict[str, dt.datetime], night: dt.date) -> set[str]:
    """Clients the next night lists although unchanged: ``lastModified`` within the discovery's
    safety overlap (15 minutes) of the night's watermark."""
    manifest = read_manifest(ws.data_dir.manifests, night)
    assert manifest is not None and manifest.watermark
    since = dt.datetime.fromisoformat(manifest.watermark.replace("Z", "+00:00")) - dt.timedelta(minutes=15)
    return {n for n, stamp in stamps.items() if stamp >= since}


def touch_clients(sandbox: RunningSandbox, numbers: list[str]) -> None:
    """Ordinary changes (``lastModified`` bumped): these clients are synced by the next night."""

    def write(service: Any) -> None:
        for number in numbers:
            service.update_comm_prefs(
                {"clientNumber": number, "sms": not service.clients[number].comm_prefs["sms"]}
            )

    sandbox.call(write)


# --- one silent change of every kind, against one committed night (module-scoped) -----------------


EveryKind = tuple[Workspace, dict[str, SilentChange]]


@pytest.fixture(scope="module")
def every_kind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EveryKind]:
    """A sandbox synced by one (full) night, then 18 clients changed silently: every kind of
    silent change (seed 3), each client by one. The audits below run in this process (so a test
    can patch :mod:`membersync.flows.night.audit`) and write nothing: the tests share it."""
    sandbox = start_in_thread(SandboxConfig.checked(clients=60, stores=3, seed=17, anchor_date=ANCHOR))
    try:
        ws = make_workspace(tmp_path_factory.mktemp("every-kind"), sandbox)
        sync(ws, NIGHT1)
        changes = sandbox.call(lambda s: change_silently(s, 18, seed=3))
        assert {c.kind for c in changes.values()} == set(KINDS)
        yield ws, changes
    finally:
        sandbox.stop()


def audit_here(ws: Workspace, numbers: list[str]) -> dict[str, dict[str, list[str]]]:
    """The audit of ``numbers`` (as ``membersync audit`` runs it, in this process): number ->
    table -> row keys of the clients that differ."""
    config = Settings.load(ws.env())
    holdings = A.read_holdings(LandingZone(ws.data_dir))
    keys = holdings.keys
    sample = sorted(keys[n] for n in numbers)
    options = SyncOptions.from_settings(config)
    settings = ServiceSettings.from_settings(config)
    result = asyncio.run(_audit(settings, options, ws.data_dir, holdings, sample))
    numbers_of = {k: n for n, k in keys.items()}
    return {numbers_of[k]: tables for k, tables in sorted(result.differed.items())}


def unchanged_too(ws: Workspace, changes: dict[str, SilentChange]) -> list[str]:
    """The changed clients and four unchanged ones (a false positive would show)."""
    others = sorted(set(synced_numbers(ws.data_dir, NIGHT1)) - set(changes))[:4]
    return sorted([*changes, *others])


def test_every_kind_of_silent_change_is_found_in_its_own_table_and_no_other(
    every_kind: EveryKind,
) -> None:
    ws, changes = every_kind
    found = audit_here(ws, unchanged_too(ws, changes))
    assert found == expected_findings(changes, set(changes))
    assert {t for by_table in found.values() for t in by_table} == set(A.COMPARED)


# The audited tables, as this file knows them (not read from flows.audit: a table dropped there
# must fail here). Personal fields (client_identity) are compared beside them, not as one.
AUDITED = sorted(t for t in TABLE_OF_KIND.values() if t != A.IDENTITY)


@pytest.mark.parametrize("table", AUDITED)
def test_every_audited_table_is_needed_to_find_its_kind_of_silent_change(
    every_kind: EveryKind, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Case: the audit without ``table`` misses exactly the silent changes that land in it (those
    clients differ nowhere else) and still finds every other one: the table is what finds them."""
    ws, changes = every_kind
    assert table in A.AUDITED_TABLES, f"{table} is not audited: its silent changes go unnoticed"
    monkeypatch.setattr(A, "AUDITED_TABLES", tuple(t for t in A.AUDITED_TABLES if t != table))
    monkeypatch.setattr(A, "COMPARED", tuple(t for t in A.COMPARED if t != table))
    hidden = {n for n, c in changes.items() if TABLE_OF_KIND[c.kind] == table}
    assert hidden, f"no silent change lands in {table}"
    found = audit_here(ws, unchanged_too(ws, changes))
    assert found == expected_findings(changes, set(changes) - hidden)


@pytest.mark.slow
def test_silent_changes_are_found_by_the_nightly_audit_and_by_audit_all_then_healed(
    fresh_sandbox: Callable[..., RunningSandbox], tmp_path: Path
) -> None:
    """Case: 30 clients changed silently after a committed night (issue 9's must-show), every kind
    of silent change among them: seed 5 gives each of the 12 kinds 2 or 3 clients, and the
    on-demand audit of every client finds each kind (in its own table) at least once."""
    sandbox = fresh_sandbox(clients=200, stores=5, seed=11, anchor_date=ANCHOR)
    ws = make_workspace(tmp_path, sandbox, MEMBERSYNC_AUDIT_SHARE="0.25")
    first = sync(ws, NIGHT1)
    assert first.summary_value("self-audit") == "not run (full night)"
    truth.assert_night_exact(sandbox, ws.data_dir, NIGHT1)

    stamps = sandbox.call(lambda s: {n: c.last_modified for n, c in s.clients.items()})
    changes = sandbox.call(lambda s: change_silently(s, 30, seed=5))
    assert len(changes) == 30 and {c.kind for c in changes.values()} == set(TABLE_OF_KIND) == set(KINDS)
    assert sandbox.call(lambda s: {n: c.last_modified for n, c in s.clients.items()}) == stamps  # silent
    # Ordinary changes too: two of them to silently changed clients, whom tonight syncs anyway.
    touched = sorted(changes)[:2] + [n for n in sorted(stamps) if n not in changes][:3]
    touch_clients(sandbox, touched)

    # Night 2 (incremental): its audit samples clients it did not sync and finds exactly the
    # silently changed ones among them.
    second = sync(ws, NIGHT2)
    assert second.summary_value("mode") == "incremental"
    tonight = synced_on(ws, NIGHT2)
    assert tonight == set(touched) | relisted(ws, stamps, NIGHT1)
    report = audit_report(ws, NIGHT2.isoformat())
    sampled = set(report["sampled"])
    assert len(sampled) == 50 and not sampled & tonight and sampled <= set(stamps)  # 25% of 200
    expected = expected_findings(changes, sampled)
    assert expected, "the sample should hold some of the 30 (seeded): else this test checks nothing"
    assert report["differed"] == expected
    assert second.summary_value("self-audit: clients sampled") == "50"
    assert second.summary_value("self-audit: clients differed") == str(len(expected))
    stats = read_manifest(ws.data_dir.manifests, NIGHT2).stats["audit"]  # type: ignore[union-attr]
    assert (stats["sampled"], stats["differed"]) == (50, len(expected))
    assert queued(ws) == sorted(expected)
    with pytest.raises(truth.ReportMismatch):  # the silent changes are not in the reports yet
        truth.assert_night_exact(sandbox, ws.data_dir, NIGHT2)

    # On demand, every client: exit 1, every unsynced silent change found, no false positive.
    every = ws.sync(["audit", "--clients", "all"])
    assert every.status == 1, every.describe()
    unsynced = set(changes) - tonight
    assert {changes[n].kind for n in unsynced} == set(KINDS)  # every kind is found below, not only some
    on_demand = on_demand_report(ws, every)
    assert set(on_demand["sampled"]) == set(stamps)
    assert on_demand["differed"] == expected_findings(changes, unsynced)
    assert set(queued(ws)) == unsynced

    # Night 3 heals: the queued clients are synced in full, the queue empties, reports are exact.
    assert len(unsynced) >= 25  # the overlap re-lists few unchanged clients: most still need healing
    stamps = sandbox.call(lambda s: {n: c.last_modified for n, c in s.clients.items()})
    third = sync(ws, NIGHT3)
    assert synced_on(ws, NIGHT3) == unsynced | relisted(ws, stamps, NIGHT2)
    assert A.read_queue(ws.data_dir) == {}
    assert third.summary_value("self-audit: clients differed") == "0"
    truth.assert_night_exact(sandbox, ws.data_dir, NIGHT3)
    clean = ws.sync(["audit", "--clients", "all"])
    assert clean.status == 0, clean.describe()
    assert on_demand_report(ws, clean)["differed"] == {}


@pytest.mark.slow
def test_no_silent_change_means_no_difference_even_with_drift_and_store_local_times(
    fresh_sandbox: Callable[..., RunningSandbox], tmp_path: Path
) -> None:
    """Case: no false positives. Drift (numbers as strings, re-cased enums, unannounced fields),
    offsets on store times, ledgers stamped with the day they are read (the audit a day after
    the first fetch: the server's clock moved on), and a later night all differ in form from the
    first fetch but not in substance."""
    sandbox = fresh_sandbox(clients=120, stores=4, seed=23, anchor_date=ANCHOR, drift=True)
    ws = make_workspace(tmp_path, sandbox, MEMBERSYNC_AUDIT_SHARE="1")
    sync(ws, NIGHT1)
    tomorrow = dt.timedelta(days=1)
    sandbox.call(lambda s: setattr(s, "clock", lambda: dt.datetime.now(dt.UTC) + tomorrow))
    touch_clients(sandbox, sandbox.call(lambda s: sorted(s.clients)[:4]))
    second = sync(ws, NIGHT2)
    report = audit_report(ws, NIGHT2.isoformat())
    unsynced = set(sandbox.call(lambda s: list(s.clients))) - synced_on(ws, NIGHT2)
    assert len(unsynced) >= 100 and set(report["sampled"]) == unsynced  # every unsynced client
    assert report["differed"] == {}
    assert second.summary_value("self-audit: clients differed") == "0"
    assert A.read_queue(ws.data_dir) == {}
    every = ws.sync(["audit", "--clients", "all"])
    assert every.status == 0, every.describe()
    assert len(on_demand_report(ws, every)["sampled"]) == 120


@pytest.mark.slow
def test_heal_now_syncs_the_differing_clients_in_the_same_night(
    fresh_sandbox: Callable[..., RunningSandbox], tmp_path: Path
) -> None:
    """Case: MEMBERSYNC_AUDIT_HEAL=now, every unsynced client audited: the night itself heals."""
    sandbox = fresh_sandbox(clients=100, stores=4, seed=31, anchor_date=ANCHOR)
    ws = make_workspace(tmp_path, sandbox, MEMBERSYNC_AUDIT_SHARE="1", MEMBERSYNC_AUDIT_HEAL="now")
    sync(ws, NIGHT1)
    stamps = sandbox.call(lambda s: {n: c.last_modified for n, c in s.clients.items()})
    changes = sandbox.call(lambda s: change_silently(s, 12, seed=8))
    second = sync(ws, NIGHT2)
    listed = relisted(ws, stamps, NIGHT1)
    found = set(changes) - listed
    assert len(found) >= 10
    assert audit_report(ws, NIGHT2.isoformat())["differed"] == expected_findings(changes, found)
    assert synced_on(ws, NIGHT2) == listed | found  # discovered, plus the healed ones
    assert second.summary_value("self-audit: clients re-synced tonight") == str(len(found))
    assert A.read_queue(ws.data_dir) == {}
    truth.assert_night_exact(sandbox, ws.data_dir, NIGHT2)


def test_audit_command_bad_input_is_one_line_exit_2(sandbox: RunningSandbox, tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, sandbox)
    for argv, says in (
        (["audit", "--clients", "none"], "--clients"),
        (["audit"], "no committed night"),  # nothing synced yet: nothing to compare with
    ):
        outcome = ws.sync(argv)
        assert outcome.status == 2, outcome.describe()
        lines = outcome.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], outcome.stderr


@pytest.mark.prefect
def test_prefect_runs_the_audit_as_its_own_task_and_its_artifact_names_the_keys(
    prefect_harness: Path,  # noqa: F811
    fresh_sandbox: Callable[..., RunningSandbox],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Case: the flow's self-audit task; the artifact lists clients, tables and keys, no value."""
    import asyncio

    from membersync.flows.night.prefect_flow import SUMMARY_ARTIFACT_KEY, nightly_sync
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterKey,
        FlowRunFilter,
        FlowRunFilterId,
    )

    sandbox = fresh_sandbox(clients=60, stores=3, seed=41, anchor_date=ANCHOR)
    ws = make_workspace(tmp_path, sandbox, MEMBERSYNC_AUDIT_SHARE="1", MEMBERSYNC_BUILD="off")
    for key, value in ws.env().items():
        if key.startswith("MEMBERSYNC_"):
            monkeypatch.setenv(key, value)
    first = asyncio.run(nightly_sync(night=NIGHT1, return_state=True))
    assert first.is_completed(), first
    stamps = sandbox.call(lambda s: {n: c.last_modified for n, c in s.clients.items()})
    changes = sandbox.call(lambda s: change_silently(s, 4, seed=2))
    state = asyncio.run(nightly_sync(night=NIGHT2, return_state=True))
    assert state.is_completed(), state
    found = set(changes) - relisted(ws, stamps, NIGHT1)
    assert found and state.result()["audit_counts"]["differed"] == len(found)

    async def inspect() -> tuple[list[Any], list[Any]]:
        async with get_client() as client:
            runs = FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
            tasks = await client.read_task_runs(flow_run_filter=runs)
            artifacts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[SUMMARY_ARTIFACT_KEY])),
                flow_run_filter=runs,
            )
            return tasks, artifacts

    tasks, artifacts = asyncio.run(inspect())
    assert sum(t.name.startswith("self-audit-") for t in tasks) == 1  # its own task run
    rows = {row["item"]: row["value"] for row in json.loads(artifacts[0].data)}
    keys = {n: k for k, n in numbers_by_key(ws.data_dir).items()}
    for number in found:  # the artifact names clients by key, never by number
        change, item = changes[number], f"self-audit differed: client {keys[number]}"
        table, key = finding(change)
        assert rows[item] == f"{table}: {key}"
    assert sum(item.startswith("self-audit differed: ") for item in rows) == len(found)  # nobody else
    assert rows["self-audit: clients differed"] == str(len(found))
