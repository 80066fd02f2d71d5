"""Politeness: how fast and how many at once we ask the server.

A nightly sync sends hundreds of thousands of requests to a server that rate-limits per
credential (a token bucket; beyond it, 429 with ``Retry-After``). We do not know its rate,
so we find it, and stay just under it:

- :class:`RateLimiter` paces requests with a client-side token bucket (GCRA: one
  "theoretical arrival time", no background task) at ``rate`` req/s. The rate is found:
  unlimited (or the explicit cap, or the rate a previous night found) until the first 429,
  then ``RATE_MARGIN`` under what the server accepted, once per 429 episode (``RATE_DECREASE``
  x what we sent only when too few answers came to measure); from there it probes upward per
  second (``RATE_PROBE_*``), slowly near the estimate, only while the rate is what holds us back.
  A ``Retry-After`` pauses **every** request (a shared cool-down), not just the one that
  was refused: the server said it is out of tokens for everyone (but not a short one after
  jitter at a bucket known to hold one token: see the class).
- :class:`AdaptiveConcurrency` bounds the requests in flight; it shrinks on a 429 and
  grows while it is the bottleneck: by one per success until the first 429 (a slow start,
  doubling every round trip), then by one per "window" of successes (AIMD again). Once we
  pace, it never holds back the pace: it keeps at least what the rate needs at the latency
  seen (Little's law, ``rate x latency``, with headroom); the rate is the politeness.
  Its waiters are served by rank, then in arrival order: requests made inside
  :func:`work_started` (a night's batch) go ahead of those of a batch started later, so
  a batch's last requests are not queued behind the next batch's first thousands.

Both are cheap per request: a few float operations, and a sleep only when we must wait.
Everything takes an injectable ``clock`` and ``sleep`` so that tests never wait.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from membersync.extract import constants, eventloop

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class RateLimiter:
    """Client-side rate (req/s): found from what the server accepts, paced smoothly.

    * **Pacing** (GCRA): one request every ``1/rate`` s. Before the first 429 a request may
      leave one interval early (timer jitter); after any 429 that is acted on, none does. One
      woken late keeps the schedule (the next leaves on time) until a 429 on a pair that caught
      up so: a server whose bucket holds a single token refuses any two requests closer than
      its interval. A late wake-up is then pace lost, and each later lone 429 steps the pace
      back a little. So catching up stops only where a late wake-up is a small share of the
      interval: on the night's own event loop (:mod:`membersync.extract.eventloop`), whose
      timer fires ~0.15 ms late (p50), at a pace of at most ``CATCH_UP_KEPT_ABOVE_PRECISE``;
      on asyncio's default loop, ~1 ms late, at most ``CATCH_UP_KEPT_ABOVE``, and there the
      last ``SETTLE_WAIT`` of each wait is slept off the loop's timer. Each slot's wake-up is
      aimed early by a low quantile of how late wake-ups come (``LEAD_*``), and a request that
      left late to open a connection moves the next slot (:meth:`departed_late`).
    * **Finding the limit**: unlimited (or the explicit cap, or the rate a previous night
      found: ``initial``) until the first 429. Unpaced, requests leave in bunches, so that
      first 429 only sets the pace at what was accepted (a floor: no estimate yet) and the
      slow start goes on, paced. On a paced 429 the server's rate is estimated from
      what it *accepted* over the last seconds of sending (pauses excluded), the lower of that
      and the rate we were sending at: we were above the limit, so the accepted rate is the
      limit (plus what its bucket held). The pace drops to ``ceiling x (1 - RATE_MARGIN)``,
      once per 429 episode, not halved on every 429. (The first 429 after a rough cut, at the top
      of the climb back, is the pace passing the limit: the level is that pace, less the margin.)
      An *isolated* 429 (one in the last second, or under ``SUSTAINED_REFUSALS`` of its answers;
      at a bucket known to hold one token two, or under ``ONE_TOKEN_SUSTAINED_REFUSALS``: above
      that bucket's limit every other request is refused) is jitter at a small bucket, not the
      pace: while such 429s stay under ``REFUSALS_TOLERATED`` of the last ``TALLY_SECONDS`` they
      cost only the pause, above it each is a small step back (and above twice it, of the estimate
      too). (The 429s of requests sent unpaced are not in that tally: a discovery's bunch says
      nothing of a pace.) A lone 429 too soon after a lull to measure anything, at a pace of at
      least ``LULL_MIN_RATE`` and no higher than the level settled, costs its pause (at a bucket
      known to hold one token, nothing: no pause there either, below).
    * **Probing**: without an estimate (a 429 before enough answers to measure) the rate
      grows x2.7 a second (``RATE_PROBE_START``, a slow start); well below ``ceiling`` it grows
      fast (``RATE_PROBE_FAR`` per second); near it, very slowly (``RATE_PROBE_NEAR``), so a
      night sits just under the limit and meets a 429 (and its ``Retry-After`` pause) rarely;
      once no 429 came for ``PROBE_QUIET_SECONDS`` (and ``PROBE_QUIET_ANSWERS`` answers' time),
      faster and faster (the estimate was too low). Near it the climb is also at most 1 % per
      200 answers (``RATE_PROBE_NEAR_PER_ANSWER``): each cycle ends in a 429, so at a low rate a
      cycle in seconds would refuse a larger share of the answers (1 % at 20 req/s, measured).
      At a bucket known to hold one token it is only that, at any rate: capped per second too,
      it drew a fifth of the 429s allowed at 200 req/s, and held the pace well under the limit.
      The probe only runs while the rate is what holds us back.
    * **A server that announces its limit** (:meth:`on_announced`) is obeyed exactly: its rate
      less ``ANNOUNCED_MARGIN`` becomes the cap, and an exhausted quota pauses every request
      until it resets.
    * The refused request waits its ``Retry-After``; every other request pauses too (a shared
      cool-down): for the whole ``Retry-After`` when it is long (the server is out for a
      while), for two intervals at the pace the 429 was sent at when it is a token bucket's
      rounded-up second. Not at all after an isolated 429 (jitter, as above) at a bucket known
      to hold one token, when its ``Retry-After`` is short: a token bucket takes no token for a
      request it refuses, so the next slot, an interval on, finds one; a streak there pauses
      (once it is one: over ``ONE_TOKEN_SUSTAINED_REFUSALS``). Unpaced, a pause is never shorter
      than ``MIN_PAUSE``, so a ``Retry-After: 0`` or a date in the past cannot make us spin;
      paced, the pace keeps us from spinning (and 50 ms a 429 would cost a quarter of the pace
      at 500 req/s).
    """

    def __init__(
        self,
        *,
        cap: float | None = None,
        initial: float | None = None,
        adaptive: bool = True,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        settle: Callable[[float], None] | None = None,
    ) -> None:
        if cap is not None and cap <= 0:
            raise ValueError("rate cap must be > 0 req/s (or None for no cap)")
        if initial is not None and initial <= 0:
            raise ValueError("initial rate must be > 0 req/s (or None)")
        self.cap = cap
        self.adaptive = adaptive
        self._clock = clock
        self._sleep = sleep
        # Sleeps the last moment of a wait without the event loop (see wait_turn); only beside the
        # real clock: an injected ``sleep`` (a test's) is the only way its time passes.
        self._settle = settle if settle is not None else (time.sleep if sleep is asyncio.sleep else None)
        # Does the loop's timer fire when due (extract/eventloop.py)? Then no wait is slept blocking,
        # and catching up stops up to a higher pace. Known at the first wait.
        self._precise_timers: bool | None = None
        self.announced: float | None = None  # the server's own word (RateLimit-* headers)
        self.ceiling: float | None = initial  # the server's rate as estimated at the last 429
        # The level the last cut settled on: the probe raises ``ceiling`` past it, unrefused.
        self._settled: float | None = initial
        start = initial * (1 - constants.RATE_MARGIN) if initial and adaptive else None
        self._rate: float | None = self._capped(start) if start else cap  # None = unlimited
        # Since when the requests are paced (-inf: from the start; None: not yet; see ``rate``).
        self._paced_since: float | None = -math.inf if self._rate is not None else None
        # Intervals a request may leave early (timer jitter), 0 after a 429; none at a rate a
        # previous night found: it is the server's, and a one-token bucket refused the pair that
        # left 0.4 ms apart at a night's start (traced).
        self._early = constants.RATE_BURST if initial is None else 0.0
        # How far behind its schedule a late request may still take its slot (catching up keeps
        # the pace through the loop's late wake-ups). 0 after an isolated refusal: the
        # server's bucket is too small for two requests closer than an interval.
        self._catch_up = 1.0
        # When the last paced requests left: was a refused one sent closer than the interval to
        # the one before it (a one-token bucket's refusal), or on schedule (a drained bucket's)?
        self._granted: deque[float] = deque(maxlen=constants.GRANTS_KEPT)
        self._tat = 0.0  # theoretical arrival time of the next request (GCRA)
        self._lead = 0.0  # how early a slot's wake-up is aimed: a low quantile of its lateness
        self._queue = asyncio.Lock()  # FIFO: the requests waiting for their slot
        self.cooldown_until = 0.0
        self._last_decrease = 0.0
        self._last_refusal: float | None = None  # when the last 429 came
        self._streak_start = 0.0  # when the 429s of the current streak began
        self.latency = 0.0  # seconds, a moving average of the successes' latency
        self._last_grow: float | None = None
        # When the pace last grew fast, far under the estimate (or a rough cut's bound): a 429
        # within a window of it came at the top of a climb (see on_rate_limited).
        self._ramped_at: float | None = None
        self._leveled_at: float | None = None  # when a 429's estimate last set the level
        self.decreases = 0
        # When the answers of the last ACCEPT_WINDOW s came, and the shared pauses meanwhile:
        # what the server accepted per second of sending (the estimate of its limit).
        self._accepted: deque[float] = deque()
        self._pauses: deque[tuple[float, float]] = deque()
        self._refused: deque[float] = deque()
        # Answers accepted so far, and at the last 429 the count then and the tokens the server's
        # bucket got back during the pause that followed it: how far above the limit a pace is
        # (see _overshoot).
        self._accepted_count = 0
        self._accepted_at_refusal = 0
        self._refilled_at_refusal: float | None = None
        self._first_answer: float | None = None
        # [second, answers, refusals] over the last TALLY_SECONDS: the share of 429s a night draws
        self._tally: deque[list[int]] = deque()
        # Successes per second over THROUGHPUT_WINDOW: is the rate what holds us back?
        self._window_start: float | None = None
        self._window_count = 0
        self.throughput = 0.0

    @property
    def rate(self) -> float | None:
        """The pace in req/s; None while unlimited."""
        return self._rate

    @rate.setter
    def rate(self, value: float | None) -> None:
        # The first pace marks when pacing began: the 429s of requests sent before it (a
        # discovery's unpaced bunch) say nothing of a pace and stay out of the tally.
        if value is not None and self._paced_since is None:
            self._paced_since = self._clock()
        self._rate = value

    @property
    def found(self) -> float | None:
        """The server's rate as the last cut settled it (for the next night to start at), or
        ``ceiling`` when no cut did.

        Not ``ceiling`` itself: the probe raises it past the last cut while no 429 comes, and a
        big bucket lets the probe run well past the limit (remembered up to 66.1 req/s for a limit
        of 50 with a bucket of 20, 69.3 with one of 50, measured): the next night began above it.
        """
        settled, ceiling = self._settled, self.ceiling
        if settled is None or ceiling is None:
            return ceiling
        return min(settled, ceiling)

    def _capped(self, rate: float) -> float:
        for limit in (self.cap, self.announced):
            if limit is not None and rate > limit:
                rate = limit
        return max(constants.MIN_RATE, rate)

    # -- before a request ------------------------------------------------------------------

    async def wait_turn(self) -> None:
        """Wait for the cool-down to end and for this request's slot at the current rate.

        Waiters queue (FIFO) and only the head sleeps, for its own slot: slots are not booked
        ahead, so a rate that grows (or a pause that begins) applies to every waiter at once.
        """
        if self._rate is None and self.cooldown_until <= self._clock():
            return  # unlimited, no pause: the fast path
        async with self._queue:
            clock, sleep = self._clock, self._sleep
            if self._precise_timers is None:  # the first wait: on which loop?
                self._precise_timers = eventloop.precise_timers(asyncio.get_running_loop())
            target: float | None = None  # when the last sleep for this request's slot was due
            while True:
                now = clock()
                pause = self.cooldown_until - now
                if pause > 0:
                    await sleep(pause)
                    target = None
                    continue
                rate = self._rate
                if rate is None:
                    return
                interval = 1.0 / rate
                # Keep the schedule through a late wake-up (the loop's timer is ~1 ms late): a
                # slot up to one interval old is still granted, so the pace stays the rate. At a
                # small bucket that catching up is what draws 429s: then a late request moves
                # the schedule, and the probe makes up the pace the late wake-ups cost.
                tat = self._tat if self._tat > now - self._catch_up * interval else now
                # Aimed ``_lead`` early: a wake-up is never on time (see _learn_lateness).
                go = tat - self._early * interval - self._lead
                if go <= now:
                    self._tat = tat + interval
                    self._granted.append(now)
                    if target is not None:
                        self._learn_lateness(now - target, interval)
                    return
                wait, settle = go - now, self._settle
                target = go
                if self._catch_up == 0.0 and settle is not None and not self._precise_timers:
                    # Not catching up, a late wake-up is pace lost, and asyncio's default timer is
                    # ~1 ms late (epoll rounds up to the next ms; 0.7 ms from its typical to its
                    # least, 3.5 % of 50 req/s): the last moment is slept blocking, to ~0.1 ms. At
                    # most SETTLE_WAIT per request, under CATCH_UP_KEPT_ABOVE req/s: a small share
                    # of the loop. (The night's own loop needs none of it: extract/eventloop.py.)
                    if wait <= constants.SETTLE_WAIT:
                        settle(wait)
                        continue
                    wait -= constants.SETTLE_WAIT
                await sleep(wait)

    def departed_late(self) -> None:
        """The request given the last slot leaves only now (it had to open a connection): the
        next slot is an interval from now, not from its grant, so the two do not reach a small
        bucket closer than the interval (see :class:`~membersync.extract.client`'s connector)."""
        rate = self._rate
        if rate is not None:
            self._tat = max(self._tat, self._clock() + 1.0 / rate)

    def _learn_lateness(self, late: float, interval: float) -> None:
        """Track a low quantile (``LEAD_QUANTILE``) of how late a slot's wake-up came, and aim
        the next that much early.

        A wake-up is never on time: the loop's timer, the kernel's timer slack, and the answers
        read before the waiting request runs again make it 0.05-0.3 ms late on the night's loop
        (p50 0.15 ms under a night's load, traced). Not catching up (a one-token bucket), each of
        those is pace lost: 3.7 % at 200 req/s, where the pace was 195.5 req/s and the server saw
        188. Aimed a low quantile early, a wake-up comes a little early only that often, and by
        at most the spread under that quantile (a few hundredths of a millisecond); the pace
        lost is what is left above it. (A stochastic quantile: a step per wake-up, no history.)
        """
        step = constants.LEAD_STEP
        if late <= self._lead:
            lead = self._lead - step * (1.0 - constants.LEAD_QUANTILE)
        else:
            lead = self._lead + step * constants.LEAD_QUANTILE
        self._lead = min(max(0.0, lead), constants.LEAD_MAX_SHARE * interval)

    # -- after an answer -------------------------------------------------------------------

    def on_success(self, now: float, latency: float | None = None) -> None:
        """A successful answer at ``now`` (``latency`` s after it was sent): counts for the
        estimate, and may grow the rate."""
        self._count_accepted(now)
        if latency is not None:
            self.latency += (latency - self.latency) * constants.LATENCY_SMOOTHING
        self._tally_answer(now, refused=0)
        start = self._window_start
        if start is None:
            self._window_start, self._window_count = now, 1
        elif now >= start:  # answers to requests sent before a cool-down began are not counted
            self._window_count += 1
            elapsed = now - start
            if elapsed >= constants.THROUGHPUT_WINDOW:
                self.throughput = self._window_count / elapsed
                self._window_start, self._window_count = now, 0
        rate = self._rate
        if rate is None or not self.adaptive:
            return
        last, self._last_grow = self._last_grow, now
        if last is None or now <= last:
            return
        # Grow only while the rate is what limits us; a rate far above what we achieve
        # (because concurrency or the caller is the bottleneck) would make the next cut useless.
        # Requests waiting for their slot say it is the rate; the throughput says so a latency
        # and a window late, which held a slow start at 200 ms to a third of its growth.
        if not self._queue.locked() and self.throughput and rate > 1.5 * self.throughput + 2.0:
            return
        ceiling = self.ceiling
        if ceiling is not None and rate > ceiling and self.announced is None:
            ceiling = self.ceiling = rate  # past the estimate without a refusal: it was low
        if ceiling is None:  # no estimate yet (a rough first cut): x2.7 a second
            growth = constants.RATE_PROBE_START
        elif rate >= ceiling * (1 - 2 * constants.RATE_MARGIN):
            # Near the estimate, slowly; once no 429 came for PROBE_QUIET_SECONDS, faster and faster
            # (doubling every RATE_PROBE_DOUBLING s, up to RATE_PROBE_FAR): an estimate taken at
            # a bad moment (discovery's burst emptying a bucket) must not hold a night far under
            # the limit, and at the limit a 429 comes well before then.
            since = now - (self._last_refusal if self._last_refusal is not None else now)
            wait = max(constants.PROBE_QUIET_SECONDS, constants.PROBE_QUIET_ANSWERS / rate)
            quiet = min(max(0.0, since - wait) / constants.RATE_PROBE_DOUBLING, 16.0)
            near = constants.RATE_PROBE_NEAR_PER_ANSWER * rate
            if not self._one_token_bucket:
                # Per second too (0.2 %/s from 40 req/s up): a big bucket lets a fast probe run
                # far past the limit before its first 429. A one-token bucket refuses at once,
                # and each lone 429 steps back >= 1 %: capped, the climb drew one every ~5 s,
                # 0.1 % of 200 req/s, and held the pace at 92 % of the limit there; per answer,
                # the pace settles where ~1 answer in 200 is refused, at any rate.
                near = min(constants.RATE_PROBE_NEAR, near)
            growth = min(constants.RATE_PROBE_FAR, near * 2.0**quiet)
        else:
            growth = constants.RATE_PROBE_FAR
            self._ramped_at = now
        self.rate = self._capped(rate * (1.0 + growth * (now - last)))

    def on_rate_limited(self, started: float, retry_after: float | None) -> bool:
        """A 429 for a request sent at ``started``. Returns True when the rate was cut."""
        now = self._clock()
        overshoot = self._overshoot(now)
        if self._last_refusal is None or now - self._last_refusal > constants.ACCEPT_WINDOW:
            self._streak_start = now  # the first 429 after a quiet second: the bucket is empty
        self._refused.append(now)
        self._last_refusal = now
        if self._paced_since is not None and started > self._paced_since:
            # (Not the refusals of what was sent unpaced: a discovery's bunch says nothing of a pace,
            # and held in the tally for 10 s it stepped a pace at the limit back 5-8 %, traced.)
            self._tally_answer(now, refused=1)
        accepted = self._accepted_rate(now)
        share = self._tally_refused_share()  # of the last TALLY_SECONDS' answers (this one, if paced)
        # Paced at an estimate, yet refused. (In the slow start, before any estimate, the first
        # 429 is the limit found, not jitter.) Under a limit the server announced, a few 429s at
        # once are also jitter while they stay a small share of the last TALLY_SECONDS: arrivals
        # bunched on the way (a stall at either end, a server whose bucket holds 2 tokens) are
        # not our pace, and a cut below its word cost the pace (38.6 req/s for an announced 40,
        # CI). A steady share (spread over seconds, and more than a few) says its word is not
        # the whole truth (a quota shared with another app): that is estimated as without one.
        bunched = self.announced is not None and not self._steady_refusals(share)
        isolated = (
            self.ceiling is not None and self.rate is not None and (self._isolated_refusal(now) or bunched)
        )
        # Paced, even a Retry-After of 0 pauses two intervals, or MIN_PAUSE when that is shorter:
        # the pace keeps us from spinning, and each 429's MIN_PAUSE would cost a quarter of the
        # pace at 500 req/s.
        floor = min(constants.MIN_PAUSE, 2.0 / self.rate) if self.rate is not None else constants.MIN_PAUSE
        pause = self._shared_pause(retry_after)
        # Not after an isolated 429 at a bucket known to hold one token (read before this 429 may
        # find it: that one pauses), unless its Retry-After is long: that 429 is jitter, a request
        # that reached the server a little early, and a token bucket takes no token for a request
        # it refuses, so the next slot, an interval on, finds one. A pause of two intervals there
        # cost a slot a 429, 0.65 % of a night at 50 req/s, burst 1, 20 ms, traced.
        paused = not (isolated and self._one_token_bucket and pause <= constants.SHARED_PAUSE_FULL)
        if paused:
            self._pause(now, pause, floor)
        self._accepted_at_refusal = self._accepted_count
        # A short pause refills a token bucket by its rate x the pause, about ours x the pause (a
        # long one, by up to its size, unknown).
        short = paused and self.rate is not None and pause <= constants.SPACING_PAUSE_INTERVALS / self.rate
        self._refilled_at_refusal = self.rate * max(pause, floor) if short and self.rate is not None else None
        if not self.adaptive or started < self._last_decrease:
            return False  # same episode: the requests in flight at the first 429 also get one
        if self.ceiling is None and self.rate is not None and self._caught_up_pair(started):
            # The slow start (paced, no estimate yet) refused a pair that caught up after a late
            # wake-up: a bucket too small for two requests closer than its interval refused the
            # pair, not the pace. Taken for the limit, it set the estimate at the pace of that
            # moment: 59-60 req/s for a limit of 200 at burst 1, 20 ms, and one night in four read
            # 60 % of the limit (traced). The climb goes on: past the limit the requests sent on
            # schedule are refused too, and the first of them measures it.
            return False
        previous = self._last_decrease
        if isolated:
            # The server took (nearly) all we sent: an isolated refusal (a burst at the server's
            # end, timer jitter, a moment of low demand then a burst), not a pace above its
            # limit, which refuses a steady share. At a bucket that small no two requests leave
            # closer than the interval from now on, where that costs little: each late wake-up
            # of the loop (0.3-1 ms) is then pace lost, a third of it at 500 req/s, where no
            # event loop paces a one-token bucket anyway (and a larger bucket absorbs a pair).
            self._early = 0.0
            rate = self.rate
            # Already sending no two requests closer than the interval (a one-token bucket refused
            # a close pair before): a lone 429 now is the pace at the limit, not a pair.
            one_token = self._one_token_bucket
            close = self._caught_up_pair(started)
            if close and not one_token:
                # Found now: the 429s tallied so far were of the pace that caught up (close pairs)
                # or of the climb before the level, not of the pace that no longer catches up.
                self._catch_up = 0.0
                self._forget_refusals()
            rare = share < constants.REFUSALS_TOLERATED and not one_token
            if accepted is not None and (self.announced is not None or rare or (close and not one_token)):
                # At the pace the server announced, its word stands; a pair that caught up was
                # refused, not the pace (a step there took the estimate 7.5 % under 50 req/s at
                # burst 1, measured); and while such refusals stay rare, stepping back on each would
                # only sink the pace, night-long: the pause above is all. (Not at a one-token bucket
                # once we no longer catch up: a 429 there is the probe at the limit, and without a
                # step the next came within the second, a streak: 49.98 -> 40.8 req/s, measured.)
                return False
            settled = self._settled
            # Too few answers in the window although the pace would fill it: a lull in demand (at a
            # pace under LULL_MIN_RATE a window never holds answers enough to measure).
            lull = rate is not None and settled is not None and constants.LULL_MIN_RATE <= rate <= settled
            if accepted is None and settled is not None and (self.decreases == 0 or lull):
                # Refused before answers enough to measure, at a pace no higher than a level settled
                # before: a night paced from the start at a rate found before (or announced), whose
                # first connections (set up while the first requests wait) bunch them at the server,
                # or a lull in demand (a batch's end) and a pair at its end. The level stands; a cut
                # here (x 0.8, the estimate down to the pace) held a night at 93 % of 20 req/s,
                # burst 1, and after a lull cut 19.8 req/s to 15.9 (a limit of 20, traced).
                return False
        self._last_decrease = now
        self._early = 0.0
        self._last_grow = now
        self.decreases += 1
        if accepted is not None and self.rate is not None and isolated:
            # Isolated refusals, but more than a few: a small step back. When they are more than
            # twice what we tolerate, the estimate comes down with the pace: it is too high
            # (else the fast probe far below it would undo the steps, and a night would circle
            # above the limit, a refusal and a pause at a time: 80 % of 500 req/s at burst 5,
            # measured); fewer are jitter, and lowering the estimate on each would sink the pace
            # (89 % of 20 req/s at burst 1, measured).
            # The step is the share refused, at least RATE_MARGIN / 2: above the limit by x %,
            # about x % of what we send is refused (at 20 req/s, burst 5: one 429 every few
            # seconds, each "isolated", 3 % of the answers, at a pace 5 % above the limit).
            # And when the server plainly took less than our pace over the last second, down to
            # what it took: a big bucket lets a probe run above the limit for many seconds
            # before refusing once (5 % above, at 20 req/s, burst 20).
            # When the last 429 was alone in its second, how far we are above the limit is known
            # from the answers since (_overshoot): the step lands the margin under it. (The share of
            # the last 10 s held the start-up's streak, 14 % at 50 req/s, burst 50: a step of 8 %
            # for a pace 2.4 % over. The share of the 429s at this pace only, at least 1 % or 2 %,
            # drew 1.37 % or 1.81 % 429s at 20 req/s, burst 5, measured.)
            share_or_overshoot = share if overshoot is None else overshoot + constants.RATE_MARGIN
            step = max(constants.RATE_MARGIN / 2, min(share_or_overshoot, constants.RATE_MARGIN * 4))
            lower = self.rate * (1 - step)
            # (Not within a window of the level's setting: the last second's count is then the
            # slow start's climb to it, or the streak it cut, not what the server takes at this
            # pace. A lone 429 50 ms after the slow start's estimate of 190.9 req/s, at a limit of
            # 200, burst 1, took the pace 8 % down to that count, 172 req/s, traced. Nor at a
            # bucket known to hold one token: a pace above its limit is refused at once, never for
            # seconds, so a low count there is our demand's (a lull, the climb back after a rough
            # cut): at the top of that climb, 49.6 req/s for a limit of 50, it took the pace to
            # 45.6 and the estimate to 46.6, and the night spent 10 s climbing back, traced.)
            plainly_less = accepted < self.rate * (1 - 2 * constants.RATE_MARGIN)
            if plainly_less and not self._just_leveled(now) and not self._one_token_bucket:
                lower = max(min(lower, accepted), self.rate * (1 - 4 * constants.RATE_MARGIN))
            self.rate = self._capped(lower)
            too_many = share >= 2 * constants.REFUSALS_TOLERATED
            if too_many and self.ceiling is not None and self.announced is None:
                self.ceiling = min(self.ceiling, self.rate / (1 - constants.RATE_MARGIN))
            self._settled = self.rate / (1 - constants.RATE_MARGIN)
            return True
        if accepted is not None:
            # We were sending above the limit, so what it accepted is the limit (at most): over
            # the last second, or now (what we send, less the share refused since the last cut:
            # the refusals of an earlier pace say nothing of this one), whichever is more: a
            # slow start that just passed the limit accepted less than the limit on average.
            rate = self.rate
            if rate is None:
                # Unpaced until now: the requests left as fast as the concurrency let them, in
                # bunches, and a bunch larger than the server's bucket is refused whatever its
                # rate. What it accepted is a floor, not its limit: pace there and keep probing
                # fast (no ceiling); the next 429, paced and smooth, measures the limit.
                self.rate = self._capped(accepted * (1 - constants.RATE_MARGIN))
                return True
            # While 429s keep coming the server's bucket stays empty and it takes exactly its rate:
            # counted from a round trip after the streak began (a 429 may come back at once, the
            # answers to what was sent before it a latency later), what it accepted leaves out
            # the tokens its bucket held before (which made the last second's count 2-3x the
            # limit, at 20 req/s, burst 20, 200 ms, and the pace came down 2 % a round trip).
            emptied = self._streak_start + self.latency
            since_emptied = self._accepted_rate(now, since=emptied)
            young = self._streak_share() if since_emptied is None else None
            if young is not None:
                # Too young a streak to measure what the bucket takes, and the last second's count
                # holds what it had saved while our demand was low (27.9 req/s for a limit of 20,
                # burst 5, after the discovery's lull): the share refused since the streak began
                # is what we send above the limit, (rate - limit) / rate.
                # (Not floored within a second of the level's setting, as below: the slow start
                # may have run far past the limit, 37 req/s for 20 at burst 5, 200 ms, and the
                # share of its young streak, 2 of 8, is what takes it down; floored, the pace stayed
                # at 30 req/s and the night drew 1.1-1.3 % 429s, traced. At 50 req/s, burst 1, the
                # same share cut 49 -> 36 req/s once, a night at 77 %: the rarer cost.)
                level = rate * (1 - young)
            else:
                accepted = since_emptied or accepted
                level = min(rate, max(accepted, rate * (1 - self._refused_share(now, since=previous))))
                if since_emptied is None and self._just_leveled(now):
                    # A streak too young to measure, within a second of the level's setting: the
                    # window's share refused is a few 429s among the answers of the climb before it
                    # (2 of 22, bound by the concurrency: 52.1 -> 46.4 req/s for a limit of 50,
                    # burst 1, 200 ms, and 11 s to climb back, traced). A step of twice the margin;
                    # the streak, once it has answers enough, measures the rest.
                    level = max(level, rate * (1 - 2 * constants.RATE_MARGIN))
            ramped = self._ramped_at is not None and now - self._ramped_at < constants.ACCEPT_WINDOW
            bound_only = self.ceiling is not None and self._settled is None
            if ramped and bound_only and sum(1 for t in self._refused if t > previous) == 1:
                # The only 429 in the window since a rough cut (which left only a bound: the pace
                # then refused), at the top of the fast climb back: the pace just passed the limit.
                # The share refused since the cut is one answer among a few (a coarse 5-7 % at
                # 20 req/s, burst 1: the estimate went that far under the limit, traced), and what
                # was accepted is the climb's average: the level is the pace, less the margin.
                # (Not in the slow start, with no bound, x2.7 a second, which runs far past the
                # limit before a bucket of 5 refuses: 37 req/s for a limit of 20; nor after a cut
                # to a level, which may have left the pace above the limit, traced. A rough cut
                # from over 1.25x the limit leaves the pace above it too: that level is high, and
                # the 429s that follow at once, a streak, measure the limit. At a long round trip
                # the climb went on after the refused request left, up to 4 % at 200 ms: the
                # pace it left at is not kept per request, and 20/1/200 ms read 94-97 %.)
                level = max(level, rate * (1 - constants.RATE_MARGIN))
            self.ceiling = self._settled = level
            self._leveled_at = now
            if self._one_token_bucket:
                self._forget_refusals()
            self.rate = self._capped(level * (1 - constants.RATE_MARGIN))
            return True
        # Too few answers for an estimate (the very first 429s, or a slow start at a low rate
        # passing the limit within half a second): a plain cut of what we were doing. Refused
        # while paced, that pace bounds the limit from above: the probe climbs back fast to
        # just under it, then slowly, and the next 429 (with answers enough) measures it.
        # Without the bound the slow start ran past the limit again and again, each time too
        # soon for an estimate (82 % of 20 req/s at burst 1, measured).
        rough = self.rate if self.rate is not None else self._rough_rate(now)
        if self.rate is not None and self.announced is None:
            self.ceiling = min(self.ceiling, self.rate) if self.ceiling is not None else self.rate
        self.rate = self._capped(rough * constants.RATE_DECREASE)
        return True

    def _shared_pause(self, retry_after: float | None) -> float:
        """How long *every* request waits after a 429 (the refused one waits its Retry-After).

        A long ``Retry-After`` means the server is out for a while (a quota window, trouble):
        everyone waits it out. A short one from a token bucket (whole seconds, rounded up from
        a few milliseconds) says the bucket is empty *now*: a pause of two intervals at the
        pace (the one the 429 was sent at: the cut, if any, comes after) lets it refill, and
        the request that was refused still waits the full ``Retry-After`` before it is sent
        again.
        """
        if retry_after is None:
            return 0.0
        if retry_after > constants.SHARED_PAUSE_FULL or self.rate is None:
            return retry_after
        return min(retry_after, 2.0 / self.rate)

    def on_announced(self, limit: RateAnnouncement) -> None:
        """The server's own word on its limit (see :func:`parse_rate_headers`): obey it."""
        now = self._clock()
        if limit.rate is not None and limit.rate > 0:
            self.announced = limit.rate * (1 - constants.ANNOUNCED_MARGIN)
            self.ceiling = self._settled = limit.rate
            self.rate = self._capped(self.rate if self.rate is not None else self.announced)
            self._early = 0.0
        if limit.remaining is not None and limit.remaining <= 0:
            reset = limit.reset if limit.reset is not None else 0.0
            # An empty quota pauses everyone until it resets, unless we already pace at the
            # announced rate and it refills within a moment (a token bucket's next token).
            if self.announced is None or reset > constants.SHARED_PAUSE_FULL:
                self._pause(now, reset)

    def _pause(self, now: float, seconds: float, floor: float = constants.MIN_PAUSE) -> None:
        until = now + max(seconds, floor)
        if until > self.cooldown_until:
            start = max(now, self.cooldown_until)
            self.cooldown_until = until
            self._tat = max(self._tat, until)
            self._window_start, self._window_count = until, 0  # measure again after the pause
            self._pauses.append((start, until))

    # -- the estimate ------------------------------------------------------------------------

    def _count_accepted(self, now: float) -> None:
        accepted = self._accepted
        if not accepted:
            self._first_answer = now
        accepted.append(now)
        self._accepted_count += 1
        horizon = now - constants.ACCEPT_WINDOW
        while accepted[0] < horizon:
            accepted.popleft()

    def _accepted_rate(self, now: float, since: float | None = None) -> float | None:
        """Answers accepted per second of sending over the last ACCEPT_WINDOW s (None: too few):
        n - 1 intervals over the time from the first answer to the last. (Up to now, the slot of
        the request just refused counted as a gap: 1/n low, 5 % at 20 req/s, and at a one-token
        bucket each lone 429 cut the pace to that: 94 % of the limit, measured.)

        Time spent in a shared pause is not sending time: it is left out of the span. With
        ``since`` (a streak of 429s began then: the server's bucket is empty), only the answers
        since then (or over the window, in a streak older than it), over the whole span, pauses
        included: the bucket refills while we pause. (Left out, a streak of a few seconds read
        ~24 req/s for a limit of 20, burst 20, and the pace came down 2 % a 429.)
        """
        accepted, pauses = self._accepted, self._pauses
        horizon = now - constants.ACCEPT_WINDOW
        while accepted and accepted[0] < horizon:
            accepted.popleft()
        while pauses and pauses[0][1] < horizon:
            pauses.popleft()
        # In a streak older than the window: the whole window, its pauses included (below).
        streak = max(since, horizon) if since is not None else None
        times: Sequence[float] = accepted if streak is None else [t for t in accepted if t >= streak]
        if len(times) < constants.ACCEPT_MIN_COUNT:
            return None
        first, last = times[0], times[-1]
        # (In a streak of 429s the pauses are short, and the bucket refills while we pause:
        # what it accepts is its rate over the whole span.)
        paused = (
            0.0
            if streak is not None
            else sum(max(0.0, min(end, last) - max(start, first)) for start, end in pauses)
        )
        span = last - first - paused
        if span < constants.ACCEPT_MIN_SPAN:
            return None
        return (len(times) - 1) / span

    def _tally_answer(self, now: float, refused: int) -> None:
        second, tally = int(now), self._tally
        if not tally or tally[-1][0] != second:
            tally.append([second, 0, 0])
            while tally[0][0] <= second - constants.TALLY_SECONDS:
                tally.popleft()
        entry = tally[-1]
        entry[1] += 1
        entry[2] += refused

    def _forget_refusals(self) -> None:
        """At a bucket known to hold one token, a level's setting (or the finding that the bucket
        holds one token) begins a new pace: the 429s tallied until then were drawn by the pace
        above the level (the discovery's climb, the streak it cut) or by pairs that caught up, and
        say nothing of it. Their answers stay in the tally, as its denominator. (Kept, they were
        3-4 % of the tally at 50 req/s, burst 1, two seconds on: a lone 429 there stepped the pace
        back by that share, not the 1 % of any lone 429 at a one-token bucket, and took the
        estimate down with it, 48.8 -> 46.9 req/s, for the next 7 s of a 15-s night: 92.5 % of the
        limit, traced.)

        Not at a bigger bucket: there what the server accepted held what its bucket had saved, and
        the level may be above the limit (21.1 req/s for a limit of 20, burst 5, 200 ms); the
        tallied 429s are what takes it down at the next lone 429 (forgotten, the fast probe took
        the pace back above the limit: 1.1-1.6 % 429s in three nights, 0.8 % kept, traced). At a
        bucket of one token what it accepted is its rate at most: no saved tokens inflate it."""
        for entry in self._tally:
            entry[2] = 0

    def _tally_refused_share(self) -> float:
        """Share of the answers of the last TALLY_SECONDS that were 429s.

        At a bucket known to hold one token, over at least TALLY_MIN_ANSWERS answers: early in a
        night the tally holds a few dozen (the discovery's lists and pages), and one 429 among 41
        read 2.4 %, a step back of that much and the estimate down with it (47.6 -> 46.5 req/s for
        a limit of 50, burst 1, 20 ms, traced); there each lone 429 is jitter or the probe at the
        limit, worth the least step. Not at a bigger bucket: there a level set early may hold the
        bucket's saved tokens, and a lone 429 then reads the early 429s' share, large, which is
        what takes the pace and the estimate under the limit (21.1 -> 19.4 req/s for a limit of
        20, burst 5, 200 ms, traced); counted over 200 answers that step would be smaller.
        """
        answers = sum(entry[1] for entry in self._tally)
        refused = sum(entry[2] for entry in self._tally)
        if self._one_token_bucket:
            answers = max(answers, constants.TALLY_MIN_ANSWERS)
        return refused / answers if answers else 1.0

    def _steady_refusals(self, share: float) -> bool:
        """Are the 429s of the last TALLY_SECONDS a steady share, not a bunch? At least
        SUSTAINED_REFUSALS of the answers, STEADY_MIN_REFUSED of them, in STEADY_MIN_SECONDS
        seconds: a share of a few answers, or of one moment, is a stall's, not a pace's."""
        refused = [entry[2] for entry in self._tally if entry[2]]
        return (
            share >= constants.SUSTAINED_REFUSALS
            and sum(refused) >= constants.STEADY_MIN_REFUSED
            and len(refused) >= constants.STEADY_MIN_SECONDS
        )

    def _overshoot(self, now: float) -> float | None:
        """How far above the server's limit we send (a share of it), from the spacing of its 429s.

        After a 429 its bucket is empty, and the short pause that follows gives it back ``refilled``
        tokens; sending at ``r`` above its limit ``L`` drains them at ``r - L`` a second, so the
        next 429 comes after ``n = refilled x L / (r - L)`` answers: ``(r - L) / L`` is about
        ``refilled / n``, whatever the bucket's size (the last 429's spacing measured a pace 4.6 %
        over as 4.3 % at 20 req/s, burst 5; 2.4 % as 2.2 % at 50 req/s, burst 50). None when
        the last 429 was less than ACCEPT_WINDOW ago (a streak, or jitter at a small bucket: its
        spacing says nothing of the pace), too few answers came since, its pause was long, or
        the server refused a close pair (a one-token bucket: its 429s come at any pace).
        """
        last, refilled = self._last_refusal, self._refilled_at_refusal
        answers = self._accepted_count - self._accepted_at_refusal
        if last is None or refilled is None or now - last < constants.ACCEPT_WINDOW:
            return None
        if self._one_token_bucket:  # its 429s are jitter
            return None
        return refilled / answers if answers >= constants.ACCEPT_MIN_COUNT else None

    def _refused_share(self, now: float, since: float | None = None) -> float:
        """Share of the answers of the last ACCEPT_WINDOW s (and since ``since``) that were 429s."""
        refused, horizon = self._refused, now - constants.ACCEPT_WINDOW
        while refused and refused[0] < horizon:
            refused.popleft()
        if since is not None and since > horizon:
            count = sum(1 for t in refused if t > since)
            total = count + sum(1 for t in self._accepted if t > since)
            if total >= constants.ACCEPT_MIN_COUNT:  # (too few since: the whole window)
                return count / total
        total = len(refused) + len(self._accepted)
        return len(refused) / total if total else 1.0

    def _streak_share(self) -> float | None:
        """Share of the answers since the current streak of 429s began (after its first) that
        were 429s; None without a 429 after its first, with fewer than STREAK_MIN_ANSWERS answers
        or more than STREAK_MAX_REFUSED 429s (both in constants). At most one half."""
        start = self._streak_start
        refused = sum(1 for t in self._refused if t > start)  # (not the 429 that began it)
        if not 1 <= refused <= constants.STREAK_MAX_REFUSED:
            return None
        total = refused + sum(1 for t in self._accepted if t > start)
        return min(0.5, refused / total) if total >= constants.STREAK_MIN_ANSWERS else None

    @property
    def _one_token_bucket(self) -> bool:
        """Is the server's bucket known to hold one token? It refused a close pair, and since then
        the pace no longer catches up (``_catch_up`` 0): its 429s come at any pace."""
        return self._catch_up == 0.0

    def _isolated_refusal(self, now: float) -> bool:
        """Was the 429 just counted a lone one (jitter at a small bucket), not a pace above the limit?

        Above the limit a steady share of the answers is refused; one refusal in the last
        ACCEPT_WINDOW s, or a share under SUSTAINED_REFUSALS, is not that (at 20 req/s one 429
        among 20 answers is 5 %, yet says nothing of the pace). At a bucket known to hold one
        token (a close pair was refused: no longer catching up), two are not that either, nor
        more under ``ONE_TOKEN_SUSTAINED_REFUSALS``: its 429s come at any pace, from arrivals
        a few ms early (two 0.26 s apart read as a young streak cut the pace 9 %, 44 of 50 req/s
        for ~10 s; three in 0.93 s, 47.5 -> 44 req/s for the rest of a night, traced), and a pace
        above its limit has about every other request refused.
        """
        share = self._refused_share(now)  # (prunes the refusals to the window)
        lone, sustained = (
            (2, constants.ONE_TOKEN_SUSTAINED_REFUSALS)
            if self._one_token_bucket
            else (1, constants.SUSTAINED_REFUSALS)
        )
        return bool(self._accepted) and (len(self._refused) <= lone or share < sustained)

    def _sent_close(self, started: float, rate: float) -> bool:
        """Did the request sent at ``started`` leave closer than an interval (less the margin) to
        the one before it: a pair that caught up after a late wake-up, which only a bucket too
        small for two requests refuses? One sent on schedule was refused by a drained bucket,
        whatever its size: catching up is not the cause there, and without it each late wake-up
        of the loop is pace lost (3.5 % of 50 req/s at burst 50, measured)."""
        granted = self._granted
        for i in range(len(granted) - 1, 0, -1):
            if granted[i] <= started:
                return granted[i] - granted[i - 1] < (1 - constants.RATE_MARGIN) / rate
        return False

    def _just_leveled(self, now: float) -> bool:
        """Did a 429's estimate set the level less than ACCEPT_WINDOW ago? Then the window's counts
        (accepted, refused) are mostly of the climb or the streak before it, not of this pace."""
        return self._leveled_at is not None and now - self._leveled_at < constants.ACCEPT_WINDOW

    def _caught_up_pair(self, started: float) -> bool:
        """Was the request sent at ``started`` one of a close pair that catching up sent, at a pace
        where catching up stops after such a refusal (``CATCH_UP_KEPT_ABOVE*``)?"""
        rate = self.rate
        precise = self._precise_timers
        kept_above = constants.CATCH_UP_KEPT_ABOVE_PRECISE if precise else constants.CATCH_UP_KEPT_ABOVE
        return rate is not None and rate <= kept_above and self._sent_close(started, rate)

    def _rough_rate(self, now: float) -> float:
        """What we achieved since the first answer, however little we know (for a first cut)."""
        elapsed = now - self._first_answer if self._first_answer is not None else 0.0
        count = len(self._accepted)
        if count >= 2 and elapsed > 0:
            return max(count / elapsed, constants.RATE_START)
        return constants.RATE_START


@dataclass(frozen=True)
class RateAnnouncement:
    """What a server said of its limit: ``rate`` req/s, requests ``remaining`` in its window,
    and seconds until it ``reset``s (each None when not said)."""

    rate: float | None = None
    remaining: float | None = None
    reset: float | None = None


def parse_rate_headers(headers: Mapping[str, str], now_epoch: float) -> RateAnnouncement | None:
    """Read ``RateLimit-*`` (IETF draft) or ``X-RateLimit-*`` headers; None when absent.

    ``RateLimit-Policy: 100;w=60`` (or ``X-RateLimit-Policy``) gives the window; without it a
    ``Limit`` is taken per second only when ``Reset`` is at most one second (else the window is
    unknown: only ``Remaining``/``Reset`` gate us). A ``Reset`` larger than a day is an epoch
    time (as some APIs send it), converted with ``now_epoch``.
    """
    found: dict[str, str] = {}
    for prefix in ("ratelimit-", "x-ratelimit-"):
        for field in ("limit", "remaining", "reset", "policy"):
            value = headers.get(prefix + field)
            if value is not None and field not in found:
                found[field] = value
    if not found:
        return None
    limit = _number(found.get("limit"))
    remaining = _number(found.get("remaining"))
    reset = _number(found.get("reset"))
    if reset is not None and reset > 86_400:
        reset = max(0.0, reset - now_epoch)
    window = _policy_window(found.get("policy"))
    rate = None
    if limit is not None and limit > 0:
        if window is not None and window > 0:
            rate = limit / window
        elif reset is not None and reset <= 1.0 and remaining is not None and remaining >= limit - 1:
            rate = limit  # a full per-second quota: the limit is per second
    return RateAnnouncement(rate, remaining, reset)


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    first = value.split(",")[0].split(";")[0].strip()  # "100, 100;w=60" -> the first item
    try:
        number = float(first)
    except ValueError:
        return None
    return number if number == number and number not in (float("inf"), float("-inf")) else None


def _policy_window(policy: str | None) -> float | None:
    if not policy:
        return None
    for part in policy.split(",")[0].split(";")[1:]:
        key, _, value = part.strip().partition("=")
        if key.strip().lower() == "w":
            return _number(value)
    return None


# The rank of the work a request belongs to (0: outside any ranked work); tasks inherit it.
_RANK: ContextVar[int] = ContextVar("membersync_request_rank", default=0)
_STARTS = itertools.count(1)  # ranks only order waiters of one semaphore: one counter serves all


@contextmanager
def work_started() -> Iterator[None]:
    """Requests made in this block, and in the tasks it starts, rank by when the block began.

    A batch sends its clients' reads, then a second round (the affiliated package clients) once
    they are answered. With batches in flight together, served in arrival order, that second
    round queued behind the other batches' thousands of reads: the batches ended together and
    the pipeline drained at every boundary (at 500 req/s, ~0.5-1 s of pace lost each time).
    Ranked, an earlier batch's requests take the next free slot of :class:`AdaptiveConcurrency`,
    so batches end in turn and the next one starts while the others keep the pace busy.
    """
    token = _RANK.set(next(_STARTS))
    try:
        yield
    finally:
        _RANK.reset(token)


class AdaptiveConcurrency:
    """A semaphore whose size adapts: x ``CONCURRENCY_DECREASE`` on 429; while saturated, +1 per
    success until the first 429 (slow start), then +1 per window of successes; never below what
    the client's pace needs at the latency seen (:meth:`keep_up`). Waiters are served by rank
    (:func:`work_started`), then in arrival order."""

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
        # A heap of (rank, arrival, future). A cancelled waiter's entry stays until it surfaces
        # (removing it is O(n), and a failing night cancels thousands at once); ``waiting``
        # counts the live ones.
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()
        self.waiting = 0
        self._last_decrease = float("-inf")
        self._slow_start = adaptive  # until the first 429: +1 per success, not per window

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

    def on_rate_limited(self, started: float, now: float) -> None:
        if not self.adaptive or started < self._last_decrease:
            return
        self._last_decrease = now
        self._slow_start = False
        self.limit = max(float(self.minimum), self.limit * constants.CONCURRENCY_DECREASE)

    def keep_up(self, rate: float | None, latency: float) -> None:
        """The client paces at ``rate`` req/s (None: not paced) and its requests take ``latency``
        s (the limiter's moving average): keep room for ``rate x latency`` requests in flight
        (Little's law) with ``CONCURRENCY_HEADROOM``, so that the pace, which is the politeness,
        is never starved by a limit cut at a 429 or grown too slowly at a far server (at
        500 req/s and 200 ms, 100 in flight)."""
        if rate is None or not self.adaptive:
            return
        needed = min(float(self.maximum), rate * latency * constants.CONCURRENCY_HEADROOM + 2.0)
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
