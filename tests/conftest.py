"""Shared fixtures: the sandbox (a real HTTP server on loopback) and a factory of fresh ones.

- ``sandbox``: one sandbox for the whole session (200 clients, seed 42, holdings filled in so
  ``sandbox.service`` is complete ground truth). Treat it as read-only: a test that writes
  should use ``fresh_sandbox`` so that other tests' truth does not move under them.
- ``fresh_sandbox(**config)``: a new sandbox per call (``SandboxConfig`` keywords, checked),
  stopped when the test ends.
- ``s3_endpoint`` (per module): moto's S3 server on 127.0.0.1, in a process of its own;
  ``aws_env``: the standard AWS variables for it (set in this process too), with bucket
  ``BUCKET`` created.
- ``prefect_database``: a fresh PostgreSQL server for a Prefect server (``tests/support/postgres.py``).
- ``tmp_root``: a temporary directory, removed after the test; ``sandboxes(**config)``:
  ``fresh_sandbox`` with the reliability scenarios' fixed anchor date (``reliability.ANCHOR``).

Each pytest process (each xdist worker) gets a user cache of its own (``XDG_CACHE_HOME``,
inherited by the processes it starts): dbt's parse cache (``warehouse/build/dbt_run.py``) starts empty
in every run of the suite and is shared by that worker's builds only, never with the machine's
user or another run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from membersync.extract.sandbox.running import RunningSandbox, start_in_thread
from membersync.extract.sandbox.server import SandboxConfig

# The helpers (truth, scenarios, fixtures' servers) live in tests/support, imported by name.
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
from receiver import receiver  # noqa: F401  (a fixture for every test)
from reliability import ANCHOR

BUCKET = "membersync-test"


def s3_prefix(name: str) -> str:
    """A location of its own in the test bucket: ``s3://BUCKET/<name>-<pid>-<ns>``."""
    return f"s3://{BUCKET}/{name}-{os.getpid()}-{time.monotonic_ns()}"


KEY_ID, SECRET = "AKIDTESTOBJECTSTORE", "object-store-secret-canary-7f3a"
_USER_CACHE: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    cache = tempfile.mkdtemp(prefix="membersync-test-cache-")
    _USER_CACHE.append(cache)
    os.environ["XDG_CACHE_HOME"] = cache


def pytest_unconfigure(config: pytest.Config) -> None:
    for cache in _USER_CACHE:
        shutil.rmtree(cache, ignore_errors=True)


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


@pytest.fixture
def tmp_root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="membersync-test-") as tmp:
        yield Path(tmp)


@pytest.fixture
def sandboxes(fresh_sandbox: Callable[..., RunningSandbox]) -> Callable[..., RunningSandbox]:
    """``fresh_sandbox`` with the scenarios' fixed anchor date (stable, comparable nights)."""

    def make(**kw: Any) -> RunningSandbox:
        kw.setdefault("anchor_date", ANCHOR)
        return fresh_sandbox(**kw)

    return make


@pytest.fixture
def prefect_database() -> Iterator[str]:
    """A fresh PostgreSQL server on loopback: the URL for ``PREFECT_SERVER_DATABASE_CONNECTION_URL``."""
    from postgres import postgres_server

    with postgres_server() as url:
        yield url


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto's S3 server in a process of its own: in this one, its CPU (every upload of every
    night the test runs) would hold back the sandboxes' loops, whose token buckets count a
    request when it is handled, not when it was sent."""
    from membersync.flows.pool.schedule import free_port, stop_process

    moto = Path(sys.executable).parent / "moto_server"
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    for _attempt in range(3):  # a port taken between free_port() and the bind: another one
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with log.open("ab") as out:
            process = subprocess.Popen(
                [str(moto), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT
            )
        if _answers(url, process, timeout=60.0):
            break
        process.kill()
        process.wait()
    else:
        raise RuntimeError(f"moto's S3 server did not start: {log.read_text(errors='replace')[-2000:]}")
    try:
        yield url
    finally:
        stop_process(process, grace=10.0)


def _answers(url: str, process: subprocess.Popen[bytes], timeout: float) -> bool:
    """True once ``url`` answers HTTP; False when the process exits or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            urllib.request.urlopen(url + "/", timeout=2).close()
            return True
        except urllib.error.HTTPError:
            return True  # an answer, whatever its status
        except OSError:
            time.sleep(0.1)
    return False


@pytest.fixture
def aws_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    from membersync.warehouse.landing.storage import s3_filesystem

    env = {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    fs = s3_filesystem()
    if not fs.exists(BUCKET):
        fs.call_s3("create_bucket", Bucket=BUCKET)
    return env


# The longest files first, so that the workers (`tests/checks.py` runs pytest-xdist with
# --dist loadfile) finish together instead of one starting a 5-minute file when the others are
# nearly done. Order only: every test still runs. By the time their slowest tests took in a full
# run (`tests/checks.py` at 69409ca, the durations it prints): the lifecycle files (retention,
# migrate, forget) were not listed and started last, a tail of ~5 minutes on one worker.
LONGEST_FIRST = (
    "test_warehouse_incremental.py",  # ~300 s (with the batched refresh's cases)
    "test_reliability_kills.py",  # ~260 s
    "test_retention.py",  # ~340 s (its 430-night history is a module fixture)
    "test_migrate.py",  # ~280 s
    "test_work_pool.py",  # ~280 s
    "test_forget.py",  # ~210 s
    "test_reliability_prefect.py",  # ~200 s
    "test_reliability.py",  # ~190 s
    "test_object_storage.py",
    "test_audit.py",
    "test_reports_truth.py",
    "test_shards.py",
    "test_nightly.py",
    "test_notify.py",
    "test_privacy_attacks.py",
    "test_cli_commands.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each file's tests stay together and in their order
