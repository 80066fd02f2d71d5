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

The thread that runs the night's loop (:func:`run`) also asks the kernel for a timer slack of
1 us instead of its default 50 us (``prctl(PR_SET_TIMERSLACK)``, :func:`fine_timer_slack`): Linux
lets a sleeping thread's wake-up come up to that late, to batch wake-ups, and every paced wake-up
came at least 0.051 ms late (traced), 0.13 -> 0.08 ms (mean) at an idle loop. It is given back when
the night ends. (Threads started meanwhile, ``asyncio.to_thread``'s workers, inherit it, as Linux
does: their waits are a little more punctual, nothing else.)

Other platforms' loops keep asyncio's default selector (kqueue's timeout has nanoseconds).
:func:`precise_timers` tells the limiter which loop it runs on: a loop that Prefect's engine
created (a flow run by a work pool's worker) is asyncio's own.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import select
import selectors
import sys
import weakref
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from membersync.extract import constants

T = TypeVar("T")

logger = logging.getLogger(__name__)

_PR_SET_TIMERSLACK = 29  # <linux/prctl.h>
_PR_GET_TIMERSLACK = 30
_FINE_SLACK_NS = 1_000

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


@contextmanager
def fine_timer_slack() -> Iterator[None]:
    """The calling thread's timer slack at 1 us meanwhile (Linux; elsewhere, nothing)."""
    prctl = _prctl()
    previous = prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0) if prctl is not None else -1
    if prctl is None or previous <= 0 or prctl(_PR_SET_TIMERSLACK, _FINE_SLACK_NS, 0, 0, 0) != 0:
        yield  # (not Linux, or a kernel that refuses: the default slack, 50 us more per wake-up)
        return
    try:
        yield
    finally:
        prctl(_PR_SET_TIMERSLACK, previous, 0, 0, 0)


def _prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        logger.debug("no prctl(): timers keep the kernel's default slack")
        return None
    prctl.restype = ctypes.c_int
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return prctl


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)`` on a loop of :func:`new_event_loop`, with a fine timer slack."""
    with fine_timer_slack(), asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)
