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


def test_case_a_password_that_is_also_a_field_name_still_leaves_no_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Case: a tenant's password is "password". Masked first, it turned the field's name into
    ``***`` and the field's pattern no longer found the value beside it (CI caught it: a test
    before this module had registered that password). Every span is found in the text as given."""
    monkeypatch.setattr(redact, "_secrets", {"password", "tokenId"})
    for text in ('{"password": "canary-7f3e"}', "tokenId=canary-7f3e&x=1", "password: canary-7f3e"):
        scrubbed = redact.scrub(text)
        assert "canary-7f3e" not in scrubbed and "***" in scrubbed, scrubbed
    assert redact.scrub("a password-free line") == "a ***-free line"  # the secret itself, still
