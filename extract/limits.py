"""Politeness: how fast and how many at once we ask the server.

A nightly sync sends hundreds of thousands of requests to a server that rate-limits per
credential (a token bucket; beyond it, 429 with ``Retry-After``). We do not know its rate,
so we find it, and stay just under it:

- :class:`RateLimiter` paces requests with a client-side token bucket (GCRA: one
  "theoretical arrival time", no background task) at ``rate`` req/s. The rate is adapted
  AIMD-style: unlimited (or the explicit cap) until the first 429, then cut to
  ``RATE_DECREASE`` x the throughput just seen, once per 429 episode; each success adds
  ``RATE_INCREASE`` req/s (about +2 %/s, faster the longer no 429 came), but only while the
  rate is what holds us back.
  A ``Retry-After`` pauses **every** request (a shared cool-down), not just the one that
  was refused: the server said it is out of tokens for everyone.
- :class:`AdaptiveConcurrency` bounds the requests in flight; it shrinks on a 429 and
  grows by one per "window" of successes while it is the bottleneck (AIMD again).

Both are cheap per request: a few float operations, and a sleep only when we must wait.
Everything takes an injectable ``clock`` and ``sleep`` so that tests never wait.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable

from membersync.extract import constants

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class RateLimiter:
    """Client-side rate (req/s) with AIMD adaptation and a shared ``Retry-After`` cool-down."""

    def __init__(
        self,
        *,
        cap: float | None = None,
        adaptive: bool = True,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if cap is not None and cap <= 0:
            raise ValueError("rate cap must be > 0 req/s (or None for no cap)")
        self.cap = cap
        self.adaptive = adaptive
        self._clock = clock
        self._sleep = sleep
        self.rate: float | None = cap  # None = unlimited
        self._tat = 0.0  # theoretical arrival time of the next request (GCRA)
        self.cooldown_until = 0.0
        self._last_decrease = 0.0
        self.decreases = 0
        # Successes per second while we were allowed to send: a window starts at the first
        # answer and again when a cool-down ends (paused time would make the estimate useless).
        self._window_start: float | None = None
        self._window_count = 0
        self.throughput = 0.0  # over the last full window

    # -- before a request ------------------------------------------------------------------

    async def wait_turn(self) -> None:
        """Wait for the cool-down to end and for this request's slot at the current rate."""
        clock, sleep = self._clock, self._sleep
        while True:
            pause = self.cooldown_until - clock()
            if pause > 0:
                await sleep(pause)
                continue
            rate = self.rate
            if rate is None:
                return
            now = clock()
            interval = 1.0 / rate
            tat = self._tat if self._tat > now else now
            self._tat = tat + interval
            go = tat - constants.RATE_BURST * interval  # a slot may be taken this early
            if go <= now:
                return
            await sleep(go - now)
            if self.cooldown_until <= clock():
                return
            # a cool-down began while we waited for our slot: take a new one after it, so that
            # the requests held back do not all leave together when it ends

    # -- after an answer -------------------------------------------------------------------

    def on_success(self, now: float) -> None:
        """A successful answer at ``now``: counts for the throughput, and grows the rate."""
        start = self._window_start
        if start is None:
            self._window_start, self._window_count = now, 1
        elif now >= start:  # answers to requests sent before a cool-down began are not counted
            self._window_count += 1
            elapsed = now - start
            if elapsed >= constants.THROUGHPUT_WINDOW:
                self.throughput = self._window_count / elapsed
                self._window_start, self._window_count = now, 0
        rate = self.rate
        if rate is None or not self.adaptive:
            return
        # Grow only while the rate is what limits us; a rate far above what we achieve
        # (because concurrency or the caller is the bottleneck) would make the next cut useless.
        if self.throughput and rate > 1.25 * self.throughput + 1.0:
            return
        # The longer since the last 429, the faster we probe (the limit may have been far above
        # a cut that was too deep): +2 %/s at first, +4 %/s after 10 s, +8 %/s after 30 s, ...
        calm = now - self._last_decrease if self._last_decrease > 0 else 0.0
        rate += constants.RATE_INCREASE * (1.0 + calm / constants.RATE_ACCELERATION_SECONDS)
        self.rate = rate if self.cap is None or rate < self.cap else self.cap

    def on_rate_limited(self, started: float, retry_after: float | None) -> bool:
        """A 429 for a request sent at ``started``. Returns True when the rate was cut."""
        now = self._clock()
        observed = self._observed(now)
        if retry_after:
            until = now + retry_after
            if until > self.cooldown_until:
                self.cooldown_until = until
                self._tat = max(self._tat, until)
                self._window_start, self._window_count = until, 0  # measure again after the pause
        if not self.adaptive or started < self._last_decrease:
            return False  # same episode: the requests in flight at the first 429 also get one
        self._last_decrease = now
        current = self.rate if self.rate is not None else observed
        if current is None:  # refused before we saw any throughput: the cool-down must do
            return False
        new = max(constants.MIN_RATE, current * constants.RATE_DECREASE)
        self.rate = new if self.cap is None else min(new, self.cap)
        self.decreases += 1
        return True

    def _observed(self, now: float) -> float | None:
        """Successes per second just before now (the running window when it has enough)."""
        start, count = self._window_start, self._window_count
        if start is not None and count >= 2 and now > start:
            return count / max(now - start, 0.02)
        return self.throughput or None


class AdaptiveConcurrency:
    """A semaphore whose size adapts: x ``CONCURRENCY_DECREASE`` on 429, +1 per window of successes."""

    def __init__(
        self,
        maximum: int = constants.MAX_CONCURRENCY,
        *,
        initial: int | None = None,
        minimum: int = constants.MIN_CONCURRENCY,
        adaptive: bool = True,
    ) -> None:
        if maximum < 1:
            raise ValueError("max_concurrency must be >= 1")
        self.maximum = maximum
        self.minimum = max(1, min(minimum, maximum))
        self.adaptive = adaptive
        start = maximum if not adaptive else (initial or constants.INITIAL_CONCURRENCY)
        self.limit = float(max(self.minimum, min(start, maximum)))
        self.in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._last_decrease = float("-inf")

    async def acquire(self) -> None:
        if self.in_flight < int(self.limit) and not self._waiters:
            self.in_flight += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # granted just as we were cancelled: hand the slot on
            else:
                self._waiters.remove(fut)
            raise

    def release(self, success: bool = False) -> None:
        # grow only while the limit is the bottleneck (requests waiting, or every slot taken)
        saturated = self._waiters or self.in_flight >= int(self.limit)
        if success and saturated and self.adaptive and self.limit < self.maximum:
            self.limit = min(float(self.maximum), self.limit + 1.0 / self.limit)
        self.in_flight -= 1
        self._wake()

    def on_rate_limited(self, started: float, now: float) -> None:
        if not self.adaptive or started < self._last_decrease:
            return
        self._last_decrease = now
        self.limit = max(float(self.minimum), self.limit * constants.CONCURRENCY_DECREASE)

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters and self.in_flight < int(self.limit):
            fut = waiters.popleft()
            if fut.done():
                continue
            self.in_flight += 1
            fut.set_result(None)
