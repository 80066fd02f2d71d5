"""The CLI's one error printer (flows/console.py): one line, the message as given.

Before it, each command printed its errors as rich markup: a message holding ``[`` ... ``]``
lost the bracketed words (a tenants file's ``[tenants.<name>]``) or, for ``[/x]``, raised
rich's MarkupError and printed a traceback instead of the one line."""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import pytest
from membersync.flows.console import error
from repo_root import MEMBERSYNC, REPO
from rich.console import Console


def _cli(*argv: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMBERSYNC_")}
    env.update(MEMBERSYNC_DATA_DIR=str(data_dir), COLUMNS="200", NO_COLOR="1")
    return subprocess.run(
        [*MEMBERSYNC, *argv],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("message", ["add a [tenants.<name>] table", "number '[/x]' is not held", "[bold]x"])
def test_case_an_error_holding_brackets_is_printed_as_given(message: str) -> None:
    buffer = io.StringIO()
    error(message, Console(file=buffer, width=200, color_system=None))
    assert buffer.getvalue() == f"error: {message}\n"


def test_case_a_client_number_that_reads_as_markup_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    done = _cli("forget", "[/x]", "--reason", "test", data_dir=tmp_path / "data")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: client number '[/x]' is not held here")


def test_case_a_tenants_file_error_keeps_its_bracketed_table_name(tmp_path: Path) -> None:
    empty = tmp_path / "tenants.toml"
    empty.write_text("")
    done = _cli("tenants", "check", str(empty), data_dir=tmp_path / "data")
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: {empty}: no tenant (add a [tenants.<name>] table)"


def test_case_the_shared_consoles_never_read_text_as_markup(capsys: pytest.CaptureFixture[str]) -> None:
    """A path or a name holding brackets, printed by any command (not only as an error)."""
    from membersync.flows.console import err, out

    out.print("report: /data/[/x]/[bold]r.csv", soft_wrap=True)
    err.print("note: [tenants.alpha]", soft_wrap=True)
    captured = capsys.readouterr()
    assert captured.out == "report: /data/[/x]/[bold]r.csv\n"
    assert captured.err == "note: [tenants.alpha]\n"


def test_case_the_nights_progress_draws_only_a_build_of_several_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One batch (its only call is done = total) draws nothing; several draw nights done of
    nights, to the last."""
    from membersync.flows import console

    buffer = io.StringIO()
    monkeypatch.setattr(console, "err", Console(file=buffer, width=100, color_system=None))
    with console.nights_progress("building") as told:
        told(365, 365)
    assert buffer.getvalue() == ""
    with console.nights_progress("building") as told:
        for done in (120, 240, 365):
            told(done, 365)
    drawn = buffer.getvalue()
    assert "building" in drawn and "365/365 nights" in drawn
