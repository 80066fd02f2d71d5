"""Issue 13: the tenants file (``membersync tenants check``), and a tenant's data location.

Real ``membersync`` processes against the sandbox on loopback; real manifests on disk.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pytest
from membersync.extract.sandbox.running import RunningSandbox
from membersync.flows.pool.tenants import TenantsFileError, load_tenants
from membersync.warehouse.landing.manifest import foreign_tenant, read_manifest
from nights import TONIGHT as NIGHT
from reliability import Workspace

MEMBERSYNC = Path(sys.executable).parent / "membersync"

GOOD = """
[defaults]
timezone = "Europe/Paris"

[tenants.spa-north]
base_url = "https://north.example.com"
username_env = "NORTH_USERNAME"
password_env = "NORTH_PASSWORD"
profile = "north.toml"
schedule = "30 3 * * *"
data_dir = "s3://membersync-data/spa-north"
rate = 100

[tenants.spa-south]
base_url = "https://south.example.com"
credentials_block = "spa-south-credentials"
data_dir = "data/south"
"""

BAD = """
[tenants.spa-north]
base_url = "ftp://north.example.com"
username_env = "NORTH USERNAME"
password = "hunter2-canary"
schedule = "not a cron"
data_dir = "s3://shared/place"
rate = -3

[tenants.Spa_South]
base_url = "https://south.example.com"
credentials_block = "south"
data_dir = "s3://shared/place"
colour = "blue"

[tenants.spa-east]
username_env = "E_USER"
password_env = "E_PASS"
credentials_block = "east"
timezone = "Mars/Olympus"
profile = "missing.toml"
"""


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb", "HOME": str(cwd)}
    return subprocess.run(
        [str(MEMBERSYNC), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_a_good_tenants_file_checks_ok(tmp_path: Path) -> None:
    (tmp_path / "north.toml").write_text('[params]\nclientNumber = "clientNo"\n', encoding="utf-8")
    path = tmp_path / "tenants.toml"
    path.write_text(GOOD, encoding="utf-8")
    done = cli("tenants", "check", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "ok: 2 tenant(s)"
    assert lines[0].startswith("spa-north: https://north.example.com -> s3://membersync-data/spa-north;")
    assert (
        "$NORTH_USERNAME/$NORTH_PASSWORD" in lines[0] and "'30 3 * * *' Europe/Paris; 100 req/s" in lines[0]
    )
    assert (
        f"-> {tmp_path / 'data' / 'south'};" in lines[1] and "Secret block spa-south-credentials" in lines[1]
    )
    north, south = load_tenants(path)
    assert north.profile == tmp_path / "north.toml" and south.schedule == "0 2 * * *"
    env = north.night_env({"NORTH_USERNAME": "u", "NORTH_PASSWORD": "p"})
    assert env["MEMBERSYNC_TENANT"] == "spa-north" and env["MEMBERSYNC_RATE"] == "100"
    assert (
        env["MEMBERSYNC_USERNAME"] == "u" and env["MEMBERSYNC_DATA_DIR"] == "s3://membersync-data/spa-north"
    )


def test_a_bad_tenants_file_is_one_line_per_error_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text(BAD, encoding="utf-8")
    done = cli("tenants", "check", str(path), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert all(line.startswith(f"error: {path}: ") for line in lines), lines
    expected = [
        "tenant spa-north: base_url 'ftp://north.example.com' is not an http(s) URL",
        "tenant spa-north: username_env 'NORTH USERNAME' is not an environment variable name",
        "tenant spa-north: 'password' would hold a secret",
        "tenant spa-north: invalid cron schedule 'not a cron'",
        "tenant spa-north: rate must be a positive number",
        "tenant spa-north: missing credentials",
        "tenant Spa_South: bad name",
        "tenant Spa_South: unknown key 'colour'",
        "tenant spa-east: missing base_url",
        "tenant spa-east: give either credentials_block or username_env + password_env, not both",
        "tenant spa-east: profile: ",
        "tenant spa-east: unknown timezone 'Mars/Olympus'",
        "tenant spa-east: missing data_dir",
    ]
    for want in expected:
        assert sum(want in line for line in lines) == 1, (want, lines)
    assert len(lines) == len(expected), lines
    assert "hunter2-canary" not in done.stderr  # a secret written by mistake is never echoed


def test_malformed_and_missing_files_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "t.toml").write_text("[tenants.a\n", encoding="utf-8")
    for name, want in (("t.toml", "not valid TOML"), ("nope.toml", "cannot read it")):
        done = cli("tenants", "check", str(tmp_path / name), cwd=tmp_path)
        assert done.returncode == 2
        assert len(done.stderr.splitlines()) == 1 and want in done.stderr, done.stderr


def test_two_tenants_cannot_share_a_data_location(tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text(
        "".join(
            f'[tenants.{n}]\nbase_url = "https://{n}.example.com"\ncredentials_block = "{n}"\n'
            f'data_dir = "s3://b/same/"\n'
            for n in ("a", "b")
        ),
        encoding="utf-8",
    )
    with pytest.raises(TenantsFileError) as caught:
        load_tenants(path)
    assert caught.value.errors == [
        f"{path}: tenant b: data_dir s3://b/same is also tenant a's (each tenant needs its own data location)"
    ]


def test_foreign_tenant_rule() -> None:
    d = dt.date(2026, 1, 1)
    assert foreign_tenant([(d, None)], "a") is None  # a single-tenant location can be adopted
    assert foreign_tenant([(d, "a")], "a") is None
    assert "tenant a's nights (manifest 2026-01-01)" in (foreign_tenant([(d, "a")], "b") or "")
    assert "a night without MEMBERSYNC_TENANT" in (foreign_tenant([(d, "a")], None) or "")


@pytest.mark.parametrize("full", [False, True])
def test_a_failed_tenant_nights_message_names_a_command_prefect_runs_as_that_night(full: bool) -> None:
    """Case: the resume line of a tenant's failed night (its notification): Prefect's CLI parses
    its ``--param``s into the very parameters of that night's flow run."""
    import shlex

    from membersync.flows.pool.tenant_flow import FLOW_NAME, resume_command, tenant_night
    from prefect.cli._utilities import load_json_key_values

    night = dt.date(2026, 11, 25)
    args = shlex.split(resume_command("spa north", night, full))
    assert args[:4] == ["prefect", "deployment", "run", f"{FLOW_NAME}/spa north"]
    params = load_json_key_values([args[i + 1] for i, a in enumerate(args) if a == "--param"], "parameter")
    bound = tenant_night.validate_parameters({"tenant": "spa north", **params})
    assert bound == {"tenant": "spa north", "night": night, "full": full}


def test_the_manifest_records_the_tenant_and_another_tenant_is_refused(
    sandbox: RunningSandbox, tmp_path: Path
) -> None:
    ws = Workspace(tmp_path, sandbox.url, NIGHT, extra_env={"MEMBERSYNC_BUILD": "off"})
    first = ws.sync(env=ws.env(MEMBERSYNC_TENANT="spa-north"))
    assert first.ok, first.describe()
    manifest = read_manifest(ws.data_dir.manifests, NIGHT)
    assert manifest is not None and manifest.tenant == "spa-north"
    body = json.loads((ws.data_dir.manifests / f"{NIGHT}.json").read_text(encoding="utf-8"))
    assert body["tenant"] == "spa-north"
    before = (ws.data_dir.manifests / f"{NIGHT}.json").read_bytes()
    for other in ("spa-south", None):
        env = ws.env(MEMBERSYNC_TENANT=other) if other else ws.env()
        env.pop("MEMBERSYNC_TENANT", None) if other is None else None
        refused = ws.sync(env=env)
        assert refused.status == 2, refused.describe()
        lines = [line for line in refused.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "holds tenant spa-north's nights" in lines[0], lines
    assert (ws.data_dir.manifests / f"{NIGHT}.json").read_bytes() == before  # nothing written


def test_a_single_tenant_setup_records_no_tenant(sandbox: RunningSandbox, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, sandbox.url, NIGHT, extra_env={"MEMBERSYNC_BUILD": "off"})
    done = ws.sync()
    assert done.ok, done.describe()
    body = json.loads((ws.data_dir.manifests / f"{NIGHT}.json").read_text(encoding="utf-8"))
    assert "tenant" not in body
