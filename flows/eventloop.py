"""The event loop a night runs on: uvloop's where it is installed, else asyncio's own.

A night is a few hundred thousand HTTP requests on one event loop, and the loop's own work
(callbacks, timers, transports) was about a quarter of our CPU per request (py-spy of an
unlimited night: 0.092 of 0.387 ms under ``asyncio/``). uvloop runs that loop in C: 4,000-client
nights alternating with and without it used 10.1-12.9 s CPU against 12.5-14.1 s (README,
"CPU per request"). uvloop is a dependency wherever it builds (not on Windows), so a missing one
means such a platform, and the night runs on asyncio's loop.

:func:`run` is ``asyncio.run`` on that loop, for the commands' nights (``membersync sync``, with
Prefect or without, and :func:`~membersync.flows.nightly.run_night`). A flow run that Prefect
starts itself (a deployment on a work pool) runs on the loop Prefect makes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's ``new_event_loop`` if uvloop is installed, else None (asyncio's default loop)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)`` on the loop of :func:`loop_factory` (``asyncio.Runner``: Python 3.11)."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(coro)
