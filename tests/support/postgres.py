"""A throwaway PostgreSQL server on loopback: for a Prefect server that takes a pool's writes,
and for the warehouse's PostgreSQL publication (``tests/scenarios/test_postgres_publication.py``).

Prefect's guidance: SQLite for one user, PostgreSQL once several workers write at once. On SQLite
the work-pool test's 3 workers (and their runs' events) lock the file; the server then drops
events ("database is locked"), among them the heartbeats its zombie automation reads, and marks
live runs Crashed. The server runs from Debian's ``postgresql`` package (``tests/checks.py``
installs it), as the ``postgres`` user when the tests run as root (PostgreSQL refuses root), in a
fresh data directory with ``fsync`` off (a test database), stopped and removed at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from membersync.flows.pool.schedule import free_port
from system import system_executable

USER = "prefect"


def _as_server_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    runuser = shutil.which("runuser")
    assert runuser is not None, "runuser (util-linux) is needed to start PostgreSQL as root"
    return [runuser, "-u", "postgres", "--", *cmd]


@dataclass(frozen=True)
class Instance:
    port: int
    root: Path  # holds the data directory (data/) and the server's log (server.log)

    def url(self, user: str = USER, database: str = "postgres") -> str:
        """A libpq URL (psql, psycopg, MEMBERSYNC_PUBLISH_URL)."""
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    @property
    def data(self) -> Path:
        return self.root / "data"


@contextlib.contextmanager
def postgres_server(timeout: float = 60.0) -> Iterator[str]:
    """Start a PostgreSQL server; yield its SQLAlchemy URL for Prefect (asyncpg driver)."""
    with postgres_instance(timeout) as instance:
        yield instance.url().replace("postgresql://", "postgresql+asyncpg://")


@contextlib.contextmanager
def postgres_instance(timeout: float = 60.0, settings: tuple[str, ...] = ()) -> Iterator[Instance]:
    """Start a PostgreSQL server (its initdb user a superuser, trust authentication on loopback;
    ``settings``: more ``name=value`` of the server's, such as ``log_statement=all``)."""
    extra = [arg for setting in settings for arg in ("-c", setting)]
    initdb, postgres = system_executable("initdb"), system_executable("postgres")
    pg_isready = system_executable("pg_isready")
    assert initdb and postgres and pg_isready, "no PostgreSQL here (Debian: apt-get install postgresql)"
    root = Path(tempfile.mkdtemp(prefix="membersync-pg-"))
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    os.chmod(root, 0o700)
    log = root / "server.log"
    server: subprocess.Popen[bytes] | None = None
    try:
        made = subprocess.run(
            _as_server_user([initdb, "-D", str(data), "-U", USER, "--auth=trust", "--no-sync", "-E", "UTF8"]),
            capture_output=True,
            timeout=120,
        )
        assert made.returncode == 0, made.stderr.decode(errors="replace")[-2000:]
        port = free_port()
        options = ["-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={root}", *extra]
        options += ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "max_connections=200"]
        with open(log, "wb") as out:
            server = subprocess.Popen(
                _as_server_user([postgres, "-D", str(data), "-p", str(port), *options]),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        ready = [pg_isready, "-q", "-h", "127.0.0.1", "-p", str(port), "-U", USER, "-d", "postgres"]
        while subprocess.run(ready, check=False).returncode != 0:  # accepting queries, not only connections
            assert server.poll() is None, log.read_text(errors="replace")[-2000:]
            assert time.monotonic() < deadline, f"PostgreSQL did not listen in {timeout:.0f} s"
            time.sleep(0.2)
        yield Instance(port, root)
    finally:
        if server is not None and server.poll() is None:
            os.killpg(server.pid, signal.SIGINT)  # PostgreSQL's fast shutdown
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        shutil.rmtree(root, ignore_errors=True)
