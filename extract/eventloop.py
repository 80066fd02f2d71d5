"""The event loop a night runs on: asyncio's, with timers that fire when they are due.

asyncio sleeps until its next timer in the selector's wait, and on Linux that is epoll, whose
timeout is whole milliseconds: Python rounds it up (``selectors.EpollSelector``), so a timer
fires 0-1 ms late, evenly spread (p50 0.65 ms, p99 1.2 ms on this 2-core host). For most of a
night that is nothing. For the rate limiter it is the spread of the send times, and a server
whose token bucket holds one token refuses any two requests that reach it closer than its
interval (5 ms at 200 req/s): a pace has to stay under the limit by that spread.

:class:`PreciseEpollSelector` waits out a short timeout (under ``PRECISE_TIMEOUT_BELOW``) in
``select()`` on the epoll descriptor itself, whose timeout has microseconds, then collects the
ready events from epoll without waiting: a timer fires 0.1-0.15 ms late (p50), 0.2-0.25 ms
(p99), and the loop is free meanwhile (the limiter used to sleep the last 2 ms of each wait
blocking, at 100 req/s or less only). A longer timeout (a request's deadline, seconds) goes to
epoll as before: a millisecond more there changes nothing, and costs no second system call.

Other platforms' loops keep asyncio's default selector (kqueue's timeout has nanoseconds).
:func:`precise_timers` tells the limiter which loop it runs on: a loop that Prefect's engine
created (a flow run by a work pool's worker) is asyncio's own.
"""

from __future__ import annotations

import asyncio
import select
import selectors
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

from membersync.extract import constants

T = TypeVar("T")

_PRECISE_LOOPS: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


if hasattr(selectors, "EpollSelector"):  # Linux

    class PreciseEpollSelector(selectors.EpollSelector):
        """epoll, but a short wait is timed by ``select()`` (microseconds), not epoll (milliseconds)."""

        def __init__(self) -> None:
            super().__init__()
            self._precise = True

        def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
            if self._precise and timeout is not None and 0 < timeout < constants.PRECISE_TIMEOUT_BELOW:
                try:
                    # Readable when epoll has events: returns at the first of them, or at the timeout.
                    select.select([self.fileno()], [], [], timeout)
                except ValueError:
                    # The epoll descriptor's number is past select()'s FD_SETSIZE (a process holding
                    # over 1,024 files when the loop was made): epoll's milliseconds from now on.
                    self._precise = False
                else:
                    timeout = 0
            return super().select(timeout)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop whose timers fire when due, where the default selector rounds to ms."""
    if selectors.DefaultSelector is not getattr(selectors, "EpollSelector", None):
        return asyncio.new_event_loop()
    loop = asyncio.SelectorEventLoop(PreciseEpollSelector())
    _PRECISE_LOOPS.add(loop)
    return loop


def precise_timers(loop: asyncio.AbstractEventLoop) -> bool:
    """Was ``loop`` made by :func:`new_event_loop` with the precise selector?"""
    return loop in _PRECISE_LOOPS


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)`` on a loop of :func:`new_event_loop`."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)
