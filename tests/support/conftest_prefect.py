"""Prefect for the integration tests: one ``prefect_test_harness`` per test module (it takes ~11 s to
enter), with ``PREFECT_HOME`` in a temporary folder. Per module, not per session: Prefect's events
worker of one harness's server does not survive into a second flow of another module (its task
runs' events were lost), so each module that runs flows gets a fresh server. Import the fixture
from a test module::

    from conftest_prefect import prefect_harness  # noqa: F401  (tests/ is on sys.path)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def prefect_harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    from prefect.settings import PREFECT_HOME, PREFECT_LOGGING_TO_API_ENABLED, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    home = tmp_path_factory.mktemp("prefect-home")
    updates = {PREFECT_HOME: str(home), PREFECT_LOGGING_TO_API_ENABLED: False}
    with temporary_settings(updates=updates), prefect_test_harness(server_startup_timeout=120):
        yield home
