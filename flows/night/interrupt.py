"""One Ctrl-C (or SIGTERM) stops a night within seconds, whatever Prefect is doing.

The night runs as one asyncio task. The first SIGINT/SIGTERM cancels it: the flow engine
records the run as cancelled, the landing zone keeps every staged batch (each was written
atomically), the data dir's lock is released, and the caller exits 130 with one line saying
how to resume. If the cancellation has not finished after :data:`GRACE_S` seconds (a Prefect
server that is itself shutting down can keep the engine retrying its state report for
minutes), or at a second signal, the process stops at once: it prints the same line, stops its
child processes (if any: the local Prefect server is a thread of this one) and exits 130.
Nothing is lost either way: the landing zone survives a SIGKILL anywhere (see
``tests/scenarios/test_reliability_kills.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from membersync.warehouse.landing.atomic import alive

T = TypeVar("T")
EXIT_INTERRUPTED = 130
GRACE_S = 5.0
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    """The night was stopped by a signal (its name in ``.signal``)."""

    def __init__(self, signame: str) -> None:
        super().__init__(signame)
        self.signal = signame


def run_until_signal(
    coro: Coroutine[Any, Any, T],
    last_words: Callable[[str], None],
    finished: Callable[[T], bool] = lambda _: True,
) -> T:
    """``asyncio.run(coro)``, stopped by
    the first SIGINT/SIGTERM (raises :class:`Interrupted`).

    ``last_words(signame)`` prints the one line for the user; it is called here only when the
    process has to stop hard (grace exceeded, second signal), else by the caller. A result that
    comes back after a signal counts only when ``finished(result)`` says the work was done (the
    night committed before the signal took effect): a run that swallowed the cancellation and
    returned a partial result is an interruption too.
    """
    try:
        return asyncio.run(_guarded(coro, last_words, finished))
    except BaseException as exc:
        # A SIGTERM that lands while Prefect's own handler is in place (the engine's set-up,
        # before the flow's body reclaims the signal) raises TerminationSignal past _guarded.
        signum = getattr(exc, "signal", None)
        if isinstance(signum, int) and signum in _SIGNALS:
            raise Interrupted(signal.Signals(signum).name) from None
        raise


async def _guarded(
    coro: Coroutine[Any, Any, T], last_words: Callable[[str], None], finished: Callable[[T], bool]
) -> T:
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(coro)
    received: list[str] = []
    watchdogs: list[threading.Timer] = []

    def on_signal(signame: str) -> None:
        if received:  # a second signal: no more patience
            hard_exit(received[0], last_words)
        received.append(signame)
        _detach_api_log_handlers()
        watchdog = threading.Timer(GRACE_S, hard_exit, args=(signame, last_words))
        watchdog.daemon = True
        watchdog.start()
        watchdogs.append(watchdog)
        task.cancel()

    for sig in _SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig.name)
    _ours[:] = [signal.getsignal(signal.SIGTERM)]
    try:
        result = await task
    except asyncio.CancelledError:
        if received:
            raise Interrupted(received[0]) from None
        raise
    except BaseException:
        if received:  # the cancellation surfaced as another error (a failed flow run)
            raise Interrupted(received[0]) from None
        raise
    finally:
        _ours.clear()
        for sig in _SIGNALS:
            loop.remove_signal_handler(sig)
    if received and not finished(result):
        raise Interrupted(received[0])
    for watchdog in watchdogs:  # the work was done before the signal took effect: it stands
        watchdog.cancel()
    return result


_ours: list[Any] = []  # the SIGTERM handler of the guard in force (the loop's), if any


def reclaim_sigterm() -> None:
    """Put the guard's SIGTERM handler back in place of Prefect's (call it first in a flow's body).

    Prefect's flow engine installs a handler that raises ``TerminationSignal`` in whatever the
    main thread runs. Raised inside an event-loop callback, asyncio logs and swallows it (only a
    task's step passes it on); raised just after the loop read its wake-up byte, the signal is
    lost with it, and the night goes on to commit as if never asked to stop. Under the guard
    the signal needs no handler of Prefect's: the loop sees it and cancels the night. Without
    a guard (a worker or ``serve`` runs the flow) Prefect's handler stays: it owns that process.
    """
    if _ours and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _ours[0])


def _detach_api_log_handlers() -> None:
    """Stop sending log lines to Prefect's API: its server may be stopping with us (Ctrl-C reaches
    the whole process group), and its log worker prints every failed send on stderr unless
    ``logging.raiseExceptions`` is off."""
    logging.raiseExceptions = False
    loggers = [logging.getLogger(), *logging.root.manager.loggerDict.values()]
    for logger in loggers:
        if isinstance(logger, logging.Logger):
            for handler in list(logger.handlers):
                if type(handler).__name__.endswith("APILogHandler"):
                    logger.removeHandler(handler)


_exiting = threading.Lock()
_said = threading.Event()


def say_once(words: Callable[[], object]) -> None:
    """Print the interrupted line once, whoever gets there first (the caller or the watchdog)."""
    if _said.is_set():
        return
    _said.set()
    words()


def hard_exit(signame: str, last_words: Callable[[str], None]) -> None:
    """Say the last words (once), stop the child processes, and leave now (exit 130)."""
    if not _exiting.acquire(blocking=False):
        return
    with contextlib.suppress(Exception):
        say_once(lambda: last_words(signame))
    leave_now()


def leave_now() -> None:
    """Exit 130 at once: no atexit hooks (Prefect's would wait on a server that is going away)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    stop_children()
    os._exit(EXIT_INTERRUPTED)  # the kernel releases the lock (flock) with the process


def stop_children(timeout: float = 2.0) -> None:
    """SIGTERM every descendant process (e.g. a Prefect server of its own), SIGKILL what is left."""
    pids = _descendants(os.getpid())
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if alive(p)]
        time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # the command name (field 2) may hold spaces and parentheses: fields follow the last ')'
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out
