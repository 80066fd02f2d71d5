"""Run the dbt project in ``sql/`` from Python (``dbtRunner``), one ``dbt build`` per batch of nights.

Nothing of dbt's is written inside the repository: the profile is generated at run time (DuckDB
needs no credentials), and dbt's target (the compiled SQL; no JSON artifacts, see
:data:`NO_ARTIFACTS`) and logs live under ``DATA_DIR/warehouse/dbt/``. The project is parsed in a
folder of its own per project and set of vars, under the user's cache
(``$XDG_CACHE_HOME/membersync/dbt-parse/``, default ``~/.cache``): dbt's partial-parse cache there
serves every data dir and every process (a new tenant, a fresh worker, ``membersync reports``),
and dbt itself re-parses what changed in the project. dbt never goes to the network:
no anonymous usage statistics, no version check, no packages from the hub.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import functools
import gc
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
PROFILE = "membersync"
# The scratch database's file name: dbt-duckdb names the database after it, and a parsed manifest
# holds that name, so every build (and warm) uses the same one.
SCRATCH_DATABASE = "build.duckdb"
# Parsed projects this process has seen, by (project folder, its fingerprint, vars): a build in a
# long-lived process (serve, a test session, tenants in turn) skips dbt's parse, whatever the
# data dir. dbt documents reusing a parsed manifest across invocations (dbtRunner(manifest=...)).
_PARSED: dict[tuple[str, str, str], Any] = {}
_PARSED_KEPT = 4
# dbt reads these before its flags; set for the whole process, they only ever say "no".
QUIET_ENV = {"DBT_SEND_ANONYMOUS_USAGE_STATS": "false", "DBT_VERSION_CHECK": "false", "DO_NOT_TRACK": "1"}


@dataclass(frozen=True)
class Node:
    """A model or test dbt ran, with what the build needs to know of it."""

    unique_id: str
    resource_type: str  # "model" or "test"
    name: str
    relation: str  # schema.table of a model ("" for a test)
    storage: str  # meta.storage of a model ("" for a test)
    key: tuple[str, ...]  # meta.key of a model (() for a test)
    status: str
    message: str
    failures: int
    compiled_code: str
    attached_to: str  # a test's model (unique id), "" for a singular test
    test_name: str  # a generic test's name (accepted_values, references, ...), "" otherwise
    check: str  # a singular test's meta.check: the name the build reports it by
    test_kwargs: Mapping[str, Any] = field(default_factory=dict)
    reads: tuple[str, ...] = ()  # the models (unique ids) a node reads
    sources: tuple[str, ...] = ()  # the sources (unique ids) a node reads
    tier: str = "analyst"  # meta.tier of a model: "identified" when it reads the identity


@dataclass(frozen=True)
class DbtRun:
    success: bool
    nodes: list[Node]
    error: str  # dbt's own error (parse, compile) when it could not run the nodes
    log_file: Path

    def models(self) -> Iterator[Node]:
        return (n for n in self.nodes if n.resource_type == "model")

    def tests(self) -> Iterator[Node]:
        return (n for n in self.nodes if n.resource_type == "test")


def write_profile(
    folder: Path, database: Path, threads: int = 1, duckdb_settings: Mapping[str, str] | None = None
) -> None:
    """profiles.yml for the scratch database (DuckDB: a path, no credentials), with
    ``duckdb_settings`` (the memory bound's limit and spill folder) as the database's options."""
    profile = {
        PROFILE: {
            "target": "build",
            "outputs": {
                "build": {
                    "type": "duckdb",
                    "path": str(database),
                    "schema": "main",
                    "threads": threads,
                    "settings": {"TimeZone": "UTC", "enable_progress_bar": "false"},
                    # the database's own options, set once as dbt opens it (DuckDB refuses to
                    # move its spill folder once used, which per-connection settings would try)
                    "config_options": dict(duckdb_settings or {}),
                }
            },
        }
    }
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    # JSON is YAML: no YAML writer needed.
    (folder / "profiles.yml").write_text(json.dumps(profile, indent=2), encoding="utf-8")


# A build's outcome is read in this process (dbtRunner's result): dbt's JSON artifacts
# (manifest.json, 1.7 MB for this project, and run_results.json) would be written for no reader.
# Its partial-parse cache and compiled SQL are written all the same.
NO_ARTIFACTS = "--no-write-json"


def run_build(project_dir: Path, profiles_dir: Path, state_dir: Path, variables: Mapping[str, Any]) -> DbtRun:
    """``dbt build`` of the whole project with ``variables``; every node's outcome."""
    return run(["build", NO_ARTIFACTS], project_dir, profiles_dir, state_dir, variables)


def run(
    command: Sequence[str],
    project_dir: Path,
    profiles_dir: Path,
    state_dir: Path,
    variables: Mapping[str, Any],
    *,
    reuse_parse: bool = True,
) -> DbtRun:
    """A dbt command in this process; its target and logs under ``state_dir``, nothing printed.

    With ``reuse_parse`` the project is parsed once per process and set of vars (see ``_PARSED``):
    for builds, whose profile always names a database ``SCRATCH_DATABASE``, which the parsed
    manifest holds. The parse itself runs in the shared parse folder (:func:`_parse_home`), whose
    partial-parse cache makes a first parse in a new process cheap too.
    """
    from dbt.adapters.duckdb import DuckDBConnectionManager
    from dbt.cli.main import dbtRunner

    os.environ.update(QUIET_ENV)
    common = _common_args(project_dir, profiles_dir, state_dir, variables)
    try:
        manifest = _parsed(project_dir, common, variables) if reuse_parse else None
        if manifest is None:  # not reused, or it does not parse: dbt parses (and says why it cannot)
            outcome = dbtRunner().invoke([*command, *common])
        else:
            outcome = dbtRunner(manifest=manifest).invoke([*command, *common])
    finally:
        # dbt-duckdb keeps its connection for the next invocation; the build reads the scratch
        # database next and deletes it, so let go of it now. DuckDB closes a database when its
        # last reference goes: collect cycles too, so that the next build, at the same path,
        # opens the new file rather than a cached instance of the deleted one.
        DuckDBConnectionManager.close_all_connections()
        gc.collect()
    nodes = [_node(r) for r in getattr(outcome.result, "results", None) or [] if hasattr(r, "node")]
    error = "" if outcome.exception is None else _first_lines(str(outcome.exception))
    return DbtRun(bool(outcome.success), nodes, error, state_dir / "logs" / "dbt.log")


def warm(project_dir: Path, workdir: Path, variables: Mapping[str, Any]) -> bool:
    """Parse the project into this process's cache ahead of its builds (a process about to fork
    many builds parses once); False if it does not parse. ``workdir`` holds dbt's scratch files
    when the shared parse folder cannot be used."""
    from dbt.adapters.duckdb import DuckDBConnectionManager

    os.environ.update(QUIET_ENV)
    write_profile(workdir, workdir / SCRATCH_DATABASE)
    common = _common_args(project_dir, workdir, workdir, variables)
    try:
        return _parsed(project_dir, common, variables) is not None
    finally:
        DuckDBConnectionManager.close_all_connections()  # leave no connection behind, as run() does


def parse_cache_root() -> Path:
    """Where projects are parsed: ``$XDG_CACHE_HOME/membersync/dbt-parse`` (default ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "membersync" / "dbt-parse"


@contextlib.contextmanager
def _parse_home(project_dir: Path, variables: Mapping[str, Any]) -> Iterator[Path | None]:
    """The folder this project is parsed in with these vars, held exclusively (two processes
    parsing at once would write dbt's partial-parse file over each other); None when it cannot be
    made (a read-only home: the caller parses in its own state folder, as before).

    One folder per project path and vars: dbt's partial-parse cache holds one set of vars and
    one profile, so builds of both kinds, and every data dir, keep theirs. Its profile names a
    database that is never opened (a parse does not connect); a reused manifest builds in any
    scratch database of the same name (``SCRATCH_DATABASE``)."""
    digest = hashlib.sha256(json.dumps([str(project_dir), dict(variables)], sort_keys=True).encode())
    home = parse_cache_root() / digest.hexdigest()[:16]
    try:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = os.open(home / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        log.debug("parsing without the shared parse folder %s: %s", home, exc)
        yield None
        return
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        write_profile(home, home / SCRATCH_DATABASE)
        yield home
    finally:
        os.close(lock)  # (and its lock)


def _common_args(
    project_dir: Path, profiles_dir: Path, state_dir: Path, variables: Mapping[str, Any]
) -> list[str]:
    target, logs = state_dir / "target", state_dir / "logs"
    return [
        "--project-dir",
        str(project_dir),
        "--profiles-dir",
        str(profiles_dir),
        "--target-path",
        str(target),
        "--log-path",
        str(logs),
        "--vars",
        json.dumps(dict(variables), sort_keys=True),
        "--no-send-anonymous-usage-stats",
        "--no-version-check",
        "--no-use-colors",
        "--log-level",
        "none",  # nothing on our stdout; the log file keeps everything
        "--log-level-file",
        "info",
    ]


def _parsed(project_dir: Path, common: Sequence[str], variables: Mapping[str, Any]) -> Any:
    """The project's parsed manifest for these vars (dbt's Manifest), or None if it does not parse."""
    from dbt.cli.main import dbtRunner

    key = (str(project_dir), project_fingerprint(project_dir), json.dumps(dict(variables), sort_keys=True))
    if key in _PARSED:
        return _PARSED[key]
    with _parse_home(project_dir, variables) as home:
        args = common if home is None else _common_args(project_dir, home, home, variables)
        outcome = dbtRunner().invoke(["parse", NO_ARTIFACTS, *args])
    manifest: Any = outcome.result  # a Manifest, for `parse`
    if not outcome.success or manifest is None:
        return None
    nodes = manifest.nodes.values()
    if any(getattr(getattr(n, "config", None), "materialized", "") == "ephemeral" for n in nodes):
        # dbt injects an ephemeral model's CTE once per node and marks it done: a reused
        # manifest would compile its users without it. Parse per invocation then.
        return None
    if len(_PARSED) >= _PARSED_KEPT:
        _PARSED.clear()
    _PARSED[key] = manifest
    return manifest


def project_fingerprint(project: Path) -> str:
    """A digest of the dbt project's files: a changed model means its history must be rebuilt."""
    digest = hashlib.sha256()
    for path in sorted(p for p in project.rglob("*") if p.is_file() and p.suffix in (".sql", ".yml")):
        digest.update(str(path.relative_to(project)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _node(result: Any) -> Node:
    node = result.node
    config = node.config
    meta = dict(getattr(config, "meta", None) or {})
    test_metadata = getattr(node, "test_metadata", None)
    return Node(
        unique_id=node.unique_id,
        resource_type=str(node.resource_type),
        name=node.name,
        relation=f"{node.schema}.{node.alias}" if str(node.resource_type) == "model" else "",
        storage=str(meta.get("storage", "")),
        key=tuple(str(k) for k in meta.get("key") or ()),
        status=str(result.status),
        message=_first_lines(str(result.message or "")),
        failures=int(result.failures or 0),
        compiled_code=str(getattr(node, "compiled_code", "") or ""),
        attached_to=str(getattr(node, "attached_node", "") or ""),
        test_name=test_metadata.name if test_metadata else "",
        check=str(meta.get("check", "")),
        test_kwargs=dict(test_metadata.kwargs) if test_metadata else {},
        reads=tuple(u for u in getattr(node.depends_on, "nodes", ()) if u.startswith("model.")),
        sources=tuple(u for u in getattr(node.depends_on, "nodes", ()) if u.startswith("source.")),
        tier=str(meta.get("tier", "analyst")),
    )


def _first_lines(text: str, lines: int = 6) -> str:
    return "\n".join(line for line in text.strip().splitlines()[:lines])


def reset_cache_for(state_dir: Path, project_dir: Path) -> None:
    """dbt's partial-parse cache belongs to one project folder: start afresh for another one."""
    marker = state_dir / "project"
    if marker.is_file() and marker.read_text(encoding="utf-8") == str(project_dir):
        return
    shutil.rmtree(state_dir / "target", ignore_errors=True)
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    marker.write_text(str(project_dir), encoding="utf-8")


def _layer_documents(project_dir: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every layer YAML file of the project (``<layer>/_*.yml``) with its content."""
    for path in sorted(project_dir.glob("*/_*.yml")):
        yield path, copy.deepcopy(_yaml_document(path.read_bytes()))  # the cached one stays intact


@functools.lru_cache(maxsize=32)
def _yaml_document(text: bytes) -> dict[str, Any]:
    """A YAML file's content, parsed once per process per content (a build reads each file
    several times). libyaml's loader when PyYAML has it: the pure-Python one cost ~0.5 s a build."""
    import yaml  # type: ignore[import-untyped]

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(text, Loader=loader) or {}  # a safe loader, C or Python


def model_yaml(project_dir: Path) -> list[dict[str, Any]]:
    """Every model's YAML entry (name, description, config.meta, columns), read without dbt."""
    return [
        {**model, "_layer": path.parent.name}
        for path, document in _layer_documents(project_dir)
        for model in document.get("models", [])
    ]


def source_models(project_dir: Path, source: str) -> dict[str, str]:
    """Table -> model (``meta.model``) of each table a source declares in the project's YAML."""
    return {
        str(table["name"]): str((table.get("meta") or {}).get("model", ""))
        for _, document in _layer_documents(project_dir)
        for declared in document.get("sources", [])
        if declared.get("name") == source
        for table in declared["tables"]
    }


def sql_path(project_dir: Path, layer: str, name: str) -> Path:
    return project_dir / layer / f"{name}.sql"


def describe_test(node: Node, relations: Mapping[str, str]) -> str:
    """A test as a check name: ``accepted_values(status)``, ``references(marts.x (client_number))``;
    a singular test by its meta.check (its failing rows name model and check themselves)."""
    kwargs = node.test_kwargs
    if node.test_name == "references":
        target = str(kwargs.get("to", ""))
        for unique_id, relation in relations.items():
            if unique_id.rsplit(".", 1)[-1] in target:
                target = relation
        return f"references({target} ({', '.join(kwargs.get('columns', []))}))"
    if node.test_name:
        column = kwargs.get("column_name")
        return f"{node.test_name}({column})" if column else node.test_name
    return node.check or node.name


def test_target(node: Node, relations: Mapping[str, str]) -> str:
    return relations.get(node.attached_to, node.name)


# The singular tests that check many models in one query (sql/tests/): when one passes, it is
# each model's checks, as if each model had tests of its own.
STAGING_CHECK = "staging_keys_and_landing"  # every staging model: key, and reconciled with landing
KEYS_CHECK = "keys_of_marts_and_reports"  # every mart and report: key
KEY_CHECKS = (STAGING_CHECK, KEYS_CHECK)  # between them, every model's key


def checks_rows(run: DbtRun, relations: Mapping[str, str]) -> Sequence[tuple[str, str, str]]:
    """(model, check, detail) of every check that passed: the key test two per mart and report
    it reads, the staging test three per staging model."""
    keys = {m.unique_id: m.key for m in run.models()}
    rows: list[tuple[str, str, str]] = []
    for t in run.tests():
        if t.status != "pass":
            continue
        if t.check in KEY_CHECKS:
            for model in sorted(t.reads):
                relation = relations[model]
                checks = (
                    staging_checks(relation, keys[model])
                    if t.check == STAGING_CHECK
                    else key_checks(keys[model])
                )
                rows += [(relation, check, "") for check in checks]
            continue
        rows.append((test_target(t, relations), describe_test(t, relations), ""))
    return rows


def key_checks(key: Sequence[str]) -> tuple[str, str]:
    """What a key test checks, named as its failing rows name it."""
    columns = ", ".join(key)
    return f"not_null({columns})", f"unique({columns})"


def staging_checks(relation: str, key: Sequence[str]) -> tuple[str, ...]:
    """What the staging test checks of ``staging.<t>``, named as its failing rows name them."""
    landed = relation.split(".", 1)[1]
    return (*key_checks(key), f"reconciles_with(landing.{landed})")
