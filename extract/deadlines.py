"""Coarse deadlines: every attempt in flight checked by one timer, not one timer each.

An attempt has two deadlines: the whole attempt's (``request_timeout``: a server that trickles a
byte now and then must not hold a request for ever) and the read timeout (``read_timeout``: no
byte of the answer for that long). Kept the usual way, ``asyncio.timeout()`` arms a timer per
attempt (a heap push, then a cancel) and aiohttp's read timeout re-arms one on every chunk
received, for deadlines that almost never fire: 4,000-client nights against one sandbox,
alternating, used a median 10.78 s of CPU that way and 9.94 s with this module (6 pairs, 2026-11-26).

Here one timer, armed only while attempts are in flight, ticks every :attr:`Deadlines.tick`
seconds and expires each attempt past a deadline the way :class:`asyncio.Timeout` does: it
cancels the attempt's task, and the attempt's exit turns that cancellation (and only that one: a
cancellation from elsewhere stays one) into the builtin ``TimeoutError``. (An unarmed
``asyncio.Timeout`` per attempt, rescheduled to expire, did the same for 5.1 us an attempt
against 2.1 us, 2026-11-27; the deadlines themselves are on ``time.monotonic``.) Until the
answer's headers the read timeout counts from the attempt's start plus ``connect_timeout``:
aiohttp started it once connected and sent, which it does not tell, and a connect is bounded on
its own, so this does not fire before the read timeout of old would have. (Counted from the
start alone, a loaded host took a slow connect for a read timeout, and a POST never sent for one
that may have been, in CI.) Then it restarts whenever the body has grown since the last tick
(:meth:`Watch.reading`). A deadline fires at most one tick late; the tick is a quarter of the
shorter timeout, at most :data:`~membersync.extract.constants.DEADLINE_TICK`.
"""

from __future__ import annotations

import asyncio
import math
import time
from types import TracebackType
from typing import Protocol

from membersync.extract import constants


class _Stream(Protocol):
    """What a body's progress is read from (aiohttp's ``StreamReader``)."""

    total_bytes: int


class Watch:
    """One attempt's deadlines; an async context manager around the attempt (inside a task)."""

    __slots__ = (
        "_cancelling",
        "_deadlines",
        "_entered",
        "_task",
        "deadline",
        "expired",
        "read_deadline",
        "seen",
        "stream",
    )

    def __init__(self, deadlines: Deadlines, deadline: float, read_deadline: float) -> None:
        self._deadlines = deadlines
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self._entered = False
        self.deadline = deadline
        self.read_deadline = read_deadline
        self.stream: _Stream | None = None
        self.seen = 0
        self.expired = False

    def reading(self, stream: _Stream) -> None:
        """The answer's headers are in: from now on the read timeout restarts while ``stream``
        (its body) grows."""
        self.stream = stream
        self.seen = stream.total_bytes
        self.read_deadline = min(self.deadline, time.monotonic() + self._deadlines.read_timeout)

    async def __aenter__(self) -> Watch:
        if self._entered:
            raise RuntimeError("a Watch is entered once (Deadlines.attempt() makes one per attempt)")
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("an attempt's deadlines are kept inside a task")
        self._entered = True
        self._task = task
        self._cancelling = task.cancelling()  # cancellations already asked for are not ours
        self._deadlines.add(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._deadlines.discard(self)
        task, self._task = self._task, None  # (an expire() from now on does nothing)
        if self.expired and task is not None:
            # As asyncio.Timeout: withdraw our cancellation whatever the exit (the task's count
            # must balance); if no other one was asked for meanwhile, it was a timeout.
            ours_alone = task.uncancel() <= self._cancelling
            if ours_alone and exc_type is not None and issubclass(exc_type, asyncio.CancelledError):
                raise TimeoutError from exc

    def expire(self) -> None:
        """Past a deadline: cancel the attempt. Its exit turns that cancellation into
        ``TimeoutError``, unless the attempt swallowed it or was also cancelled from elsewhere."""
        if self._task is not None and not self.expired:
            self.expired = True
            self._task.cancel()


class Deadlines:
    """The deadlines of one client's attempts (one event loop)."""

    def __init__(
        self, *, read_timeout: float | None, request_timeout: float, connect_timeout: float = 0.0
    ) -> None:
        if request_timeout <= 0 or (read_timeout is not None and read_timeout <= 0) or connect_timeout < 0:
            raise ValueError("timeouts must be > 0 s")
        self.connect_timeout = connect_timeout  # (before the headers, on top of the read timeout)
        # None: the read timeout is the transport's own (httpx keeps one per read)
        self.read_timeout = read_timeout if read_timeout is not None else math.inf
        self.request_timeout = request_timeout
        shortest = min(self.read_timeout, request_timeout)
        self.tick = min(constants.DEADLINE_TICK, shortest / 4)
        self._watches: set[Watch] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tick: asyncio.TimerHandle | None = None

    def attempt(self) -> Watch:
        """The deadlines of an attempt starting now: ``async with deadlines.attempt() as watch:``
        around the attempt."""
        now = time.monotonic()
        deadline = now + self.request_timeout
        return Watch(self, deadline, min(deadline, now + self.connect_timeout + self.read_timeout))

    def add(self, watch: Watch) -> None:
        self._watches.add(watch)
        loop = asyncio.get_running_loop()
        if self._tick is None or loop is not self._loop:  # (a client used from a new loop)
            self._loop = loop
            self._tick = loop.call_later(self.tick, self._check)

    def discard(self, watch: Watch) -> None:
        self._watches.discard(watch)

    def _check(self) -> None:
        """The tick: expire the attempts past a deadline; tick again while any is in flight."""
        loop = self._loop
        assert loop is not None
        try:
            self._expire_overdue()
        finally:  # (an error here must not stop the ticks: every later deadline depends on them)
            self._tick = loop.call_later(self.tick, self._check) if self._watches else None

    def _expire_overdue(self) -> None:
        now = time.monotonic()
        expired = []
        for watch in self._watches:
            if now >= watch.deadline:
                expired.append(watch)
                continue
            stream = watch.stream
            if stream is not None and stream.total_bytes != watch.seen:
                watch.seen = stream.total_bytes
                watch.read_deadline = min(watch.deadline, now + self.read_timeout)
            elif now >= watch.read_deadline:
                expired.append(watch)
        for watch in expired:
            self._watches.discard(watch)  # expired once; its exit finds it gone
            watch.expire()

    def __len__(self) -> int:
        return len(self._watches)
