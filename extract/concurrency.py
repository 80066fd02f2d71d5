"""How many requests are in flight at once: :class:`AdaptiveConcurrency` (AIMD, with a slow
start), never below what the pace needs at the latency seen (Little's law), so the pace of
:class:`membersync.extract.limits.RateLimiter` is the politeness and the concurrency never starves
it. Its waiters are served by rank (:func:`work_started`: a night's earlier batch first), then in
arrival order. Every number is in :mod:`membersync.extract.constants`.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from membersync.extract import constants as K

# The rank of the work a request belongs to (0: outside any ranked work); tasks inherit it.
_RANK: ContextVar[int] = ContextVar("membersync_request_rank", default=0)
_STARTS = itertools.count(1)  # ranks only order waiters of one semaphore: one counter serves all


@contextmanager
def work_started() -> Iterator[None]:
    """Requests made in this block, and in the tasks it starts, rank by when the block began:
    an earlier batch's requests (its second round too) take the next free slot before a later
    batch's, so batches end in turn instead of together (the pipeline never drains)."""
    token = _RANK.set(next(_STARTS))
    try:
        yield
    finally:
        _RANK.reset(token)


class AdaptiveConcurrency:
    """A semaphore whose size adapts: x ``CONCURRENCY_DECREASE`` on a 429 that cut the pace;
    while saturated, +1 per success until then (slow start), then +1 per window of successes;
    never below what the pace needs at the latency seen (:meth:`keep_up`). Waiters are served
    by rank (:func:`work_started`), then in arrival order."""

    def __init__(
        self, maximum: int = K.MAX_CONCURRENCY, *, initial: int | None = None, adaptive: bool = True
    ):
        if maximum < 1:
            raise ValueError("max_concurrency must be >= 1")
        self.maximum = maximum
        self.adaptive = adaptive
        start = maximum if not adaptive else (initial or K.INITIAL_CONCURRENCY)
        self.limit = float(max(1, min(start, maximum)))
        self.in_flight = 0
        # (rank, arrival, future); a cancelled waiter's entry stays until it surfaces (removing
        # it is O(n), and a failing night cancels thousands at once); ``waiting`` counts the live.
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()
        self.waiting = 0
        self._slow_start = adaptive  # until the first cut: +1 per success, not per window

    async def acquire(self) -> None:
        if self.in_flight < int(self.limit) and not self.waiting:
            self.in_flight += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (_RANK.get(), next(self._arrivals), fut))
        self.waiting += 1
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # granted just as we were cancelled: hand the slot on
            else:
                self.waiting -= 1
                if not self.waiting:
                    self._waiters.clear()  # only cancelled entries are left
            raise

    def release(self, success: bool = False) -> None:
        # grow only while the limit is the bottleneck (requests waiting, or every slot taken)
        saturated = self.waiting or self.in_flight >= int(self.limit)
        if success and saturated and self.adaptive and self.limit < self.maximum:
            step = 1.0 if self._slow_start else 1.0 / self.limit
            self.limit = min(float(self.maximum), self.limit + step)
        self.in_flight -= 1
        self._wake()

    def on_rate_limited(self) -> None:
        """The pace was cut (once per 429 episode): fewer in flight too."""
        if self.adaptive:
            self._slow_start = False
            self.limit = max(1.0, self.limit * K.CONCURRENCY_DECREASE)

    def keep_up(self, rate: float | None, latency: float) -> None:
        """Keep room for ``rate x latency`` requests in flight (Little's law) with
        ``CONCURRENCY_HEADROOM``: the pace, which is the politeness, is never starved."""
        if rate is None or not self.adaptive:
            return
        needed = min(float(self.maximum), rate * latency * K.CONCURRENCY_HEADROOM + 2.0)
        if needed > self.limit:
            self.limit = needed
            self._wake()

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters and self.in_flight < int(self.limit):
            fut = heapq.heappop(waiters)[2]
            if fut.done():  # cancelled while waiting (counted then)
                continue
            self.waiting -= 1
            self.in_flight += 1
            fut.set_result(None)
