"""The Prefect API a night reports to: the configured server, else a local one for this command.

When no API URL is configured (``PREFECT_API_URL`` unset in the environment and the Prefect
profile), Prefect starts its own "ephemeral" server on the first client call. It does so from
``prefect.server.api.server``, so *this* process first imports the whole server application
(FastAPI, SQLAlchemy, the ORM, every API router: ~3 s of CPU on the 2-core build machine) only
to spawn a subprocess that imports it all again. :func:`night_api` starts the same server
(uvicorn serving Prefect's ``create_app``, ephemeral flags, the same database under
``PREFECT_HOME``) without that import, and points this process's Prefect settings at it, so the
flow run, its task runs and its artifacts land exactly where they did. The server's process
(:func:`serve`) loads Prefect with the garbage collector off (:mod:`membersync.flows.nightgc`):
~0.6 s less CPU for each night.

A configured server (``PREFECT_API_URL``, e.g. ``membersync serve``'s or Prefect Cloud) is used
as it is; no server is started then.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
from membersync.flows import nightgc

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0  # a loaded 2-core machine; PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS wins
_PORT_IN_USE = 3  # uvicorn's exit code when the port was taken meanwhile


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _spawn(port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """What ``prefect.server.api.server.SubprocessASGIServer`` runs (uvicorn serving Prefect's
    ``create_app``), on ``port``, by :func:`serve` (the collector off while it loads)."""
    return subprocess.Popen(
        [sys.executable, "-m", "membersync.flows.prefect_api", str(port)],
        env=env,
        stdin=subprocess.DEVNULL,
    )


def serve(port: int) -> None:
    """The local server's process: Prefect's app (its settings from the environment that
    :func:`night_api` gives it), served by uvicorn on 127.0.0.1 until terminated. Exits 3 when
    the port was taken meanwhile (uvicorn's start-up failure)."""
    with nightgc.quiet_while_loading():
        import uvicorn
        from prefect.server.api.server import create_app

        app = create_app()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error", lifespan="on")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_healthy(api_url: str, process: subprocess.Popen[bytes], timeout: float) -> bool:
    """True once ``/health`` answers 200; False if the process exited with "port in use"."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5, trust_env=False) as client:
        while time.monotonic() < deadline:
            code = process.poll()
            if code == _PORT_IN_USE:
                return False
            if code is not None:
                raise RuntimeError(f"the local Prefect server exited with code {code}")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{api_url}/health").status_code == 200:
                    return True
            time.sleep(0.1)
    raise RuntimeError(f"the local Prefect server did not answer within {timeout:.0f} s")


@contextlib.contextmanager
def night_api() -> Iterator[str | None]:
    """Within: Prefect reports to the configured API, else to a local server started here.

    Yields the API URL of the server started here, or None when one is configured (or the
    profile forbids an ephemeral server: Prefect then reports its own error, as before).
    Call after :func:`membersync.flows.nightly.prepare_prefect_env`.
    """
    import prefect.context
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    settings = get_current_settings()
    if settings.api.url or not settings.server.ephemeral.enabled:
        yield None
        return
    env = {
        # Registering Prefect's block types costs a fresh database ~2-3 s of CPU; a night uses
        # no block (nothing is persisted). A later server on the same PREFECT_HOME registers them.
        "PREFECT_API_BLOCKS_REGISTER_ON_START": "false",
        **os.environ,
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
        **settings.to_environment_variables(exclude_unset=True),
    }
    timeout = float(settings.server.ephemeral.startup_timeout_seconds or START_TIMEOUT_S)
    process = None
    api_url = ""
    try:
        for _ in range(5):  # another process may take the free port before uvicorn binds it
            port = _free_port()
            api_url = f"http://127.0.0.1:{port}/api"
            process = _spawn(port, env)
            if _wait_healthy(api_url, process, timeout):
                break
        else:
            raise RuntimeError("the local Prefect server found no free port")
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
    finally:
        if process is not None:
            _stop(process)


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


if __name__ == "__main__":
    serve(int(sys.argv[1]))
