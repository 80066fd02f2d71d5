"""The Prefect API a night reports to: the configured server, else a local one for this command.

When no API URL is configured (``PREFECT_API_URL`` unset in the environment and the Prefect
profile), Prefect starts its own "ephemeral" server on the first client call. It does so from
``prefect.server.api.server``, so *this* process first imports the whole server application
(FastAPI, SQLAlchemy, the ORM, every API router) only to spawn a subprocess that starts a second
interpreter and imports Prefect and that application all over again. :func:`night_api` serves
the same application (Prefect's ``create_app``, ephemeral: no UI, only the services an
ephemeral server runs; the same database under ``PREFECT_HOME``) from a thread of this process,
with uvicorn, on a loopback port, and points this process's Prefect settings at it: the flow
run, its task runs and its artifacts land exactly where they did, and Prefect is loaded once:
~2 s of CPU and wall less before the night's first request than the server process of its own
we ran before (docs/benchmarks.md, "Prefect's fixed cost"), and nothing left running if
the command is killed. The price: the server's work during the night (a few calls per batch
task) shares this interpreter, which slows an unpaced night against a loopback sandbox by ~9 %,
not a paced one.

A configured server (``PREFECT_API_URL``, e.g. ``membersync serve``'s or Prefect Cloud) is used
as it is; no server is started then.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from membersync.flows.night import nightgc

if TYPE_CHECKING:
    import uvicorn
    from prefect.settings import Settings

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0  # a loaded 2-core machine; PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS wins
STOP_TIMEOUT_S = 10.0  # the server's shutdown (its services, its database), at most


@contextlib.contextmanager
def night_api() -> Iterator[str | None]:
    """Within: Prefect reports to the configured API, else to a local server started here.

    Yields the API URL of the server started here, or None when one is configured (or the
    profile forbids an ephemeral server: Prefect then reports its own error, as before).
    Call after :func:`membersync.flows.night.nightly.prepare_prefect_env`.
    """
    import prefect.context
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    settings = get_current_settings()
    if settings.api.url or not settings.server.ephemeral.enabled:
        yield None
        return
    timeout = float(settings.server.ephemeral.startup_timeout_seconds or START_TIMEOUT_S)
    with local_server(settings, timeout) as api_url:
        log.info("local Prefect server at %s (database under PREFECT_HOME)", api_url)
        with contextlib.ExitStack() as stack:
            stack.enter_context(temporary_settings(updates={PREFECT_API_URL: api_url}))
            # As prefect_test_harness does: also the process-global settings, which Prefect's
            # background workers (events, logs) read from threads of their own.
            global_settings = getattr(prefect.context, "_temporary_global_settings_context", None)
            if global_settings is not None:
                stack.enter_context(global_settings(prefect.context.get_settings_context()))
            yield api_url
            _drain_workers()  # the night's last events and logs reach the server before it stops


@contextlib.contextmanager
def local_server(settings: Settings, timeout: float) -> Iterator[str]:
    """Prefect's server application, served from a thread of this process until the block ends.

    Yields its API URL (``http://127.0.0.1:<port>/api``). The port is bound here, before the
    thread starts, so no other process can take it meanwhile. Raises RuntimeError when the
    server stops during its start (its error is logged) or does not start within ``timeout``.
    """
    import uvicorn
    from prefect.settings import temporary_settings

    updates = _server_settings()
    with temporary_settings(updates=updates) as server_settings, nightgc.quiet_while_loading():
        from prefect.server.api.server import create_app

        app = create_app(server_settings, ephemeral=True)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    config = uvicorn.Config(
        app, log_level="error", lifespan="on", timeout_graceful_shutdown=STOP_TIMEOUT_S / 2
    )
    server = uvicorn.Server(config)
    failed: list[BaseException] = []

    def serve() -> None:
        # A thread starts with empty context variables: the server's settings are entered in it.
        try:
            with temporary_settings(updates=updates):
                server.run(sockets=[sock])
        except BaseException as exc:  # uvicorn exits with SystemExit when its start fails
            failed.append(exc)

    thread = threading.Thread(target=serve, name="prefect-server", daemon=True)
    thread.start()
    try:
        _wait_started(server, thread, failed, timeout)
        yield f"http://127.0.0.1:{port}/api"
    finally:
        server.should_exit = True
        thread.join(STOP_TIMEOUT_S)
        sock.close()


def _server_settings() -> dict[Any, Any]:
    """What the local server runs with beyond this process's settings."""
    from prefect.settings import PREFECT_API_BLOCKS_REGISTER_ON_START

    if "PREFECT_API_BLOCKS_REGISTER_ON_START" in os.environ:
        return {}  # the user's word
    # Registering Prefect's block types costs a fresh database ~2-3 s of CPU; a night uses no
    # block (nothing is persisted). A later server on the same PREFECT_HOME registers them.
    return {PREFECT_API_BLOCKS_REGISTER_ON_START: False}


def _wait_started(
    server: uvicorn.Server, thread: threading.Thread, failed: list[BaseException], timeout: float
) -> None:
    """Until uvicorn has run the application's start-up (migrations included) and listens."""
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive():
            cause = failed[0] if failed else None
            raise RuntimeError("the local Prefect server stopped during its start (see the log)") from cause
        if time.monotonic() > deadline:
            raise RuntimeError(f"the local Prefect server did not start within {timeout:.0f} s")
        time.sleep(0.02)


def _drain_workers() -> None:
    """Flush Prefect's log and event workers (else they retry against a stopped server at exit)."""
    import inspect

    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.utilities.asyncutils import run_coro_as_sync

    async def drain() -> None:
        for drain_call in (APILogWorker.drain_all, EventsWorker.drain_all):
            try:
                result = drain_call(timeout=5)
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:  # a flush is best effort: never mask the night's outcome
                log.debug("could not flush Prefect's %s: %s", drain_call, exc)

    run_coro_as_sync(drain())
