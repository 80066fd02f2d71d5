"""The documentation's generated tables never drift from what they are generated from: the
configuration table from ``Settings``, the reports catalogue from the dbt YAML."""

from __future__ import annotations

import pytest
from membersync.extract.settings import Settings, env_name
from membersync.flows.cli import docs_tables


def test_the_configuration_table_and_the_reports_catalogue_are_up_to_date() -> None:
    for path, text in docs_tables.generated().items():
        assert path.read_text(encoding="utf-8") == text, (
            f"{path.name} drifted from its source: run `{docs_tables.COMMAND}`"
        )


def test_case_a_setting_described_anew_makes_the_table_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    """The drift test is no tautology: a changed description changes the generated table, and a
    file with another table between its markers is not what would be generated."""
    before = docs_tables.configuration_table()
    field = Settings.model_fields["batch_size"]
    monkeypatch.setattr(field, "description", "clients per batch, described anew")
    after = docs_tables.configuration_table()
    assert before != after and "described anew" in after
    current = docs_tables.CONFIGURATION.read_text(encoding="utf-8")
    assert docs_tables.with_generated(current, "configuration", after) != current


def test_every_setting_and_every_report_is_in_the_generated_tables() -> None:
    table = docs_tables.configuration_table()
    assert all(f"`{env_name(name)}`" in table for name in Settings.model_fields)
    assert all(Settings.model_fields[name].description for name in Settings.model_fields)
    catalogue = docs_tables.reports_catalogue()
    from membersync.warehouse.exports.export import REPORTS

    for report in REPORTS.values():
        assert f"### `{report.source}`" in catalogue, report.source


def test_markers_missing_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="BEGIN configuration"):
        docs_tables.with_generated("no markers here", "configuration", "x")
