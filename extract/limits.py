"""Politeness: how fast and how many at once we ask the server.

The server rate-limits per credential (a token bucket; beyond it, 429 with ``Retry-After``) and
rarely says its rate. The design is botocore's adaptive retry mode (a token bucket at a rate
found with CUBIC), with the server's own words obeyed exactly:

- **Pacing**: :class:`RateLimiter` spaces requests ``1/rate`` apart (GCRA: one theoretical
  arrival time, no background task). A night starts at the rate the previous one found, or,
  knowing none, at ``INITIAL_RATE`` doubling every ``ACCEPT_WINDOW`` from its first request (a
  slow start in time, not in round trips: at 20 ms a round trip, doubling each one met a bucket
  of 200 tokens with ~128 requests in flight); ``MEMBERSYNC_RATE`` stays a cap.
- **A 429 episode**: every request pauses together (a shared pause: the whole ``Retry-After``
  when it is long, else two intervals, a token bucket's next tokens), and the pace is cut
  **once** to what the server was accepting (successes over the last ``ACCEPT_WINDOW``), less
  ``RATE_MARGIN``. 429s of requests sent before the cut belong to the same episode.
- **Regrowth** (CUBIC): the pace climbs back to that level in ``REGROW_SECONDS`` along a cubic,
  flat near the level and steeper beyond it, so a night sits just under the limit and probes
  above it rarely; never above twice what it is sending (a lull is no licence to burst). A cut
  measured over less than a window (a night's first seconds) is a floor: from it the pace
  doubles every window (a slow start) until a 429 measures the limit.
- **The found rate** (the next night's start): the last cut's level, or more when the server
  accepted more over a window since (a floor, or a bunch refused while sending slowly, is no
  measure of the server).
- **An announced limit** (``RateLimit-*``, ``X-RateLimit-*``) is obeyed exactly: its rate less
  ``ANNOUNCED_MARGIN`` is a cap, and an exhausted quota pauses every request until its reset.
- **A fixed window** ("1,200 a minute", ``Retry-After`` = the window's end): a 429 whose
  ``Retry-After`` (or an exhausted quota's reset) is longer than ``SHARED_PAUSE_FULL`` names a
  window's end, as GitHub's and Stripe's clients read it. Every request waits for it, and the
  window is learned: its length (from the last end, or from the night's first request) and what
  it accepted (our successes in it), so the pace spreads a window's quota over the window, less
  ``RATE_MARGIN``, instead of spending it early and meeting the wall. That rate is a cap, as an
  announced one; a window learned too fast (it began before the night did) meets the next end
  early, and that end, a whole window after this one, measures it exactly.
- How many requests are in flight at once is :mod:`membersync.extract.concurrency`'s, and so is
  a server's cap on them.

Every number is in :mod:`membersync.extract.constants`; clock and sleep are injectable, so the
tests run on a fake clock.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from membersync.extract import constants as K

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class RateAnnouncement:
    """What a server said of its limit: ``rate`` req/s, requests ``remaining`` in its window,
    and seconds until it ``reset``s (each None when not said)."""

    rate: float | None = None
    remaining: float | None = None
    reset: float | None = None


class RateLimiter:
    """The client's pace in req/s: found from the server's 429s (see the module's docstring)."""

    def __init__(
        self,
        *,
        cap: float | None = None,
        initial: float | None = None,
        start: float | None = None,
        adaptive: bool = True,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if cap is not None and cap <= 0:
            raise ValueError("rate cap must be > 0 req/s (or None for no cap)")
        if initial is not None and initial <= 0:
            raise ValueError("initial rate must be > 0 req/s (or None)")
        if start is not None and start <= 0:
            raise ValueError("slow-start rate must be > 0 req/s (or None)")
        self.cap = cap
        self.adaptive = adaptive
        self._clock = clock
        self._sleep = sleep
        self._announced: float | None = None  # the cap a server's own headers set
        self.level: float | None = None  # the last good level (CUBIC's W_max): found, remembered
        self._cut_at = float("-inf")  # when the current episode's cut was made
        self._slow_start = False  # the last cut measured less than a window: a floor, not a level
        self._reached = 0.0  # the most the server accepted over a window since the last cut
        self._rate: float | None = None
        self._tat = 0.0  # theoretical arrival time of the next request (GCRA)
        self.paused_until = 0.0  # every request waits for this (a shared pause)
        self._answers: deque[float] = deque()  # success times within ACCEPT_WINDOW
        self._refused: deque[float] = deque()  # 429 times within ACCEPT_WINDOW
        self.latency = 0.0  # seconds, a moving average of the successes' latency
        self.decreases = 0
        self._measured = initial is not None  # a level found (by a 429, or a night before)
        self._first_request = False  # the slow start's clock starts with the first request
        self._night_start: float | None = None  # the first request's time
        self._successes = 0
        self._window_end = float("-inf")  # the last fixed window's end, once one named it
        self._window_successes = 0  # successes up to the window's start (_window_end)
        self._window_rate: float | None = None  # a window's quota over its length, less the margin
        if initial is not None:  # a night starts at the level the last one found: on the plateau
            self.level, self._cut_at = initial, clock() - K.REGROW_SECONDS
        elif adaptive:  # knowing no rate: a slow start from INITIAL_RATE, or what a night took unrefused
            self.level, self._slow_start, self._first_request = max(K.INITIAL_RATE, start or 0.0), True, True
        self._set(self.level)

    # -- the pace ------------------------------------------------------------------------------

    @property
    def rate(self) -> float | None:
        """The pace (req/s), or None when requests are not paced."""
        return self._rate

    @property
    def found(self) -> float | None:
        """The server's rate this night found (what the next night starts at), or None: the
        level of the last cut, or more when the server has accepted more over a window since (a
        cut from a floor, or from a bunch refused while sending slowly, is no measure of it)."""
        return None if self.level is None or not self._measured else max(self.level, self._reached)

    @property
    def unrefused(self) -> float | None:
        """What the server accepted over a window this night without a 429 (where the next
        night's slow start begins, as TCP caches a path's window), or None: a rate was found
        (:attr:`found`), or no window was measured. A hint, not a limit: nothing refused it."""
        if self._measured or not self.adaptive or self._reached <= 0:
            return None
        return self._reached

    def _set(self, rate: float | None) -> None:
        for limit in (self.cap, self._announced, self._window_rate):
            if limit is not None:
                rate = limit if rate is None else min(rate, limit)
        self._rate = None if rate is None else max(K.MIN_RATE, rate)

    async def wait_turn(self) -> None:
        """Wait for this request's slot: the end of a shared pause, then the pace. A pause that
        began while it waited for its slot (a 429 meanwhile) is waited out too, and a new slot
        taken after it: a slot given before a window's end or a bucket's refusal is no licence."""
        now = self._clock()
        if self._night_start is None:
            self._night_start = now
        if self._first_request:
            self._first_request, self._cut_at = False, now
        while True:
            if self.paused_until > now:
                await self._sleep(self.paused_until - now)
                now = self._clock()
            rate = self._rate
            if rate is None:
                return
            slot = max(self._tat, now)
            self._tat = slot + 1.0 / rate
            if slot <= now:
                return
            await self._sleep(slot - now)
            now = self._clock()
            if self.paused_until <= now:
                return

    # -- what the server answered -------------------------------------------------------------

    def on_success(self, now: float, latency: float | None = None) -> None:
        if latency is not None:
            self.latency += K.LATENCY_SMOOTHING * (latency - self.latency)
        self._successes += 1
        if now < self._window_end:  # sent before the window's end was named: that window's
            self._window_successes += 1
        answers = self._answers
        answers.append(now)
        while answers[0] < now - K.ACCEPT_WINDOW:
            answers.popleft()
        if self.adaptive and self.level is not None:
            if answers[0] > self._cut_at and answers[-1] - answers[0] >= 0.9 * K.ACCEPT_WINDOW:
                self._reached = max(self._reached, (len(answers) - 1) / (answers[-1] - answers[0]))
            self._set(self._regrown(now))

    def _regrown(self, now: float) -> float:
        """CUBIC: ``level x (1 - margin)`` at the cut, the level after ``REGROW_SECONDS``, then
        beyond it, ever steeper; at most twice what is being sent."""
        assert self.level is not None
        if self._slow_start:  # a floor: double every window until a 429 measures the limit
            cubic = self.level * 2.0 ** ((now - self._cut_at) / K.ACCEPT_WINDOW)
        else:
            phase = (now - self._cut_at) / K.REGROW_SECONDS - 1.0
            cubic = self.level * (1.0 + K.RATE_MARGIN * phase**3)
        sending = self._accepted(now)
        return cubic if sending is None or cubic <= self.level else min(cubic, max(self.level, 2 * sending))

    def _accepted(self, now: float) -> float | None:
        """Successes per second over the last ``ACCEPT_WINDOW`` (None: too few to say). Over a
        short span (a night's first bunch) it overestimates: the next episode's cut corrects
        that at once, where a low estimate would take the regrowth a while to recover."""
        answers = self._answers
        if len(answers) < K.ACCEPT_MIN_COUNT:
            return None
        return (len(answers) - 1) / max(answers[-1] - answers[0], 1e-3)

    def _few_accepted(self, now: float) -> float:
        """What a handful of answers let through per second: over the time they took, at least
        a round trip (an overestimate the next episode corrects; none at all: MIN_RATE)."""
        answers = self._answers
        if not answers:
            return K.MIN_RATE
        return len(answers) / max(now - answers[0], self.latency, 1e-3)

    def _since_cut(self, now: float) -> float | None:
        """What the server accepted since the last cut; None when too few answers, or too few
        refusals, say it. Its bucket was empty at the cut and is again now (a 429), so what it
        let through in between is its rate when we sent more (it refused more than the margin
        of what it accepted): unlike the last window's answers, it leaves out the tokens the
        bucket had stored (at 200/s and 200 tokens, after a lull, the window measured 245/s)."""
        after = self._cut_at + self.latency  # answers to requests sent after the cut
        since = len(self._answers) - bisect.bisect_right(self._answers, after)
        refused = len(self._refused) - bisect.bisect_right(self._refused, after)
        if since < K.ACCEPT_MIN_COUNT or refused <= K.RATE_MARGIN * since:
            return None
        return since / max(now - after, 1e-3)

    def on_rate_limited(self, started: float, retry_after: float | None) -> bool:
        """A 429 for a request sent at ``started``: pause everyone; cut the pace once per
        episode. True when this 429 cut the pace (the concurrency limit is cut with it)."""
        now = self._clock()
        self._pause(now, self._shared_pause(retry_after))
        if self.adaptive and retry_after is not None and retry_after > K.SHARED_PAUSE_FULL:
            return self._window_ended(now, now + retry_after)
        refused = self._refused
        refused.append(now)
        while refused[0] < now - K.ACCEPT_WINDOW:
            refused.popleft()
        if not self.adaptive or started < self._cut_at:
            return False  # a request sent before this episode's cut: the same episode
        answers = self._answers
        if not self._slow_start and now < self._cut_at + K.ACCEPT_WINDOW:
            # Within a window of a measured cut: the same episode, unless the server has since
            # accepted clearly less than the pace (the cut measured the tokens a bucket had
            # stored over a lull). Cutting on every 429 (a bunch at the margin: the bucket is
            # empty at a cut and refills at the margin) would compound the cut, 3 % each.
            exact = self._since_cut(now)
            if exact is None or exact >= (self._rate or float("inf")) * (1.0 - K.RATE_MARGIN):
                return False
            self.level, self._cut_at, self._reached, self._measured = exact, now, 0.0, True
            self.decreases += 1
            self._set(exact * (1.0 - K.RATE_MARGIN))
            return True
        measured = self._accepted(now)
        # Too few answers to measure (a bucket of a token or two refusing a night's first bunch):
        # the pace starts at what they let through, a floor. So are answers over less than a
        # window (a night's first seconds): they under-measure a limit the sender was still
        # climbing to. From a floor the pace doubles every window (TCP's slow start).
        accepted = measured if measured is not None else self._few_accepted(now)
        self.level = accepted if self._rate is None else min(accepted, self._rate)
        self._slow_start = measured is None or answers[-1] - answers[0] < 0.9 * K.ACCEPT_WINDOW
        self._cut_at, self._reached, self._measured = now, 0.0, True
        self.decreases += 1
        self._set(self.level * (1.0 - K.RATE_MARGIN))
        return True

    def _window_ended(self, now: float, end: float) -> bool:
        """A fixed window ends at ``end``: learn what it accepted over its length and pace at
        that, less the margin (see the module's docstring). True when this one taught it."""
        if end < self._window_end + K.WINDOW_SAME_END:
            return False  # the end already named: the rest of its volley
        begun = self._window_end if self._window_end > float("-inf") else self._night_start
        accepted = self._successes - self._window_successes
        self._window_end, self._window_successes = end, self._successes
        if begun is None or accepted < 1 or end <= begun:
            return False
        rate = accepted / (end - begun)
        self.level, self._cut_at, self._reached = rate, now, 0.0
        self._slow_start, self._measured = False, True
        self._window_rate = rate * (1.0 - K.RATE_MARGIN)
        self.decreases += 1
        self._set(self._window_rate)
        return True

    def _shared_pause(self, retry_after: float | None) -> float:
        """Every request's pause: a long ``Retry-After`` whole (the server is out for a while), a
        short one (a token bucket's rounded-up second) two intervals at the new pace."""
        if retry_after is not None and retry_after > K.SHARED_PAUSE_FULL:
            return retry_after
        return 2.0 / self._rate if self._rate else K.MIN_PAUSE

    def on_announced(self, limit: RateAnnouncement) -> None:
        """The server said its limit: pace under it; an exhausted quota pauses until its reset."""
        if limit.rate is not None and limit.rate > 0:
            self._announced = limit.rate * (1.0 - K.ANNOUNCED_MARGIN)
            self._set(self._rate if self._rate is not None else self._announced)
        if limit.remaining is not None and limit.remaining <= 0 and limit.reset is not None:
            now = self._clock()
            self._pause(now, max(limit.reset, K.MIN_PAUSE))
            if self.adaptive and limit.rate is None and limit.reset > K.SHARED_PAUSE_FULL:
                self._window_ended(now, now + limit.reset)  # a window of unsaid length: learned

    def _pause(self, now: float, seconds: float) -> None:
        self.paused_until = max(self.paused_until, now + seconds)
        self._tat = max(self._tat, self.paused_until)


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
