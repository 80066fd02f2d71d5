"""Issue 59: privacy that fails closed. Each case of the issue, tried as an attacker would, is a
test named for it (``test_case_<n>_...``), black-box through the ``membersync`` command where it
can be: the sandbox on loopback, real nights, real DuckDB, moto's S3 server with versioning on.

Canary clients (:mod:`canaries`) carry values no generated client has; alpha's identity is also
planted where a vendor may put it beyond the contract (nested fields, another client's records,
text staff type). :mod:`privacy_scan` reads every byte as a reader would. What the fix added
(the reader's folders, the mask's marker, the places) is imported inside the tests that use it,
so the module also runs against the code before the fix (each test then fails on its own case).
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from canaries import IDENTITIES, add_canaries, plant_identity_elsewhere
from membersync.extract.sandbox.running import RunningSandbox, start_in_thread
from membersync.extract.sandbox.server import SandboxConfig
from membersync.models import tables as T
from membersync.models.privacy import land_quarantine
from membersync.warehouse.landing.identity import ClientKeys
from membersync.warehouse.landing.paths import DataDir
from privacy_scan import Canary, scan_files, texts_of
from reliability import ANCHOR, Workspace

NIGHT1, NIGHT2 = ANCHOR - dt.timedelta(days=1), ANCHOR


@pytest.fixture(scope="module")
def base(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[RunningSandbox, dict[str, Canary], Path]]:
    """One night of a small chain whose alpha is named beyond the contract (a local data dir)."""
    sandbox = start_in_thread(SandboxConfig(clients=30, stores=2, seed=59, anchor_date=ANCHOR))
    try:
        canaries = add_canaries(sandbox)
        plant_identity_elsewhere(sandbox, canaries)
        sandbox.call(lambda service: make_dateless(service, canaries["beta"].number))
        ws = Workspace(tmp_path_factory.mktemp("attacks") / "base", sandbox.url, NIGHT1, batch_size=10)
        outcome = ws.sync(ws.argv(NIGHT1))
        assert outcome.ok, outcome.describe()
        yield sandbox, canaries, ws.root
    finally:
        sandbox.stop()


def make_dateless(service: Any, number: str) -> None:
    """A client the service knows nothing dated of: no created date, no sale, no membership."""
    client = service.clients[number]
    client.created_date = None
    client.transactions.clear()
    service.transactions = {r: t for r, t in service.transactions.items() if t.client_number != number}


def workspace(base: tuple[RunningSandbox, dict[str, Canary], Path], tmp_path: Path, **env: str) -> Workspace:
    """A copy of the base night's data dir (its catalogs name absolute paths: the copy builds its own)."""
    sandbox, _, root = base
    ws = Workspace(tmp_path / "ws", sandbox.url, NIGHT1, batch_size=10, extra_env=env)
    shutil.copytree(root / "data", ws.data_dir.root)
    for stale in (ws.data_dir.warehouse_db, ws.data_dir.identified_db):
        stale.unlink()
    shutil.rmtree(ws.data_dir.root / "warehouse")
    return ws


def with_key(ws: Workspace, tmp_path: Path) -> Workspace:
    ws.extra_env["MEMBERSYNC_ERASURE_KEY_FILE"] = str(tmp_path / "keys" / "erasure.key")
    return ws


def run(ws: Workspace, *argv: str, **env: str) -> Any:
    return ws.sync(list(argv), env=ws.env(**env))


def one_line_error(outcome: Any, code: int, *fragments: str) -> str:
    """The outcome is exit ``code`` with one line on stderr holding every fragment."""
    lines = [line for line in outcome.stderr.splitlines() if line.strip()]
    assert outcome.status == code, outcome.describe()
    assert len(lines) == 1, f"one line expected, got {lines}"
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    return lines[0]


def alpha_values() -> list[str]:
    alpha = IDENTITIES["alpha"]
    return [
        alpha["firstName"],
        alpha["lastName"],
        alpha["email"],
        alpha["phone"],
        alpha["phone"].replace("-", " "),
    ]


def analyst_places(data_dir: DataDir) -> list[Path]:
    """What an analyst may read, as the docs' grant list says (written out here, not read from
    the code): the analyst catalog, the parts, every landed table of the analyst tier, quarantine."""
    tables = [data_dir.landing / t.name for t in T.LANDED if t.tier == "analyst"]
    paths = [
        data_dir.warehouse_db,
        data_dir.root / "warehouse" / "parts",
        *tables,
        data_dir.landing / "_quarantine",
    ]
    return [p for p in paths if p.exists()]


def hits_in(paths: list[Path], canary: Canary) -> list[str]:
    """The files among ``paths`` (folders scanned whole) that hold one of the canary's values."""
    found = scan_files([p for p in paths if p.is_dir()], [canary])[canary.number]
    for path in (p for p in paths if p.is_file()):
        if any(p.search(t) for t in texts_of(path) for p in canary.patterns()):
            found.append(str(path))
    return found


# --- case 1: the analyst tier is a boundary ---------------------------------------------------------

IDENTITY_FILES = "{data}/landing/client_identity/**/*.parquet"
ESCAPES = {
    "read_parquet of the identity files": f"SELECT count(*) FROM read_parquet('{IDENTITY_FILES}')",
    "a path that climbs out of an analyst folder": (
        "SELECT * FROM read_parquet('{data}/landing/clients/../client_identity/**/*.parquet')"
    ),
    "ATTACH of the identified catalog": "ATTACH '{data}/identified.duckdb' AS x",
    "read_text of the erasure key": "SELECT * FROM read_text('{key}')",
    "COPY TO a file": "COPY (SELECT 1) TO '{data}/out.csv'",
    "COPY TO inside an analyst folder": "COPY (SELECT 1) TO '{data}/landing/clients/x.parquet'",
    "switching file access back on": "SET enable_external_access = true",
    "read_csv of the sync state": "SELECT * FROM read_csv('{data}/state/state.json')",
    "a second statement after a read": "SELECT 1; COPY (SELECT 1) TO '{data}/out.csv'",
    "glob of the data dir": "SELECT * FROM glob('{data}/**')",
}


@pytest.fixture(scope="module")
def built(
    base: tuple[RunningSandbox, dict[str, Canary], Path], tmp_path_factory: pytest.TempPathFactory
) -> Workspace:
    tmp = tmp_path_factory.mktemp("built")
    ws = with_key(workspace(base, tmp), tmp)
    outcome = run(ws, "reports")
    assert outcome.ok, outcome.describe()
    return ws


@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_case_1_the_analyst_prompt_refuses_every_way_out_of_its_tier(built: Workspace, escape: str) -> None:
    """Case 1: from `membersync sql`, each escape is one line and exit 2, and nothing is written."""
    key = Path(built.env()["MEMBERSYNC_ERASURE_KEY_FILE"])
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_text("00" * 32)
    query = ESCAPES[escape].format(data=built.data_dir.root, key=key)
    outcome = run(built, "sql", query)
    line = one_line_error(outcome, 2)
    assert line.startswith("error: SQL"), line
    assert not (built.data_dir.root / "out.csv").exists()
    assert not (built.data_dir.landing / "clients" / "x.parquet").exists()


def test_case_1_an_ordinary_analyst_query_still_works(built: Workspace) -> None:
    """Case 1, the control: a report, a mart, the landing views and EXPLAIN answer as before."""
    for query in (
        "SELECT count(*) AS n FROM reports.outstanding_balances_by_store",
        "SELECT count(*) AS n FROM marts.current_clients",
        "SELECT count(*) AS n FROM landing.points_transactions",
        "EXPLAIN SELECT * FROM marts.current_memberships",
    ):
        outcome = run(built, "sql", "--csv", query)
        assert outcome.status == 0, outcome.describe()


def test_case_1_a_bi_tool_given_the_reader_setup_is_held_to_the_same_folders(built: Workspace) -> None:
    """Case 1, BI tools: a DuckDB connection that runs what `--reader-setup` prints reads the
    reports and cannot read the identity, nor undo the setup."""
    from membersync.warehouse.build.catalog import reader_settings

    outcome = run(built, "sql", "--reader-setup")
    assert outcome.status == 0, outcome.describe()
    statements = [
        line.rstrip(";") for line in outcome.stdout.splitlines() if line and not line.startswith("--")
    ]
    assert statements == reader_settings(built.data_dir, "analyst")
    con = duckdb.connect(str(built.data_dir.warehouse_db), read_only=True)
    try:
        for statement in statements:
            con.execute(statement)
        assert con.execute("SELECT count(*) FROM reports.outstanding_balances_by_store").fetchone()
        identity = built.data_dir.landing / "client_identity"
        with pytest.raises(duckdb.PermissionException):
            con.execute(f"SELECT * FROM read_parquet('{identity}/**/*.parquet')")
        with pytest.raises(duckdb.Error):
            con.execute("SET enable_external_access = true")
    finally:
        con.close()


def test_case_11_every_folder_a_reader_may_read_is_declared_analyst() -> None:
    """Case 11: the reader's folders and the documented grant list are one declaration."""
    from membersync.warehouse.build.catalog import reader_directories
    from membersync.warehouse.landing.paths import PLACES

    data_dir = DataDir(Path("/data"))
    analyst = {p.path for p in PLACES if p.tier == "analyst"}
    for folder in reader_directories(data_dir, "analyst"):
        relative = folder.removeprefix("/data/")
        table = relative.removeprefix("landing/").rstrip("/")
        declared = relative in analyst or (
            relative.startswith("landing/") and table in {t.name for t in T.LANDED if t.tier == "analyst"}
        )
        assert declared, f"{relative} is read by the analyst tier but not declared analyst in PLACES"
    assert "landing/client_identity/" not in {
        f.removeprefix("/data/") for f in reader_directories(data_dir, "analyst")
    }
    assert {p.path for p in PLACES if p.tier == "identified"} >= {
        "landing/_staging/",
        "landing/_shards/",
        "logs/",
        "state/",
        "reports/",
    }


# --- case 2: a lost erasure key ------------------------------------------------------------------


def forget(ws: Workspace, *numbers: str, **env: str) -> Any:
    return run(ws, "forget", *numbers, "--reason", "test", **env)


def test_case_2_a_lost_or_other_key_is_refused_once_the_register_has_an_erasure(
    base: tuple[RunningSandbox, dict[str, Canary], Path], tmp_path: Path
) -> None:
    """Case 2: after one erasure, a forget or a night with the key missing (another HOME) or
    another key exits 2 naming MEMBERSYNC_ERASURE_KEY_FILE, makes no key, and lands nothing."""
    _, canaries, _ = base
    ws = with_key(workspace(base, tmp_path), tmp_path)
    assert forget(ws, canaries["alpha"].number).status == 0
    manifests = sorted(p.read_bytes() for p in ws.data_dir.manifests.glob("*.json"))

    home = tmp_path / "elsewhere"
    lost = {"MEMBERSYNC_ERASURE_KEY_FILE": "", "HOME": str(home), "XDG_CONFIG_HOME": ""}
    one_line_error(
        forget(ws, canaries["control"].number, **lost), 2, "MEMBERSYNC_ERASURE_KEY_FILE", "missing"
    )
    assert not home.exists() or not any(home.rglob("*.key")), "a new key was made"
    one_line_error(run(ws, "audit", "--clients", "all", **lost), 2, "MEMBERSYNC_ERASURE_KEY_FILE")

    other = tmp_path / "other.key"
    other.write_text("ab" * 32)
    one_line_error(
        forget(ws, canaries["control"].number, MEMBERSYNC_ERASURE_KEY_FILE=str(other)),
        2,
        "MEMBERSYNC_ERASURE_KEY_FILE",
        "not the key",
    )
    night = run(ws, *ws.argv(NIGHT2, full=True), MEMBERSYNC_ERASURE_KEY_FILE=str(other))
    one_line_error(night, 2, "MEMBERSYNC_ERASURE_KEY_FILE")
    assert sorted(p.read_bytes() for p in ws.data_dir.manifests.glob("*.json")) == manifests, "a night landed"


# --- case 3: a number that does not match ---------------------------------------------------------


def test_case_3_a_number_typed_without_its_zeros_is_refused_naming_the_held_one(
    base: tuple[RunningSandbox, dict[str, Canary], Path], tmp_path: Path
) -> None:
    """Case 3: `forget 417` for client 000417 exits 2 naming 000417 and changes nothing; a number
    never seen is refused too, and forgotten as given only with --exact."""
    _, canaries, _ = base
    ws = with_key(workspace(base, tmp_path), tmp_path)
    held = canaries["alpha"].number
    short = held.lstrip("0")
    assert short != held, "the sandbox's client numbers have leading zeros"
    one_line_error(forget(ws, short), 2, repr(short), repr(held), "not held")
    assert not (ws.data_dir.root / "privacy" / "erasures.json").exists(), "nothing may be recorded"
    one_line_error(forget(ws, "990001"), 2, "'990001'", "--exact")
    done = run(ws, "forget", "990001", "--exact", "--reason", "test")
    assert done.status == 0, done.describe()
    assert "1 never held" in done.stdout


# --- case 4: identity beyond the contract --------------------------------------------------------


def test_case_4_identity_nested_elsewhere_or_in_free_text_never_reaches_analysts(
    built: Workspace, base: tuple[RunningSandbox, dict[str, Canary], Path]
) -> None:
    """Case 4: alpha named in an emergency contact, an account holder, another client's payer
    and household, a points reason and a sale line: none of it is in what an analyst can read;
    the identified tier still has alpha (the positive control), and the masked texts say so."""
    from membersync.models.mask import MASKED

    _, canaries, _ = base
    alpha = Canary(canaries["alpha"].number, tuple(alpha_values()))
    assert hits_in(analyst_places(built.data_dir), alpha) == []
    assert scan_files([built.data_dir.landing / "client_identity"], [alpha])[alpha.number]
    con = duckdb.connect(str(built.data_dir.warehouse_db), read_only=True)
    try:
        reasons = [r for (r,) in con.execute("SELECT reason FROM landing.points_transactions").fetchall()]
        lines = [d for (d,) in con.execute("SELECT description FROM landing.transaction_lines").fetchall()]
    finally:
        con.close()
    assert f"referral bonus: {MASKED} {MASKED} <{MASKED}>" in reasons
    assert f"Gift for {MASKED}, call {MASKED}" in lines


def test_case_4_forget_removes_a_client_from_every_record_that_names_them(
    base: tuple[RunningSandbox, dict[str, Canary], Path], tmp_path: Path
) -> None:
    """Case 4, then forget: no byte under the data dir names alpha (their own record's nested
    fields, the household member on control's record); control is still found everywhere."""
    _, canaries, _ = base
    ws = with_key(workspace(base, tmp_path), tmp_path)
    outcome = forget(ws, canaries["alpha"].number)
    assert outcome.status == 0, outcome.describe()
    alpha = Canary(canaries["alpha"].number, tuple(alpha_values()))
    assert scan_files([ws.data_dir.root], [alpha])[alpha.number] == []
    assert scan_files([ws.data_dir.root], [canaries["control"]])[canaries["control"].number]


# --- case 5: quarantine --------------------------------------------------------------------------


def test_case_5_a_quarantined_person_record_that_is_no_record_keeps_no_value() -> None:
    """Case 5: a client payload that is a string or a list, and a reason about a bad value,
    land with no value of it (the raw JSON withheld, the reason naming only the kind)."""
    from membersync.models.coerce import to_arrow

    keys = ClientKeys({}, {}, {}, b"s" * 16, None)
    secret_name = "Quenbyalpha Zephyrcanary"
    bad = to_arrow("clients", [secret_name, [secret_name, "555-0142-9931"]], {"clientNumber": "000417"})
    typed = to_arrow(
        "clients", [{"clientNumber": "000417", "birthDate": 12345, "firstName": secret_name}], {}
    )
    rows = [*bad.quarantine, *typed.quarantine]
    quarantine = pa.Table.from_pylist(
        [
            {"table_name": r.table_name, "client_number": r.client_number, "reason": r.reason, "raw": r.raw}
            for r in rows
        ],
        schema=T.TYPED_QUARANTINE_SCHEMA,
    )
    landed = land_quarantine(quarantine, keys)
    text = json.dumps(landed.to_pylist())
    assert landed.num_rows == 3
    for value in ("Quenbyalpha", "Zephyrcanary", "555-0142-9931", "000417", "12345"):
        assert value not in text, f"{value} landed in the quarantine: {text}"


# --- case 8: reports without a catalog -----------------------------------------------------------


def test_case_8_forget_on_a_machine_without_a_warehouse_still_writes_the_reports_again(
    base: tuple[RunningSandbox, dict[str, Canary], Path], tmp_path: Path
) -> None:
    """Case 8: the catalogs are missing (a migrated layout, a machine that never built): forget
    builds them, writes the reports again, and no report names the client."""
    _, canaries, _ = base
    ws = with_key(workspace(base, tmp_path), tmp_path)
    assert not ws.data_dir.identified_db.exists()
    alpha = canaries["alpha"]
    assert scan_files([ws.data_dir.reports], [alpha])[alpha.number], "the reports named alpha"
    outcome = forget(ws, alpha.number)
    assert outcome.status == 0, outcome.describe()
    assert scan_files([ws.data_dir.reports], [alpha])[alpha.number] == []
    assert NIGHT1.isoformat() in outcome.stdout


# --- case 10: retention's clock ----------------------------------------------------------------


def test_case_10_retention_refuses_while_the_newest_night_is_in_the_future(
    base: tuple[RunningSandbox, dict[str, Canary], Path], tmp_path: Path
) -> None:
    """Case 10: one night dated wrongly in the future would count every horizon from it:
    retention exits 1 with one line and removes nothing."""
    ws = with_key(workspace(base, tmp_path), tmp_path)
    manifest = next(ws.data_dir.manifests.glob("*.json"))
    body = json.loads(manifest.read_text())
    future = (dt.date.today() + dt.timedelta(days=400)).isoformat()
    body["snapshot_date"] = future  # the night's files, committed under a date a bad clock gave
    (ws.data_dir.manifests / f"{future}.json").write_text(json.dumps(body))
    manifest.unlink()
    before = sorted(p.name for p in ws.data_dir.manifests.glob("*.json"))
    outcome = run(ws, "retention", MEMBERSYNC_RETENTION="daily=30d,monthly=1y,identity=30d")
    one_line_error(outcome, 1, "retention refused", future)
    assert sorted(p.name for p in ws.data_dir.manifests.glob("*.json")) == before


def test_case_10_a_client_with_no_dates_counts_from_their_record_not_from_ever(
    built: Workspace, base: tuple[RunningSandbox, dict[str, Canary], Path]
) -> None:
    """Case 10: a client with no created date and no dated event is not inactive "since the year
    1" (forgotten at once by any identity horizon): their last activity is the night their record
    was fetched."""
    _, canaries, _ = base
    number = canaries["beta"].number
    key = run(
        built,
        "sql",
        "--identified",
        "--csv",
        f"SELECT client_key FROM identity.clients WHERE client_number = '{number}'",
    )
    assert key.status == 0, key.describe()
    client_key = key.stdout.splitlines()[1]
    outcome = run(
        built,
        "sql",
        "--csv",
        f"SELECT last_activity_date FROM marts.client_activity WHERE client_key = '{client_key}'",
    )
    assert outcome.status == 0, outcome.describe()
    assert outcome.stdout.splitlines()[1:] == [NIGHT1.isoformat()]


# --- case 12: the build's guard -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "sql", "check"),
    [
        (
            "leak_identity",
            "select client_key, first_name from {{ source('landing', 'client_identity') }}",
            "tier",
        ),
        (
            "leak_part",
            "{{ config(materialized='scratch_table') }}\nselect client_key, birth_year "
            "from {{ source('landing', 'client_demographics') }}",
            "personal",
        ),
    ],
)
def test_case_12_the_build_refuses_a_model_declared_in_the_wrong_tier(
    built: Workspace, tmp_path: Path, model: str, sql: str, check: str
) -> None:
    """Case 12: an analyst model reading the identity, and a stored part carrying per-person
    data, each fail the build naming the model; nothing is published."""
    from membersync.warehouse.build.builder import build_warehouse
    from membersync.warehouse.build.dbt_run import SQL_DIR
    from membersync.warehouse.build.errors import BuildCheckError

    project = tmp_path / "sql"
    shutil.copytree(SQL_DIR, project, ignore=shutil.ignore_patterns("target", "logs", "dbt_packages"))
    (project / "marts" / f"{model}.sql").write_text(sql + "\n")
    storage = "nightly" if check == "personal" else "view"
    (project / "marts" / f"_{model}.yml").write_text(
        "version: 2\nmodels:\n"
        f"- name: {model}\n  config:\n    schema: marts\n    meta:\n      storage: {storage}\n"
        "      key: [client_key]\n"
    )
    before = built.data_dir.warehouse_db.read_bytes()
    with pytest.raises(BuildCheckError) as caught:
        build_warehouse(built.data_dir, sql_dir=project, full_refresh=True)
    assert model in str(caught.value) and check in str(caught.value), str(caught.value)
    assert built.data_dir.warehouse_db.read_bytes() == before


# --- case 9: what a failed night leaves -------------------------------------------------------------


@pytest.mark.prefect
def test_case_9_a_vendor_error_naming_a_client_reaches_no_log_notification_or_prefect_record(
    fresh_sandbox: Any, tmp_path: Path, receiver: Any
) -> None:
    """Case 9: the vendor refuses one client's read in words that name them (a 400, so the
    night fails); Prefect on, failures notified. The log, PREFECT_HOME and the notification say
    the night failed and why, but hold none of the client's values."""
    sandbox = fresh_sandbox(clients=20, stores=2, seed=91, anchor_date=ANCHOR)
    canaries = add_canaries(sandbox)
    alpha = IDENTITIES["alpha"]
    words = f"client {alpha['firstName']} {alpha['lastName']} <{alpha['email']}> is archived"

    def refuse(service: Any) -> None:
        service.tenant_refusals[("ledgerbalance", canaries["alpha"].number)] = (400, "archived_client", words)

    sandbox.call(refuse)
    ws = Workspace(
        tmp_path / "ws",
        sandbox.url,
        NIGHT1,
        batch_size=10,
        extra_env={"MEMBERSYNC_PREFECT": "on", "MEMBERSYNC_NOTIFY": receiver.url()},
    )
    outcome = ws.sync(ws.argv(NIGHT1))
    assert outcome.status == 1, outcome.describe()
    assert "archived" in outcome.stderr, "the vendor's reason is still told"
    named = Canary(canaries["alpha"].number, tuple(alpha_values()))
    assert scan_files([ws.data_dir.logs, ws.prefect_home], [named])[named.number] == []
    bodies = " ".join(r.raw.decode() for r in receiver.got)
    assert receiver.got and "archived" in bodies
    for value in alpha_values():
        assert value.lower() not in bodies.lower(), f"{value} notified"
    assert "archived" in " ".join(p.read_text() for p in ws.data_dir.logs.glob("*.log"))


# --- cases 6 and 7: a bucket several machines share ------------------------------------------------


def versioned(name: str) -> str:
    from conftest import BUCKET
    from privacy_scan import s3_client

    s3_client().put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    return f"s3://{BUCKET}/{name}-{time.monotonic_ns()}"


def machine(root: Path, sandbox: RunningSandbox, location: str, aws: dict[str, str], key: Path) -> Workspace:
    """A machine of its own on ``location``: its own working dir, the one erasure key."""
    env = {
        **aws,
        "MEMBERSYNC_DATA_DIR": location,
        "MEMBERSYNC_CACHE_DIR": str(root / "work"),
        "MEMBERSYNC_ERASURE_KEY_FILE": str(key),
    }
    return Workspace(root, sandbox.url, NIGHT1, batch_size=10, extra_env=env)


def test_case_6_a_shard_area_goes_with_every_version_of_every_object(
    aws_env: dict[str, str], tmp_path: Path
) -> None:
    """Case 6: a sharded night's area in a versioned bucket (raw numbers and names) is removed
    for good: no version of any of its objects is left."""
    from conftest import BUCKET
    from membersync.warehouse.landing.shard_area import ShardArea
    from privacy_scan import object_versions, s3_client

    location = versioned("shards")
    data_dir = DataDir.remote_location(location, str(tmp_path / "work"))
    area = ShardArea(data_dir, NIGHT1, "run1")
    batch = pa.table({"client_number": ["000417"], "first_name": ["Quenbyalpha"]})
    area.write_batch("00000", {"clients": batch}, None, ["000417"])
    area.write_batch("00000", {"clients": batch}, None, ["000417"])  # a second version of each
    prefix = location.removeprefix(f"s3://{BUCKET}/")
    assert len(object_versions(s3_client(), BUCKET, prefix)) >= 4
    area.remove()
    assert object_versions(s3_client(), BUCKET, prefix) == []


def test_case_7_forget_on_one_machine_reaches_the_bucket_and_the_other_machine(
    base: tuple[RunningSandbox, dict[str, Canary], Path], aws_env: dict[str, str], tmp_path: Path
) -> None:
    """Case 7: machine A lands a night in a versioned bucket and machine B builds its own
    warehouse and reports; A loses its local reports, then forgets alpha. No version of any
    object names alpha, and B's next build follows the rewritten night: its working dir names
    alpha nowhere. Control is still found (the positive control)."""
    from conftest import BUCKET
    from privacy_scan import scan_bucket

    sandbox, canaries, _ = base
    location = versioned("two-machines")
    key = tmp_path / "keys" / "erasure.key"
    a = machine(tmp_path / "a", sandbox, location, aws_env, key)
    b = machine(tmp_path / "b", sandbox, location, aws_env, key)
    assert a.sync(a.argv(NIGHT1)).ok
    assert run(b, "reports").ok
    shutil.rmtree(tmp_path / "a" / "work" / "reports")  # A knows the reports only from the bucket
    alpha, control = canaries["alpha"], canaries["control"]
    prefix = location.removeprefix(f"s3://{BUCKET}/")
    assert scan_bucket(BUCKET, [alpha], prefix)[alpha.number], "the bucket named alpha"

    outcome = forget(a, alpha.number)
    assert outcome.status == 0, outcome.describe()
    assert scan_bucket(BUCKET, [alpha], prefix)[alpha.number] == []
    assert scan_bucket(BUCKET, [control], prefix)[control.number]
    assert run(b, "reports").ok
    assert scan_files([tmp_path / "b" / "work"], [alpha])[alpha.number] == []
    assert scan_files([tmp_path / "b" / "work"], [control])[control.number]


def test_case_1_the_identified_prompt_cannot_read_the_key_or_write_either(built: Workspace) -> None:
    """Case 1, beyond the issue: `--identified` is a reader of its own tier too: the erasure
    key (outside the data dir), the sync state and a COPY are refused there as well."""
    key = Path(built.env()["MEMBERSYNC_ERASURE_KEY_FILE"])
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_text("00" * 32)
    for query in (
        f"SELECT * FROM read_text('{key}')",
        f"SELECT * FROM read_csv('{built.data_dir.root}/state/state.json')",
        f"COPY (SELECT * FROM identity.clients) TO '{built.data_dir.root}/names.csv'",
    ):
        one_line_error(run(built, "sql", "--identified", query), 2, "error: SQL")
    assert not (built.data_dir.root / "names.csv").exists()
    assert run(built, "sql", "--identified", "SELECT count(*) FROM identity.clients").status == 0
