"""The PostgreSQL publication's grants and row security as statements (issue 63): who is granted
what, before any server runs them (the server-side proof: tests/scenarios/test_postgres_publication.py)."""

from __future__ import annotations

from membersync.warehouse.exports.pg_roles import (
    ANALYST_ROLE,
    IDENTIFIED_ROLE,
    Grantable,
    grant_statements,
    role_statements,
)

TABLES = [
    Grantable("reports", "store_scorecard", has_store=True),
    Grantable("marts", "nights", has_store=False),
    Grantable("identity", "clients", has_store=False),
    Grantable("identity", "top_debtors", has_store=True),
]
ROLES = {"north": ("S01",), "south": ("S02 ", "S03")}
EVERYONE = {ANALYST_ROLE, IDENTIFIED_ROLE, "north", "south"}


def _granted(statements: list[str], role: str) -> set[str]:
    return {
        s.split(" ON ")[1].split(" TO ")[0]
        for s in statements
        if s.startswith("GRANT SELECT") and s.endswith(f'"{role}"')
    }


def test_the_analyst_role_reads_the_analyst_tier_and_no_identity_table() -> None:
    granted = _granted(grant_statements(TABLES, ROLES, EVERYONE), ANALYST_ROLE)
    assert granted == {'"reports"."store_scorecard"', '"marts"."nights"'}


def test_the_identified_role_reads_everything() -> None:
    assert len(_granted(grant_statements(TABLES, ROLES, EVERYONE), IDENTIFIED_ROLE)) == len(TABLES)


def test_a_store_role_gets_only_analyst_tables_with_a_store_column_and_a_policy_of_its_stores() -> None:
    statements = grant_statements(TABLES, ROLES, EVERYONE)
    assert _granted(statements, "south") == {'"reports"."store_scorecard"'}
    policy = next(s for s in statements if s.startswith('CREATE POLICY "membersync_store_south"'))
    assert "ARRAY['S02 ', 'S03']" in policy  # byte-exact storecodes, trailing spaces kept
    assert '"identity"' not in " ".join(s for s in statements if "membersync_store_" in s)


def test_row_security_is_on_for_every_table_with_a_store_column_even_before_its_roles_exist() -> None:
    statements = grant_statements(TABLES, ROLES, existing=set())
    enabled = {s.split()[2] for s in statements if s.endswith("ENABLE ROW LEVEL SECURITY")}
    assert enabled == {'"reports"."store_scorecard"', '"identity"."top_debtors"'}
    assert not [s for s in statements if s.startswith(("GRANT", "CREATE POLICY"))]  # no role, no grant


def test_only_missing_roles_are_created_as_group_roles() -> None:
    assert role_statements(ROLES, existing={ANALYST_ROLE, "north"}) == [
        f'CREATE ROLE "{IDENTIFIED_ROLE}" NOLOGIN',
        'CREATE ROLE "south" NOLOGIN',
    ]


def test_a_quote_in_a_storecode_cannot_end_the_policy_literal() -> None:
    statements = grant_statements(TABLES[:1], {"odd": ("S'1",)}, {"odd"})
    assert "ARRAY['S''1']" in next(s for s in statements if "membersync_store_odd" in s)
