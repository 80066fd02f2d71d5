"""Shared fixtures: the sandbox (a real HTTP server on loopback) and a factory of fresh ones.

- ``sandbox``: one sandbox for the whole session (200 clients, seed 42, holdings filled in so
  ``sandbox.service`` is complete ground truth). Treat it as read-only: a test that writes
  should use ``fresh_sandbox`` so that other tests' truth does not move under them.
- ``fresh_sandbox(**config)``: a new sandbox per call (``SandboxConfig`` keywords, checked),
  stopped when the test ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from membersync.extract.sandbox.server import RunningSandbox, SandboxConfig, start_in_thread


@pytest.fixture(scope="session")
def sandbox() -> Iterator[RunningSandbox]:
    running = start_in_thread(SandboxConfig(clients=200, seed=42))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def fresh_sandbox() -> Iterator[Callable[..., RunningSandbox]]:
    started: list[RunningSandbox] = []

    def make(**config: Any) -> RunningSandbox:
        running = start_in_thread(SandboxConfig.checked(**config))
        started.append(running)
        return running

    try:
        yield make
    finally:
        for running in started:
            running.stop()
