"""Who reads what in the PostgreSQL publication: the roles, their grants, and row security by store.

Three kinds of reader, declared once here and in ``MEMBERSYNC_PUBLISH_ROLES``:

- :data:`ANALYST_ROLE` reads the analyst tier (schemas ``marts`` and ``reports``), every row, and
  has no access to ``identity``;
- :data:`IDENTIFIED_ROLE` reads the analyst tier and ``identity`` (names, contact details);
- each **store role** of ``MEMBERSYNC_PUBLISH_ROLES`` (``north_managers=S01,S02``) reads the
  analyst tables that have a store column, and of them **only its stores' rows**: row-level
  security on every such table, so a store manager's login sees its stores in any tool, the
  chain-wide tables (top debtors, the scorecard) included. Tables with no store column are not
  granted to store roles at all: what cannot be filtered is not shown.

The roles are group roles (``NOLOGIN``); an administrator grants them to logins
(``GRANT north_managers TO alice``). Row security is enabled on every table with a store column,
so a role with no policy there (one added by hand) sees no row. The publisher owns the tables
and is not subject to the policies.

Everything is a list of SQL statements (:func:`grant_statements`, :func:`role_statements`),
printed by ``membersync publish --roles --dry-run`` and run in the publication's transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

ANALYST_ROLE = "membersync_analyst"
IDENTIFIED_ROLE = "membersync_identified"
ANALYST_SCHEMAS = ("marts", "reports")
IDENTITY_SCHEMA = "identity"
STORE_COLUMN = "storecode"
POLICY_PREFIX = "membersync_"  # policies this module made, dropped and made again at each grant


@dataclass(frozen=True)
class Grantable:
    """A published table as the grants see it."""

    schema: str
    table: str
    has_store: bool

    @property
    def qualified(self) -> str:
        return f"{ident(self.schema)}.{ident(self.table)}"


def ident(name: str) -> str:
    """A quoted identifier (names come from our own models and the role map, quoted anyway)."""
    return '"' + name.replace('"', '""') + '"'


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def role_statements(roles: Mapping[str, Sequence[str]], existing: Iterable[str]) -> list[str]:
    """``CREATE ROLE`` for every role of the publication not in ``existing``."""
    have = set(existing)
    wanted = [ANALYST_ROLE, IDENTIFIED_ROLE, *sorted(roles)]
    return [f"CREATE ROLE {ident(r)} NOLOGIN" for r in wanted if r not in have]


def grant_statements(
    tables: Sequence[Grantable], roles: Mapping[str, Sequence[str]], existing: Iterable[str]
) -> list[str]:
    """Grants and row security for ``tables``, for the roles of the publication that exist."""
    have = set(existing)
    schemas = sorted({t.schema for t in tables})
    out = [f"REVOKE ALL ON SCHEMA {ident(s)} FROM PUBLIC" for s in schemas]
    readers: dict[str, list[Grantable]] = {
        ANALYST_ROLE: [t for t in tables if t.schema in ANALYST_SCHEMAS],
        IDENTIFIED_ROLE: list(tables),
    }
    for role in sorted(roles):
        readers[role] = [t for t in tables if t.schema in ANALYST_SCHEMAS and t.has_store]
    for role, readable in readers.items():
        if role in have:
            out += _grants(role, readable)
    for table in tables:
        if table.has_store:
            out += _row_security(table, roles, have)
    return out


def _grants(role: str, tables: Sequence[Grantable]) -> list[str]:
    out = [f"GRANT USAGE ON SCHEMA {ident(s)} TO {ident(role)}" for s in sorted({t.schema for t in tables})]
    return out + [f"GRANT SELECT ON {t.qualified} TO {ident(role)}" for t in tables]


def _row_security(table: Grantable, roles: Mapping[str, Sequence[str]], have: set[str]) -> list[str]:
    """Row security on a table with a store column: every row for the tier roles, a store role's
    stores for it (policies of a role are its members' too)."""
    out = [f"ALTER TABLE {table.qualified} ENABLE ROW LEVEL SECURITY"]
    whole = [r for r in (ANALYST_ROLE, IDENTIFIED_ROLE) if r in have]
    if whole:
        to = ", ".join(ident(r) for r in whole)
        out.append(
            f"CREATE POLICY {ident(POLICY_PREFIX + 'all')} ON {table.qualified} "
            f"FOR SELECT TO {to} USING (true)"
        )
    for role in sorted(roles):
        if role not in have or table.schema not in ANALYST_SCHEMAS:
            continue
        stores = ", ".join(literal(code) for code in roles[role])
        name = ident(f"{POLICY_PREFIX}store_{role}")
        using = f"{ident(STORE_COLUMN)} = ANY (ARRAY[{stores}]::text[])"
        out.append(f"CREATE POLICY {name} ON {table.qualified} FOR SELECT TO {ident(role)} USING ({using})")
    return out


def drop_policy_statements(policies: Iterable[tuple[str, str, str]]) -> list[str]:
    """``DROP POLICY`` for (schema, table, policy) made by this module, before they are made again."""
    return [
        f"DROP POLICY {ident(p)} ON {ident(s)}.{ident(t)}"
        for s, t, p in policies
        if p.startswith(POLICY_PREFIX)
    ]


def revoke_statements(tables: Sequence[Grantable], roles: Iterable[str]) -> list[str]:
    """What a role was granted before, taken back (a role removed from the map, a store moved)."""
    out = []
    for role in sorted(set(roles)):
        out += [f"REVOKE ALL ON {t.qualified} FROM {ident(role)}" for t in tables]
        out += [
            f"REVOKE ALL ON SCHEMA {ident(s)} FROM {ident(role)}" for s in sorted({t.schema for t in tables})
        ]
    return out
