"""How many requests are in flight at once: :class:`AdaptiveConcurrency` (AIMD, with a slow
start), never below what the pace needs at the latency seen (Little's law), so the pace of
:class:`membersync.extract.limits.RateLimiter` is the politeness and the concurrency never starves
it. Its waiters are served by rank (:func:`work_started`: a night's earlier batch first), then in
arrival order. Every number is in :mod:`membersync.extract.constants`.

**A server's cap on requests in flight** (429 when more than N are open at once) is
:class:`InFlightCap`'s: learned from the 429s themselves, it holds how many are on the wire.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import deque
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


class InFlightCap:
    """A server's cap on requests in flight, learned from its 429s; at most that many on the wire.

    Each request notes how many were on the wire when it was sent, itself included (its
    *level*). A 429 at a level the server, over its last ``CAP_EVIDENCE`` answers, refused at
    least as often as it accepted, while it accepted the level below and refused nothing at any
    level below (a cap of N never refuses a request sent with N or fewer on the wire: the server
    counts no more than we do), is a cap's and not a pace's: the level below is the cap, and a
    request beyond it waits
    for one on the wire to be answered (the adaptive limit's slots also hold those waiting for the
    pace, so the cap gates the wire itself). A token bucket refuses at every level about as often
    as it accepts there (an emptied bucket's volley at every level at once: a cap read from its
    counts alone held a night at 3 on the wire, 92 % of a 200/s bucket), so its 429s stay the
    pace's; a cap mistaken from the top of its levels
    costs little, and every ``CAP_PROBE_SECONDS`` at a cap one more is let on the wire: a real
    cap refuses it (one 429, and the cap is learned again), a mistaken one lifts.
    """

    def __init__(self, maximum: int = K.MAX_CONCURRENCY, *, adaptive: bool = True) -> None:
        self.maximum = maximum
        self.adaptive = adaptive
        self.on_wire = 0
        self.cap: int | None = None  # learned (:meth:`refused`); None: none known
        self._since = 0.0  # when the cap was last set
        # (rank, arrival, future), served by rank as the slots are: a cap held on the wire
        # still lets a night's earlier batch end first (a cancelled entry surfaces and is skipped)
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()
        # the last CAP_EVIDENCE answers: (level, accepted), and their counts by level
        self._answers: deque[tuple[int, bool]] = deque()
        self._accepted_at = [0] * (maximum + 2)
        self._refused_at = [0] * (maximum + 2)

    async def sent(self) -> int:
        """Wait for room on the wire under a learned cap; the request's level."""
        while self.cap is not None and self.on_wire >= self.cap:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiters, (_RANK.get(), next(self._arrivals), fut))
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self._wake()  # woken just as it was cancelled: wake the next instead
                raise
        self.on_wire += 1
        return self.on_wire

    def done(self) -> None:
        """A request that :meth:`sent` is off the wire (answered, or failed)."""
        self.on_wire -= 1
        self._wake()

    def accepted(self, level: int, now: float) -> None:
        """A success sent at ``level``; after ``CAP_PROBE_SECONDS`` at a cap, one more allowed."""
        self._note(level, True)
        cap = self.cap
        if cap is not None and cap < self.maximum and now - self._since >= K.CAP_PROBE_SECONDS:
            self.cap, self._since = cap + 1, now
            self._wake()

    def refused(self, level: int, now: float) -> bool:
        """A 429 for a request sent at ``level``: True when it is a cap's (see the class)."""
        index = self._note(level, False)
        if not self.adaptive or index < 2:
            return False
        refused, accepted = self._refused_at, self._accepted_at
        if refused[index] < accepted[index] or not accepted[index - 1] or any(refused[1:index]):
            return False  # refused no more here than taken, or anything refused below: the pace's
        self.cap, self._since = index - 1, now
        return True

    def _note(self, level: int, ok: bool) -> int:
        index = min(level, self.maximum + 1)
        answers = self._answers
        answers.append((index, ok))
        (self._accepted_at if ok else self._refused_at)[index] += 1
        if len(answers) > K.CAP_EVIDENCE:
            old, old_ok = answers.popleft()
            (self._accepted_at if old_ok else self._refused_at)[old] -= 1
        return index

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters and (self.cap is None or self.on_wire < self.cap):
            fut = heapq.heappop(waiters)[2]
            if not fut.done():
                fut.set_result(None)
                return
