"""The build's verdict on a dbt run: every model built, stored as declared, in its tier, with
its key checked, and every test passed; else the first failure as a :class:`BuildCheckError`
that names the model, the check and a few failing rows (personal columns withheld).
"""

from __future__ import annotations

from collections.abc import Mapping

import duckdb
from membersync.models.tables import LANDED, PERSONAL_COLUMNS
from membersync.warehouse.build import catalog as cat
from membersync.warehouse.build import dbt_run
from membersync.warehouse.build.errors import BuildCheckError

# When several tests fail, the error names the first of these kinds (a broken key explains the rest).
TEST_PRIORITY = {dbt_run.STAGING_CHECK: 0, dbt_run.KEYS_CHECK: 0, "accepted_values": 1, "references": 2}


def raise_first_failure(
    con: duckdb.DuckDBPyConnection, run: dbt_run.DbtRun, relations: Mapping[str, str]
) -> None:
    """A model that did not build, or the first test that failed, as a :class:`BuildCheckError`."""
    for node in run.models():
        if node.status in ("error", "runtime error"):
            raise BuildCheckError(node.relation, "builds", node.message)
        if node.storage not in cat.STORAGES:
            raise BuildCheckError(
                node.relation,
                "storage",
                f"meta.storage is {node.storage or 'not set'!r} in its YAML: say how its rows are kept "
                f"({', '.join(cat.STORAGES)}; see sql/dbt_project.yml)",
            )
    _check_tiers(run)
    key_checked = {m for t in run.tests() if t.check in dbt_run.KEY_CHECKS for m in t.reads}
    for node in run.models():
        if node.unique_id not in key_checked:
            var = "landing_tables" if node.relation.startswith("staging.") else "keyed_models"
            raise BuildCheckError(
                node.relation,
                "key",
                f"no test checks its key: add it to the var {var} in sql/dbt_project.yml "
                "(the singular tests in sql/tests/ check the key of every model listed there)",
            )
    failed = [t for t in run.tests() if t.status in ("fail", "error", "warn")]
    # The most telling first: a broken key explains the failures of the tests that follow from it.
    failed.sort(key=lambda t: TEST_PRIORITY.get(t.test_name or t.check, len(TEST_PRIORITY)))
    for node in failed[:1]:
        raise BuildCheckError(*_test_failure(con, node, relations))
    if not run.success:
        raise BuildCheckError("dbt", "build", run.error or f"dbt failed; see {run.log_file}")


IDENTITY_SOURCES = frozenset(f"source.membersync.landing.{t.name}" for t in LANDED if t.tier == "identified")


PERSONAL_SOURCES = frozenset(f"source.membersync.landing.{t.name}" for t in LANDED if t.personal)


def _check_tiers(run: dbt_run.DbtRun) -> None:
    """Where personal data may go: a model that reads the identity is of the identified tier, and
    a model that reads per-person data is a view, never a part (so forgetting a person rewrites
    the landed identity files and nothing else)."""
    identified: set[str] = set()
    carrying: set[str] = set()  # models whose rows carry per-person data (dbt's order: readers after)
    for node in run.models():
        reads_identity = bool(set(node.sources) & IDENTITY_SOURCES or set(node.reads) & identified)
        if reads_identity and node.tier != "identified":
            raise BuildCheckError(
                node.relation, "tier", "it reads the identity: say meta.tier: identified in its YAML"
            )
        if node.tier == "identified":
            identified.add(node.unique_id)
        if set(node.sources) & PERSONAL_SOURCES or set(node.reads) & carrying:
            if node.storage != cat.VIEW:
                raise BuildCheckError(
                    node.relation,
                    "personal",
                    "it reads per-person data: make it a view (meta.storage: view), so that forgetting a "
                    "person rewrites the landed identity files and nothing else",
                )
            carrying.add(node.unique_id)


def _test_failure(
    con: duckdb.DuckDBPyConnection, node: dbt_run.Node, relations: Mapping[str, str]
) -> tuple[str, str, str]:
    """The failing model, the check and a few of the rows that fail (the test's own query, run
    again). The first failing row may say more: a row with ``model`` and ``check_name`` (a singular
    test over many models: keys, reconciliation) names both; ``table_name`` (landed rows against
    the manifests) names the landed table."""
    model = dbt_run.test_target(node, relations)
    if node.status == "error" or not node.compiled_code:
        return model, dbt_run.describe_test(node, relations), node.message
    try:
        cursor = con.execute(f"SELECT * FROM ({node.compiled_code}) LIMIT 3")
        header = [d[0] for d in cursor.description or []]
        examples = [dict(zip(header, row, strict=True)) for row in cursor.fetchall()]
    except duckdb.Error:
        return model, dbt_run.describe_test(node, relations), f"{node.failures} failing row(s)"
    first = examples[0] if examples else {}
    if "table_name" in first:
        model = f"landing.{first['table_name']}"
    model = str(first.get("model") or model)
    check = str(first.get("check_name") or dbt_run.describe_test(node, relations))
    # a failing row of an identified model may name a person: its personal columns are not shown
    shown = "; ".join(
        ", ".join(f"{k}={'[withheld]' if k in PERSONAL_COLUMNS else v}" for k, v in e.items())
        for e in examples
    )
    return model, check, f"{node.failures} failing row(s), e.g. {shown}"
