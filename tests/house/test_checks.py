"""The README's test command, ``tests/checks.py``: what it runs, and how it stops."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from repo_root import REPO


def _checks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("checks", REPO / "tests" / "checks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_and_ci_run_the_checks_script() -> None:
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    command = ".venv/bin/python tests/checks.py"
    assert command in readme and ci.rstrip().endswith(command)
    assert "membersync check" not in readme  # the product's CLI has no such command


def test_a_failed_mypy_stops_the_running_test_suite(tmp_path: Path) -> None:
    """`tests/checks.py` runs mypy beside pytest; when mypy fails it stops pytest at once
    (Ctrl-C, so its workers and fixtures clean up) instead of letting it run for minutes."""
    import time

    stop_tests = _checks().stop_tests

    inside = tmp_path / "inside"
    (tmp_path / "test_long.py").write_text(
        "import pathlib, time\n\n"
        f"def test_long():\n    pathlib.Path({str(inside)!r}).touch()\n    time.sleep(120)\n"
    )
    tests = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_long.py")],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    # Stopped once inside the test (a fixed 3-s wait was too short on a loaded machine: the
    # Ctrl-C came while pytest was still starting, before it could turn it into "interrupted").
    deadline = time.monotonic() + 60
    while not inside.exists() and time.monotonic() < deadline and tests.poll() is None:
        time.sleep(0.05)
    assert inside.exists(), "the long test never started"
    started = time.monotonic()
    stop_tests(tests)
    assert tests.returncode == 2  # pytest's "interrupted"
    assert time.monotonic() - started < 60
    assert b"KeyboardInterrupt" in (tests.stdout.read() if tests.stdout else b"")
