"""The repository's root, and its command line, for tests that run its commands or read its files."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # tests/support/repo_root.py
MEMBERSYNC = [sys.executable, "-m", "membersync.flows.cli.commands"]  # the CLI, as the venv runs it
