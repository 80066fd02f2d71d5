"""The documentation's generated tables, from the one place each fact is declared:

- ``docs/configuration.md``: every ``MEMBERSYNC_*`` variable, its default and meaning, from
  :class:`membersync.extract.settings.Settings` (each field's ``description``);
- ``docs/reports.md``: every report and identified-tier model, its grain, key and columns, from
  the dbt project's YAML (``sql/reports/*.yml``, ``sql/identity/*.yml``);
- ``docs/personal-data.md``: every place under the data dir and its tier (the grant list), from
  :data:`membersync.warehouse.landing.paths.PLACES`.

    python -m membersync.flows.cli.docs_tables          # write them
    python -m membersync.flows.cli.docs_tables --check  # exit 1 when a file is not what it would write

Each file keeps its own prose; only the text between ``<!-- BEGIN name ... -->`` and
``<!-- END name -->`` is generated (``tests/unit/flows/test_docs_tables.py`` fails when it drifts).
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CONFIGURATION = REPO / "docs" / "configuration.md"
REPORTS = REPO / "docs" / "reports.md"
PERSONAL_DATA = REPO / "docs" / "personal-data.md"
COMMAND = "python -m membersync.flows.cli.docs_tables"


def configuration_table() -> str:
    """One row per setting: the variable, its default, what it means."""
    from membersync.extract.settings import SECRET_SETTINGS, Settings, env_name

    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = "-" if name in SECRET_SETTINGS else _shown(field.default)
        rows.append(f"| `{env_name(name)}` | {default} | {field.description or ''} |")
    return "\n".join(rows)


def places_table() -> str:
    """One row per place under the data dir: its tier and what it holds."""
    from membersync.warehouse.landing.paths import PLACES

    rows = ["| under the data dir | tier | what |", "|---|---|---|"]
    rows += [f"| `{p.path}` | {p.tier} | {p.holds} |" for p in PLACES]
    return "\n".join(rows)


def _shown(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "`on`" if value else "`off`"
    if isinstance(value, dt.date):
        return f"`{value.isoformat()}`"
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    return f"`{value}`"


def reports_catalogue() -> str:
    """Every report (schema ``reports``) and identified-tier model: grain, key, columns."""
    from membersync.warehouse.build.dbt_run import SQL_DIR, model_yaml

    sections = []
    for entry in model_yaml(SQL_DIR):
        if entry["_layer"] not in ("reports", "identity"):
            continue
        config = entry.get("config") or {}
        meta = config.get("meta") or {}
        relation = f"{config.get('schema', entry['_layer'])}.{str(entry['name']).removeprefix('identified_')}"
        tier = " (identified tier)" if meta.get("tier") == "identified" else ""
        lines = [
            f"### `{relation}`{tier}",
            "",
            _one_line(str(entry.get("description", "")).split(": ", 1)[-1]),
            "",
            f"Grain: {meta.get('grain', '')}. Key: {', '.join(f'`{k}`' for k in meta.get('key') or [])}. "
            f"Stored: {meta.get('storage', '')}.",
            "",
            "| column | heading | meaning |",
            "|---|---|---|",
            *(
                f"| `{c['name']}` | {_heading(c)} | {_one_line(str(c.get('description', '')))} |"
                for c in entry.get("columns", [])
            ),
        ]
        sections.append("\n".join(lines))
    return "\n\n".join(sections)


def _heading(column: dict[str, Any]) -> str:
    """The column's heading in the workbook (empty: not in an exported report)."""
    return _one_line(str(((column.get("config") or {}).get("meta") or {}).get("heading") or ""))


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().replace("|", "\\|")


def with_generated(text: str, name: str, body: str) -> str:
    """``text`` with the block ``name`` (between its BEGIN and END markers) replaced by ``body``."""
    pattern = re.compile(rf"(<!-- BEGIN {name}\b[^>]*-->\n).*?(\n<!-- END {name} -->)", re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"no <!-- BEGIN {name} --> ... <!-- END {name} --> markers")
    return pattern.sub(lambda m: m.group(1) + body + m.group(2), text, count=1)


def generated() -> dict[Path, str]:
    """Each generated file as it should be."""
    return {
        CONFIGURATION: with_generated(
            CONFIGURATION.read_text(encoding="utf-8"), "configuration", configuration_table()
        ),
        REPORTS: with_generated(REPORTS.read_text(encoding="utf-8"), "reports", reports_catalogue()),
        PERSONAL_DATA: with_generated(PERSONAL_DATA.read_text(encoding="utf-8"), "places", places_table()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when a file differs from what it would be"
    )
    args = parser.parse_args(argv)
    stale = [path for path, text in generated().items() if path.read_text(encoding="utf-8") != text]
    if args.check:
        for path in stale:
            sys.stderr.write(f"{path.relative_to(REPO)} is not up to date: run `{COMMAND}`\n")
        return 1 if stale else 0
    for path, text in generated().items():
        path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
