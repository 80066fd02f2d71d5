"""Running a sandbox: in the foreground until a signal (``membersync sandbox``), from a daemon
thread with its own event loop (:class:`RunningSandbox`: tests, benchmarks), or from a child
process (:class:`SandboxProcess`: the demo)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import multiprocessing
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TypeVar, cast

from aiohttp import web
from membersync.extract.sandbox.server import SandboxConfig, SandboxServer, SandboxStats
from membersync.extract.sandbox.state import Service
from membersync.extract.settings import SettingsError

log = logging.getLogger(__name__)

T = TypeVar("T")


async def _start_site(server: SandboxServer, host: str, port: int) -> tuple[web.ServerRunner, int]:
    lowlevel = web.Server(server.handle, access_log=None)
    runner = web.ServerRunner(lowlevel)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise SettingsError(f"sandbox cannot listen on {host}:{port} ({exc.strerror or exc})") from None
    addresses = runner.addresses
    actual = int(addresses[0][1]) if addresses else port
    server.start_watch()
    return runner, actual


async def _stop_site(server: SandboxServer, runner: web.ServerRunner) -> None:
    await server.stop_watch()
    await runner.cleanup()


def serve_forever(config: SandboxConfig, host: str = "127.0.0.1", port: int = 8700) -> None:
    """Serve until SIGINT/SIGTERM (``membersync sandbox``); logs the URL and config, never the password."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.info("sandbox starting: %s", config.describe())
    server = SandboxServer(config)
    asyncio.run(_serve(server, host, port))


async def _serve(server: SandboxServer, host: str, port: int) -> None:
    runner, actual = await _start_site(server, host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("sandbox serving http://%s:%d/svcapi/ (%s)", host, actual, server.config.describe())
    try:
        await stop.wait()
    finally:
        log.info("sandbox stopping after %d requests", server.stats.requests)
        await _stop_site(server, runner)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


class RunningSandbox:
    """A sandbox served from a daemon thread with its own event loop (tests, demo, benchmarks)."""

    def __init__(self, server: SandboxServer, host: str, port: int) -> None:
        self.server = server
        self.host = host
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.ServerRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def service(self) -> Service:
        return self.server.service

    @property
    def stats(self) -> SandboxStats:
        return self.server.stats

    @property
    def config(self) -> SandboxConfig:
        return self.server.config

    def start(self) -> RunningSandbox:
        self._thread = threading.Thread(target=self._run, name=f"sandbox-{self.port}", daemon=True)
        self._thread.start()
        self._ready.wait(60)
        if self._failure is not None:
            raise self._failure
        if not self._ready.is_set():
            raise RuntimeError("the sandbox did not start within 60 s")
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            self._runner, self.port = loop.run_until_complete(_start_site(self.server, self.host, self.port))
        except BaseException as exc:
            self._failure = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(_stop_site(self.server, self._runner))
            loop.close()

    def call(self, fn: Callable[[Service], T]) -> T:
        """Run ``fn(service)`` on the server's loop thread (a consistent read or write) and return it."""
        loop = self._loop
        if loop is None or not loop.is_running():
            raise RuntimeError("the sandbox is not running")
        if threading.current_thread() is self._thread:
            return fn(self.service)

        async def run() -> T:
            return fn(self.service)

        return asyncio.run_coroutine_threadsafe(run(), loop).result(timeout=120)

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(30)

    def __enter__(self) -> RunningSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_in_thread(
    config: SandboxConfig | None = None, host: str = "127.0.0.1", port: int = 0
) -> RunningSandbox:
    """Generate the data, serve it from a daemon thread, return when it answers."""
    server = SandboxServer(config or SandboxConfig())
    return RunningSandbox(server, host, port).start()


def start_in_process(config: SandboxConfig | None = None, host: str = "127.0.0.1") -> SandboxProcess:
    """Generate the data and serve it from a child process (its own interpreter, its own GIL);
    return when it answers. The demo's: on a thread of ours its answers and the night's parsing
    took turns at one GIL."""
    return SandboxProcess(config or SandboxConfig(), host).start()


class SandboxProcess:
    """A sandbox served from a child process; :meth:`call` runs a module-level function on its
    service there (a day of business), as :meth:`RunningSandbox.call` does on its thread."""

    def __init__(self, config: SandboxConfig, host: str) -> None:
        self.config, self.host, self.port = config, host, 0
        context = multiprocessing.get_context("spawn")  # no fork of a process with threads
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_child, args=(config, host, child), daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> SandboxProcess:
        self._process.start()
        if not self._conn.poll(120):
            self.stop()
            raise RuntimeError("the sandbox did not start within 120 s")
        self.port = cast(int, self._answer())
        return self

    def call(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(service, *args)`` in the child, on its server's loop; its result (picklable)."""
        try:
            self._conn.send((fn, args))
        except OSError:
            raise RuntimeError(f"the sandbox process ended (exit {self._process.exitcode})") from None
        return cast(T, self._answer())

    def _answer(self) -> object:
        try:
            ok, value = self._conn.recv()
        except EOFError:
            raise RuntimeError(f"the sandbox process ended (exit {self._process.exitcode})") from None
        if not ok:
            raise RuntimeError(f"the sandbox process failed: {value}")
        return value

    def stop(self) -> None:
        if self._process.is_alive():
            with contextlib.suppress(OSError):
                self._conn.send(None)
            self._process.join(30)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)

    def __enter__(self) -> SandboxProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _apply(fn: Callable[..., object], args: tuple[object, ...], service: Service) -> object:
    return fn(service, *args)


def _child(config: SandboxConfig, host: str, conn: Connection) -> None:
    try:
        sandbox = RunningSandbox(SandboxServer(config), host, 0).start()
    except BaseException as exc:
        conn.send((False, f"{type(exc).__name__}: {exc}"))
        return
    conn.send((True, sandbox.port))
    with sandbox:
        while (message := conn.recv()) is not None:
            try:
                conn.send((True, sandbox.call(functools.partial(_apply, *message))))
            except Exception as exc:
                conn.send((False, f"{type(exc).__name__}: {exc}"))
