"""One settings object (issue 11): every ``MEMBERSYNC_*`` variable declared once, read in one place.

``extract/settings.py::Settings`` declares them; a variable named anywhere else (code, README,
architecture notes) must be one of its fields, and no other module reads one from the environment.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
from pathlib import Path

import pytest
from membersync.extract.client import ClientOptions
from membersync.extract.settings import SECRET_SETTINGS, ServiceSettings, Settings, SettingsError, env_name
from membersync.flows.night.audit import AuditOptions
from membersync.flows.night.options import SyncOptions
from membersync.warehouse.landing.paths import DEFAULT_DATA_DIR, DataDir
from repo_root import MEMBERSYNC, REPO

PRODUCT = ("extract", "models", "flows", "warehouse")
SETTINGS_MODULE = REPO / "extract" / "settings.py"
DECLARED = {env_name(name) for name in Settings.model_fields}
# The test suite's own knobs (read by tests/, documented in the README): not product settings.
TEST_KNOBS = {f"MEMBERSYNC_RELIABILITY_{knob}" for knob in ("KILLS", "RESULTS", "PREFECT")}
# A name, not a prefix (``MEMBERSYNC_AUDIT_*``) nor a shell variable's expansion.
_NAME = re.compile(r"\bMEMBERSYNC_[A-Z][A-Z0-9_]*[A-Z0-9]\b(?![_*])")


def _product_files() -> list[Path]:
    files = [p for top in PRODUCT for p in (REPO / top).rglob("*.py")]
    docs = sorted((REPO / "docs").glob("*.md"))
    return [*files, REPO / "README.md", REPO / "ARCHITECTURE.md", *docs]


def test_every_variable_named_anywhere_is_a_declared_setting() -> None:
    named: dict[str, set[str]] = {}
    for path in _product_files():
        for name in _NAME.findall(path.read_text()):
            named.setdefault(name, set()).add(str(path.relative_to(REPO)))
    unknown = {name: sorted(where) for name, where in named.items() if name not in DECLARED | TEST_KNOBS}
    assert unknown == {}, "named but not declared in Settings"
    assert len(named) > 20  # the scan found the variables (it is not vacuous)


def _setting_names(tree: ast.Module) -> dict[str, str]:
    """Module constants that hold a setting's variable name (``X = "MEMBERSYNC_..."`` or
    ``X = env_name("...")``)."""
    out = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target = node.targets[0]
        if isinstance(target, ast.Name) and (name := _variable(node.value, {})):
            out[target.id] = name
    return out


def _variable(node: ast.AST, constants: dict[str, str]) -> str | None:
    """The MEMBERSYNC_* variable an expression names, if any."""
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith("MEMBERSYNC_")
    ):
        return node.value
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "env_name" and node.args:
        arg = node.args[0]
        return env_name(arg.value) if isinstance(arg, ast.Constant) else "MEMBERSYNC_?"
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    return None


def _reads_environment(node: ast.AST, constants: dict[str, str]) -> str | None:
    """The MEMBERSYNC_* variable that ``node`` reads from an environment mapping, if any."""
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        key = node.args[0]
    elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):  # not env[X] = ...
        name, key = "__getitem__", node.slice
    else:
        return None
    if name not in ("get", "getenv", "pop", "__getitem__"):
        return None
    return _variable(key, constants)


# Read where they act, by design: the reliability tests' fault injection (set per child process).
READ_IN_PLACE = {"warehouse/landing/crashpoints.py": {"MEMBERSYNC_CRASH_AT"}}


def test_no_module_but_settings_reads_a_membersync_variable() -> None:
    readers = []
    for path in _product_files():
        if path.suffix != ".py" or path == SETTINGS_MODULE:
            continue
        tree = ast.parse(path.read_text())
        constants = _setting_names(tree)
        allowed = READ_IN_PLACE.get(str(path.relative_to(REPO)), set())
        for node in ast.walk(tree):
            if (found := _reads_environment(node, constants)) and found not in allowed:
                readers.append(f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')} {found}")
    assert readers == []
    # the scanner does see each form of a read (it is not vacuous)
    sample = ast.parse(
        'X = env_name("crash_at")\nos.environ.get(X)\n'
        'os.environ["MEMBERSYNC_RATE"]\nenv.get(env_name("rate"))'
    )
    found = [_reads_environment(n, _setting_names(sample)) for n in ast.walk(sample)]
    assert sorted(f for f in found if f) == ["MEMBERSYNC_CRASH_AT", "MEMBERSYNC_RATE", "MEMBERSYNC_RATE"]


def test_case_the_option_objects_defaults_are_the_settings_defaults() -> None:
    defaults = Settings.load({})
    assert ClientOptions.from_settings(defaults) == ClientOptions()
    assert AuditOptions.from_settings(defaults) == AuditOptions()
    assert SyncOptions.from_settings(defaults) == SyncOptions()
    assert DataDir.from_settings(defaults) == DataDir(DEFAULT_DATA_DIR)


def test_case_the_environment_given_is_the_only_one_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMBERSYNC_BATCH_SIZE", "7")
    assert Settings.load().batch_size == 7  # default: the process environment
    assert Settings.load({}).batch_size == 250  # a given mapping: that one alone
    assert Settings.load({"MEMBERSYNC_BATCH_SIZE": ""}).batch_size == 250  # empty is unset
    got = Settings.load(
        {"MEMBERSYNC_BUILD": " Off ", "MEMBERSYNC_AUDIT_HEAL": "NOW", "MEMBERSYNC_RATE": "2.5"}
    )
    assert (got.build, got.audit_heal, got.rate) == (False, "now", 2.5)
    assert Settings.load({"MEMBERSYNC_TENANT": "   "}).tenant is None  # blanks are unset
    assert Settings.load({"membersync_batch_size": "3"}).batch_size == 250  # upper-case names only
    assert Settings.load({"MEMBERSYNC_POINTS_START": "20240101"}).points_start.isoformat() == "2024-01-01"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("MEMBERSYNC_BATCH_SIZE", "zero"),
        ("MEMBERSYNC_BATCHES_IN_FLIGHT", "0"),
        ("MEMBERSYNC_RATE", "inf"),
        ("MEMBERSYNC_READ_TIMEOUT", "-1"),
        ("MEMBERSYNC_POINTS_START", "2020-13-01"),
        ("MEMBERSYNC_POINTS_START", "86400"),  # not a Unix timestamp
        ("MEMBERSYNC_WHOLE_HISTORY", "maybe"),
        ("MEMBERSYNC_AUDIT_SHARE", "1.5"),
        ("MEMBERSYNC_AUDIT_HEAL", "later"),
        ("MEMBERSYNC_DBT_THREADS", "0"),
        ("MEMBERSYNC_STALE_AFTER_HOURS", "six"),
        ("MEMBERSYNC_BASE_URL", "ftp://host"),
        ("MEMBERSYNC_PUBLISH_URL", "mysql://host/db"),
        ("MEMBERSYNC_PUBLISH_ROLES", "North=S01"),
        ("MEMBERSYNC_PUBLISH_ROLES", "north=S01; north=S02"),
        ("MEMBERSYNC_PUBLISH_ROLES", "north="),
        ("MEMBERSYNC_PUBLISH_ROLES", "membersync_analyst=S01"),  # would widen, not narrow, a tier role
    ],
)
def test_case_a_bad_value_is_one_line_naming_its_variable(variable: str, value: str) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.load({variable: value})
    message = str(caught.value)
    assert message.startswith(f"{variable}: ") and "\n" not in message


def test_case_a_bad_secret_value_is_never_shown() -> None:
    assert {"username", "password", "notify", "base_url"} <= SECRET_SETTINGS
    with pytest.raises(SettingsError) as caught:
        Settings.load({"MEMBERSYNC_BASE_URL": "http://alice:hunter2@host"})
    assert "hunter2" not in str(caught.value) and "alice" not in str(caught.value)
    loaded = Settings.load({"MEMBERSYNC_PASSWORD": "hunter2", "MEMBERSYNC_NOTIFY": "json://t0ken@h/x"})
    assert "hunter2" not in repr(loaded) and "t0ken" not in repr(loaded)
    with pytest.raises(SettingsError, match=r"^missing setting MEMBERSYNC_USERNAME"):
        ServiceSettings.from_settings(Settings.load({"MEMBERSYNC_BASE_URL": "http://h:1"}))


def test_case_a_password_in_the_publish_url_is_refused_and_never_shown() -> None:
    for url in ("postgresql://bi:hunter2@db/warehouse", "postgresql://db/warehouse?password=hunter2"):
        with pytest.raises(SettingsError) as caught:
            Settings.load({"MEMBERSYNC_PUBLISH_URL": url})
        assert "must not carry a password" in str(caught.value) and "hunter2" not in str(caught.value)
    assert Settings.load({"MEMBERSYNC_PUBLISH_URL": "postgresql:///?service=bi"}).publish_url


def test_case_the_store_roles_keep_each_storecode_verbatim_but_for_spaces_after_a_comma() -> None:
    roles = Settings.load(
        {"MEMBERSYNC_PUBLISH_ROLES": "north=S01; south=DOWNTOWN  , S03\nwest=S04"}
    ).publish_roles
    assert roles == {"north": ("S01",), "south": ("DOWNTOWN  ", "S03"), "west": ("S04",)}


def test_case_the_cli_exits_2_with_one_line_on_a_bad_setting(tmp_path: Path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MEMBERSYNC_")},
        "MEMBERSYNC_BASE_URL": "http://127.0.0.1:9",
        "MEMBERSYNC_USERNAME": "u",
        "MEMBERSYNC_PASSWORD": "p",
        "MEMBERSYNC_DATA_DIR": str(tmp_path),
        "MEMBERSYNC_BATCHES_IN_FLIGHT": "0",
    }
    done = subprocess.run(
        [*MEMBERSYNC, "sync", "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and "MEMBERSYNC_BATCHES_IN_FLIGHT" in lines[0], lines
    assert list(tmp_path.iterdir()) == []  # nothing was started
