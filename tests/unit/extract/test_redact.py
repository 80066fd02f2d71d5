"""Redaction (``extract/redact.py``): every declared secret field is masked in log text."""

from __future__ import annotations

import pytest
from membersync.extract import catalogue, redact


@pytest.mark.parametrize("name", sorted(catalogue.SECRET_FIELDS))
def test_case_every_declared_secret_field_is_masked_in_log_text(name: str) -> None:
    """Case: a log line quoting a record (JSON, or key=value) never shows a secret field's value,
    for every field the catalogue declares secret (the redaction reads the declaration)."""
    for text in (f'{{"{name}": "canary-7f3e"}}', f"{name}=canary-7f3e", f"'{name}': 'canary-7f3e'"):
        assert "canary-7f3e" not in redact.scrub(text), text
