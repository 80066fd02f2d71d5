"""Politeness (``extract/limits.py``): the pace, a 429 episode, CUBIC's regrowth, announced
limits, and the concurrency that never starves the pace.

Everything runs on a fake clock whose ``sleep`` only advances it, and a simulated token bucket
(:class:`Bucket`, the sandbox's rule: ``rate`` tokens a second, ``burst`` at most) stands for the
server where a test needs one: nothing here waits, and nothing depends on the machine's timers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import httpx
import pytest
from fake_time import FakeTime
from membersync.extract import constants as K
from membersync.extract.limits import RateAnnouncement, RateLimiter, parse_rate_headers


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


class Bucket:
    """A server's token bucket: ``rate`` tokens a second, at most ``burst`` held; a request
    takes one or is refused (a refusal takes none)."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.tokens, self.at = rate, burst, burst, now

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


STEADY_AFTER = 5.0  # seconds: the rate matrix's line leaves a night's discovery out, as here


def night(limit: float, burst: float, seconds: float, latency: float = 0.02, **kw: Any) -> dict[str, float]:
    """A night of one sender at a bucket: every request paced by the limiter, answered after
    ``latency`` (a 429 with ``Retry-After: 1``). Returns what the server let through and refused
    (over the night, and of the requests sent after its first ``STEADY_AFTER`` seconds)."""
    t = FakeTime()
    limiter = RateLimiter(clock=t.clock, sleep=t.sleep, **kw)
    bucket = Bucket(limit, burst, t.now)
    start, accepted, refused, steady_refused, steady_sent = t.now, 0, 0, 0, 0

    async def go() -> None:
        nonlocal accepted, refused, steady_refused, steady_sent
        while t.now - start < seconds:
            await limiter.wait_turn()
            sent = t.now
            if limiter.rate is None:
                t.now += latency / K.INITIAL_CONCURRENCY  # unpaced: as the first slots allow
            steady = sent - start >= STEADY_AFTER
            steady_sent += steady
            if bucket.take(sent):
                accepted += 1
                limiter.on_success(sent + latency, latency)
            else:
                refused += 1
                steady_refused += steady
                limiter.on_rate_limited(sent, retry_after=1.0)

    run(go())
    return {
        "share": accepted / (limit * seconds),
        "refused": refused / max(1, accepted + refused),
        "steady_refused": steady_refused / max(1, steady_sent),
        "rate": limiter.rate or 0,
    }


# --- pacing ----------------------------------------------------------------------------------------


def test_the_pace_spaces_requests_one_interval_apart() -> None:
    t = FakeTime()
    limiter = RateLimiter(cap=100.0, clock=t.clock, sleep=t.sleep)

    async def go() -> None:
        for _ in range(20):
            await limiter.wait_turn()

    run(go())
    assert t.now - 1000.0 == pytest.approx(0.19)  # the first at once, then one every 10 ms
    assert t.sleeps == [pytest.approx(0.01)] * 19


def test_a_night_knowing_no_rate_starts_slow_unless_capped_or_started_at_a_found_rate() -> None:
    assert RateLimiter().rate == K.INITIAL_RATE and RateLimiter().found is None
    assert RateLimiter(adaptive=False).rate is None  # not adaptive: unpaced, unless capped
    assert RateLimiter(cap=40.0).rate == 40.0
    started = RateLimiter(initial=120.0, cap=100.0)
    assert started.rate == 100.0 and started.found == 120.0  # the cap holds over a remembered rate


def test_case_the_slow_start_doubles_every_window_from_the_first_request_not_the_start_up() -> None:
    """Case: at 20 ms a round trip, a client doubling its requests in flight every round trip met a
    bucket of 200 tokens with ~128 in flight when it emptied (the whole night's 200/200 cell: 1.23 %
    refused). From INITIAL_RATE the pace doubles every window, in time, from the night's first
    request (Prefect's start-up and the discovery before it do not count), and never past twice
    what is answered; with no 429, nothing was measured: the next night starts slow again."""
    t = FakeTime()
    limiter = RateLimiter(clock=t.clock, sleep=t.sleep)
    t.now += 60.0  # the start-up: the slow start has not begun
    run(limiter.wait_turn())
    answered(limiter, t, K.INITIAL_RATE, 0.05)  # too few answers to measure what is sent
    assert limiter.rate == pytest.approx(K.INITIAL_RATE * 2**0.05, rel=0.01)
    answered(limiter, t, K.INITIAL_RATE, K.ACCEPT_WINDOW - 0.05)
    assert limiter.rate == pytest.approx(2 * K.INITIAL_RATE, rel=0.02)
    answered(limiter, t, 2 * K.INITIAL_RATE, K.ACCEPT_WINDOW)
    assert limiter.rate == pytest.approx(4 * K.INITIAL_RATE, rel=0.05)
    answered(limiter, t, 150.0, K.ACCEPT_WINDOW)  # fewer answered than the pace: twice that at most
    assert limiter.rate == pytest.approx(300.0, rel=0.02)
    assert limiter.found is None
    answered(limiter, t, 150.0, 0.1)
    assert limiter.on_rate_limited(started=t.now, retry_after=1.0)  # the limit measured
    assert limiter.found == pytest.approx(150.0, rel=0.02)


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_a_cap_or_start_that_is_not_positive_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="rate cap"):
        RateLimiter(cap=bad)
    with pytest.raises(ValueError, match="initial rate"):
        RateLimiter(initial=bad)
    with pytest.raises(ValueError, match="slow-start rate"):
        RateLimiter(start=bad)


def test_case_a_night_that_met_no_429_hands_what_it_took_to_the_next_slow_start() -> None:
    """Case: the demo's nights (500 requests each, a loopback server with no limit) spent about
    two of their three seconds slow-starting from INITIAL_RATE every night. A night that met no
    429 measured no limit (``found`` is None) but knows what the server took over a window
    (``unrefused``); the next night's slow start begins there, as TCP caches a path's window,
    and still doubles every window. A 429 measures a limit, and then nothing is unrefused."""
    t = FakeTime()
    first = RateLimiter(clock=t.clock, sleep=t.sleep)
    run(first.wait_turn())
    answered(first, t, 100.0, K.ACCEPT_WINDOW)
    answered(first, t, 180.0, 1.5 * K.ACCEPT_WINDOW)
    assert first.found is None and first.unrefused == pytest.approx(180.0, rel=0.02)
    t2 = FakeTime()
    second = RateLimiter(start=first.unrefused, clock=t2.clock, sleep=t2.sleep)
    assert second.rate == pytest.approx(180.0, rel=0.02) and second.found is None
    run(second.wait_turn())
    answered(second, t2, 180.0, K.ACCEPT_WINDOW)
    assert second.rate == pytest.approx(360.0, rel=0.05)  # still a slow start: it doubles
    assert RateLimiter(start=20.0).rate == K.INITIAL_RATE  # never below the floor a night starts at
    answered(second, t2, 180.0, 0.1)
    assert second.on_rate_limited(started=t2.now, retry_after=1.0)
    assert second.found is not None and second.unrefused is None


# --- a 429 episode ------------------------------------------------------------------------------


def answered(limiter: RateLimiter, t: FakeTime, rate: float, seconds: float) -> None:
    """``seconds`` of answers at ``rate`` req/s."""
    for _ in range(round(rate * seconds)):
        t.now += 1.0 / rate
        limiter.on_success(t.now, 0.02)


def test_a_429_cuts_once_to_what_the_server_accepted_less_the_margin() -> None:
    """Case: unpaced at 200 answers a second, then 429s: the pace drops to 200 less the margin;
    the other requests in flight at the cut get their 429 too and change nothing."""
    t = FakeTime()
    limiter = RateLimiter(clock=t.clock, sleep=t.sleep)
    answered(limiter, t, 200.0, 2.0)
    assert limiter.on_rate_limited(started=t.now - 0.02, retry_after=1.0)
    assert limiter.found == pytest.approx(200.0, rel=0.01)
    assert limiter.rate == pytest.approx(200.0 * (1 - K.RATE_MARGIN), rel=0.01)
    cut = limiter.rate
    for _ in range(5):  # sent before the cut: the same episode
        assert not limiter.on_rate_limited(started=t.now - 0.01, retry_after=1.0)
    assert limiter.rate == cut and limiter.decreases == 1


def test_case_429s_within_a_window_of_a_measured_cut_do_not_compound_it() -> None:
    """Case: after a cut the server's bucket is empty, so a request sent just after it can be
    refused too. Cutting again for each (3 % a 429) took a 200/s night down to 174/s in 0.2 s
    (traced on the rate matrix's 200/5 cell); a window on, a 429 is a new episode."""
    t = FakeTime()
    limiter = RateLimiter(clock=t.clock, sleep=t.sleep)
    answered(limiter, t, 200.0, 2.0)
    assert limiter.on_rate_limited(started=t.now, retry_after=1.0)
    cut = limiter.rate
    for _ in range(5):
        answered(limiter, t, 194.0, 0.05)
        assert not limiter.on_rate_limited(started=t.now, retry_after=1.0)  # sent after the cut
    assert limiter.decreases == 1 and limiter.rate >= cut  # regrowing, never cut again
    answered(limiter, t, 194.0, K.ACCEPT_WINDOW)
    assert limiter.on_rate_limited(started=t.now, retry_after=1.0)
    assert limiter.decreases == 2


def test_case_a_cut_that_measured_a_bucket_s_stored_tokens_is_corrected_within_its_window() -> None:
    """Case: after a lull a bucket of 200 tokens at 200/s had stored tokens; a probe drained them
    and the window measured 245/s (traced on the whole night's 200/200 cell: 135 refusals in the
    window the cut was held). Since the cut the server accepts 200/s and refuses the rest: that
    is its rate, a cut within the window; a bunch refused while sending under it is not."""
    t = FakeTime()
    limiter = RateLimiter(clock=t.clock, sleep=t.sleep)
    answered(limiter, t, 245.0, 1.0)
    assert limiter.on_rate_limited(started=t.now, retry_after=1.0)
    assert limiter.found == pytest.approx(245.0, rel=0.01)
    for _ in range(10):  # 200 answers a second, one refused to every four accepted
        answered(limiter, t, 200.0, 0.02)
        cut = limiter.on_rate_limited(started=t.now, retry_after=1.0)
        if cut:
            break
    assert cut and limiter.found == pytest.approx(200.0, rel=0.1) and limiter.decreases == 2


def test_a_paced_429_cuts_to_the_lower_of_the_pace_and_what_was_accepted() -> None:
    t = FakeTime()
    limiter = RateLimiter(initial=150.0, clock=t.clock, sleep=t.sleep)
    answered(limiter, t, 180.0, 1.0)  # answers faster than the pace (a burst): the pace is the level
    assert limiter.on_rate_limited(started=t.now, retry_after=1.0)
    assert limiter.found == pytest.approx(limiter.rate / (1 - K.RATE_MARGIN))
    assert limiter.found <= 180.0


def test_a_429_with_too_few_answers_to_measure_cuts_to_a_floor_and_slow_starts() -> None:
    """Case: a night's first bunch at a small bucket: four answers measure no rate, but they are
    what the server let through over the time they took; the pace starts there and doubles every
    window (an unpaced client kept its bunch refused at 20 req/s and one token until a request
    ran out of retries: the rate matrix's first cell failed so)."""
    t = FakeTime()
    limiter = RateLimiter(clock=t.clock, sleep=t.sleep)
    answered(limiter, t, 200.0, 0.02)  # 4 answers
    assert limiter.on_rate_limited(started=t.now, retry_after=1.0)
    floor = 4 / 0.015  # four answers over the 15 ms they took
    assert limiter.found == pytest.approx(floor) and limiter.rate == pytest.approx(
        floor * (1 - K.RATE_MARGIN)
    )
    t.now += 2 * K.ACCEPT_WINDOW
    limiter.on_success(t.now, 0.02)
    assert limiter.rate == pytest.approx(4 * floor)  # two windows on: doubled twice


def test_case_a_night_that_ends_slow_starting_remembers_what_the_server_accepted_not_the_floor() -> None:
    """Case: a short night's first bunch cut the pace to a floor (16/s against a server of 80/s
    in CI); it ended two windows into the slow start, the server accepting 60/s. The next night
    starts at what was accepted: the floor is no measure of the server."""
    t = FakeTime()
    limiter = RateLimiter(clock=t.clock, sleep=t.sleep)
    answered(limiter, t, 20.0, 0.15)  # three answers, then a 429: a floor
    limiter.on_rate_limited(started=t.now, retry_after=1.0)
    assert limiter.found == pytest.approx(30.0)  # three answers over the 0.1 s they took
    answered(limiter, t, 60.0, 2 * K.ACCEPT_WINDOW)
    assert limiter.found == pytest.approx(60.0, rel=0.02)
    limiter.on_rate_limited(started=t.now, retry_after=1.0)  # a 429 measures the limit: a level
    answered(limiter, t, 20.0, 0.5)  # the night's tail, a trickle: the level stands
    assert limiter.found == pytest.approx(60.0, rel=0.02)


@pytest.mark.parametrize("retry_after", [0.0, None])
def test_retry_after_zero_or_a_past_date_never_spins(retry_after: float | None) -> None:
    t = FakeTime()
    limiter = RateLimiter(clock=t.clock, sleep=t.sleep)  # paced: two intervals
    limiter.on_rate_limited(started=t.now, retry_after=retry_after)
    assert limiter.paused_until == pytest.approx(t.now + 2.0 / K.INITIAL_RATE)
    unpaced = RateLimiter(adaptive=False, clock=t.clock, sleep=t.sleep)
    unpaced.on_rate_limited(started=t.now, retry_after=retry_after)
    assert unpaced.paused_until == pytest.approx(t.now + K.MIN_PAUSE)


def test_a_short_retry_after_pauses_everyone_two_intervals_a_long_one_all_of_it() -> None:
    """A token bucket's Retry-After is its rounded-up second: the next tokens come two intervals
    on at the new pace. A long one means the server is out for a while: everyone waits it."""
    t = FakeTime()
    limiter = RateLimiter(initial=100.0, clock=t.clock, sleep=t.sleep)
    answered(limiter, t, 100.0, 1.0)
    limiter.on_rate_limited(started=t.now, retry_after=1.0)
    assert limiter.paused_until == pytest.approx(t.now + 2.0 / limiter.rate)  # type: ignore[operator]
    limiter.on_rate_limited(started=t.now, retry_after=30.0)
    assert limiter.paused_until == pytest.approx(t.now + 30.0)


# --- regrowth (CUBIC) --------------------------------------------------------------------------------


def test_the_pace_regains_the_level_in_regrow_seconds_then_probes_beyond_ever_steeper() -> None:
    t = FakeTime()
    limiter = RateLimiter(clock=t.clock, sleep=t.sleep)
    answered(limiter, t, 100.0, 2.0)
    limiter.on_rate_limited(started=t.now, retry_after=1.0)
    level, start = limiter.found, limiter.rate
    assert level is not None and start is not None
    answered(limiter, t, 100.0, K.REGROW_SECONDS / 2)
    halfway = limiter.rate
    answered(limiter, t, 100.0, K.REGROW_SECONDS / 2)
    assert start < halfway < level  # type: ignore[operator]
    assert limiter.rate == pytest.approx(level, rel=0.002)  # flat near the level
    answered(limiter, t, 100.0, K.REGROW_SECONDS)
    beyond = limiter.rate
    answered(limiter, t, 100.0, K.REGROW_SECONDS)
    assert level < beyond < limiter.rate  # type: ignore[operator]
    assert limiter.rate - beyond > beyond - level  # type: ignore[operator]  # convex: ever steeper


def test_the_probe_never_runs_past_twice_what_is_being_sent() -> None:
    """A lull (few requests to send) is no licence to burst when the work comes back."""
    t = FakeTime()
    limiter = RateLimiter(clock=t.clock, sleep=t.sleep)
    answered(limiter, t, 100.0, 2.0)
    limiter.on_rate_limited(started=t.now, retry_after=1.0)
    answered(limiter, t, 30.0, 20 * K.REGROW_SECONDS)  # a long lull at 30 req/s
    assert limiter.rate is not None and limiter.rate <= max(limiter.found or 0, 2 * 30.0) + 1e-6


def test_the_rate_a_night_remembers_is_its_last_level_not_a_probes_peak() -> None:
    t = FakeTime()
    limiter = RateLimiter(clock=t.clock, sleep=t.sleep)
    answered(limiter, t, 80.0, 2.0)
    limiter.on_rate_limited(started=t.now, retry_after=1.0)
    answered(limiter, t, 80.0, 3 * K.REGROW_SECONDS)
    assert limiter.rate is not None and limiter.rate > 80.0 and limiter.found == pytest.approx(80.0, rel=0.02)


def test_an_explicit_cap_is_never_exceeded() -> None:
    t = FakeTime()
    limiter = RateLimiter(cap=50.0, initial=200.0, clock=t.clock, sleep=t.sleep)
    answered(limiter, t, 50.0, 30.0)
    assert limiter.rate == 50.0


# --- a night at a token bucket ---------------------------------------------------------------------


@pytest.mark.parametrize(("limit", "burst"), [(200.0, 5.0), (200.0, 20.0), (200.0, 200.0), (50.0, 5.0)])
def test_case_a_night_at_a_token_bucket_holds_near_its_limit_with_few_refusals(
    limit: float, burst: float
) -> None:
    """Case: one sender, 60 s at a bucket of ``limit`` req/s (simulated, fake clock): the server
    lets through at least 95 % of its limit and refuses under 1 % of the requests once the rate
    is found (the rate matrix's line), under 2 % with its discovery. (The whole night on real
    sockets is the rate matrix's: docs/benchmarks.md.)"""
    got = night(limit, burst, 60.0)
    assert got["share"] >= 0.95, got
    assert got["steady_refused"] < 0.01 and got["refused"] < 0.02, got


def test_case_a_night_started_at_the_found_rate_keeps_it() -> None:
    got = night(200.0, 20.0, 30.0, initial=198.0)
    assert got["share"] >= 0.97 and got["refused"] < 0.005, got


# --- a server that announces its limit ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        (
            {
                "RateLimit-Limit": "100",
                "RateLimit-Remaining": "40",
                "RateLimit-Reset": "12",
                "RateLimit-Policy": "100;w=60",
            },
            (100 / 60, 40.0, 12.0),
        ),
        ({"RateLimit-Limit": "50", "RateLimit-Remaining": "50", "RateLimit-Reset": "1"}, (50.0, 50.0, 1.0)),
        ({"RateLimit-Limit": "50", "RateLimit-Remaining": "0", "RateLimit-Reset": "7"}, (None, 0.0, 7.0)),
        (
            {"X-RateLimit-Limit": "5000", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1700000030"},
            (None, 0.0, 30.0),
        ),
        (
            {
                "X-RateLimit-Limit": "20",
                "X-RateLimit-Remaining": "3",
                "X-RateLimit-Reset": "0.5",
                "X-RateLimit-Policy": "20;w=1",
            },
            (20.0, 3.0, 0.5),
        ),
        (
            {"RateLimit-Limit": "100, 1000;w=3600", "RateLimit-Policy": "100;w=60, 1000;w=3600"},
            (100 / 60, None, None),
        ),
    ],
)
def test_announced_limit_header_forms(headers: dict[str, str], expected: tuple[Any, ...]) -> None:
    announced = parse_rate_headers(httpx.Headers(headers), now_epoch=1_700_000_000.0)
    assert announced is not None
    rate, remaining, reset = expected
    assert announced.rate == (pytest.approx(rate) if rate is not None else None)
    assert (announced.remaining, announced.reset) == (remaining, reset)


def test_no_rate_headers_is_no_announcement() -> None:
    assert parse_rate_headers(httpx.Headers({"Content-Type": "application/json"}), 0.0) is None


def test_an_announced_limit_is_obeyed_exactly_and_an_empty_quota_pauses_until_its_reset() -> None:
    t = FakeTime()
    limiter = RateLimiter(clock=t.clock, sleep=t.sleep)
    limiter.on_announced(RateAnnouncement(rate=20.0, remaining=5.0, reset=0.4))
    assert limiter.rate == pytest.approx(20.0 * (1 - K.ANNOUNCED_MARGIN))
    answered(limiter, t, 19.8, 60.0)  # a probe never passes the server's word
    assert limiter.rate <= 20.0 * (1 - K.ANNOUNCED_MARGIN)
    limiter.on_announced(RateAnnouncement(rate=20.0, remaining=0.0, reset=30.0))
    assert limiter.paused_until == pytest.approx(t.now + 30.0)  # a quota window: everyone waits
    quota = RateLimiter(clock=t.clock, sleep=t.sleep)
    quota.on_announced(RateAnnouncement(rate=None, remaining=0.0, reset=0.0))  # reset "now"
    assert quota.paused_until >= t.now + K.MIN_PAUSE - 1e-9  # a pause, never a spin


def test_case_a_429_under_an_announced_limit_never_lifts_the_cap() -> None:
    t = FakeTime()
    limiter = RateLimiter(clock=t.clock, sleep=t.sleep)
    limiter.on_announced(RateAnnouncement(rate=40.0))
    answered(limiter, t, 39.6, 2.0)
    limiter.on_rate_limited(started=t.now, retry_after=1.0)
    answered(limiter, t, 39.6, 10 * K.REGROW_SECONDS)
    assert limiter.rate <= 40.0 * (1 - K.ANNOUNCED_MARGIN)  # type: ignore[operator]


# --- a fixed window ----------------------------------------------------------------------------------


class Window:
    """A server's fixed window: ``quota`` requests a window of ``seconds`` from its first request
    (or, with ``began``, windows on a clock of their own); beyond, refused until it ends, with the
    sandbox's ``Retry-After``: the seconds to the window's end, rounded up."""

    def __init__(self, quota: int, seconds: float, began: float | None = None) -> None:
        self.quota, self.seconds = quota, seconds
        self.start, self.used = (began if began is not None else float("-inf")), 0

    def take(self, now: float) -> float:
        """0 when the request passes, else its Retry-After."""
        if now >= self.start + self.seconds:
            ends = (now - self.start) // self.seconds if self.start > float("-inf") else 0
            self.start, self.used = (self.start + ends * self.seconds if ends else now), 0
        if self.used < self.quota:
            self.used += 1
            return 0.0
        return float(-(-(self.start + self.seconds - now) // 1))


def window_night(window: Window, seconds: float, latency: float = 0.02) -> tuple[list[float], RateLimiter]:
    """One sender at a window for ``seconds``: the times of its refusals, and its limiter."""
    t = FakeTime()
    limiter = RateLimiter(clock=t.clock, sleep=t.sleep)
    start, refusals = t.now, []

    async def go() -> None:
        while t.now - start < seconds:
            await limiter.wait_turn()
            sent = t.now
            t.now += latency
            retry_after = window.take(sent)
            if retry_after:
                refusals.append(sent - start)
                limiter.on_rate_limited(sent, retry_after=retry_after)
            else:
                limiter.on_success(t.now, latency)

    run(go())
    return refusals, limiter


def test_case_a_fixed_window_is_learned_from_its_end_and_its_quota_spread_over_it() -> None:
    """Case: 1,200 requests a minute, Retry-After the window's end. The first window's quota is
    spent early (nothing told us) and its end refuses once; from then on the pace is the
    window's quota over its length, less the margin, and no window ends in a refusal."""
    refusals, limiter = window_night(Window(1200, 60.0), seconds=600.0)
    assert len(refusals) == 1 and refusals[0] < 60.0, refusals
    assert limiter.rate == pytest.approx(20.0 * (1 - K.RATE_MARGIN), rel=0.02)
    assert limiter.found == pytest.approx(20.0, rel=0.02)  # the next night starts at the window's rate


def test_case_a_window_begun_before_the_night_is_measured_at_its_next_end() -> None:
    """Case: the server's windows run on its own clock, the first one 30 s old when the night
    begins: its quota over the 30 s left reads twice the rate. The next end comes early, a whole
    window after the first: that one measures the window exactly, and no later one refuses."""
    refusals, limiter = window_night(Window(1200, 60.0, began=1000.0 - 30.0), seconds=600.0)
    assert len(refusals) == 2 and refusals[1] < 90.0, refusals
    assert limiter.rate == pytest.approx(20.0 * (1 - K.RATE_MARGIN), rel=0.02)


def test_a_window_s_volley_is_one_end_and_a_spent_window_teaches_nothing() -> None:
    """The other 429s of a window's end name the same end (each rounded up): learned once. A
    window spent before any answer of ours (another sender's quota) teaches no rate."""
    t = FakeTime()
    limiter = RateLimiter(clock=t.clock, sleep=t.sleep)
    run(limiter.wait_turn())
    assert not limiter.on_rate_limited(t.now, retry_after=40.0)  # nothing of ours accepted
    assert limiter.rate == K.INITIAL_RATE and limiter.paused_until == pytest.approx(t.now + 40.0)
    t.now += 40.0
    answered(limiter, t, 50.0, 20.0)
    assert limiter.on_rate_limited(t.now, retry_after=40.0)  # 1,000 in the 60 s since that end
    learned = limiter.rate
    assert learned == pytest.approx(1000 / 60.0 * (1 - K.RATE_MARGIN), rel=0.01)
    assert not limiter.on_rate_limited(t.now + 0.3, retry_after=40.0)  # the same end, its volley
    assert limiter.rate == learned


def test_an_exhausted_quota_s_long_reset_teaches_the_window_too() -> None:
    """``RateLimit-Remaining: 0`` with a reset and no window length (no policy): its reset names
    the window's end as a Retry-After does."""
    t = FakeTime()
    limiter = RateLimiter(clock=t.clock, sleep=t.sleep)
    run(limiter.wait_turn())
    answered(limiter, t, 100.0, 12.0)  # 1,200 accepted in the first 12 s
    limiter.on_announced(RateAnnouncement(rate=None, remaining=0.0, reset=48.0))
    assert limiter.paused_until == pytest.approx(t.now + 48.0)
    assert limiter.rate == pytest.approx(1200 / 60.0 * (1 - K.RATE_MARGIN), rel=0.01)


def test_a_pause_that_begins_while_a_request_waits_for_its_slot_holds_it_too() -> None:
    """Case: at a window's end, the requests already given a slot (up to one a slot ahead each)
    were sent anyway, into the wall: one 429 each (a 20/s window's night: 102 refused). A pause
    that begins while a request waits for its slot holds it to the pause's end, then a new slot."""
    t = FakeTime()

    async def sleep(seconds: float) -> None:  # the fake clock's, but yielding: others run meanwhile
        await t.sleep(seconds)
        await asyncio.sleep(0)

    limiter = RateLimiter(initial=10.0, clock=t.clock, sleep=sleep)

    async def go() -> float:
        run_first = asyncio.ensure_future(limiter.wait_turn())  # at once
        waiting = asyncio.ensure_future(limiter.wait_turn())  # its slot 0.1 s on
        await asyncio.sleep(0)
        await run_first
        limiter.on_rate_limited(t.now, retry_after=30.0)  # the window ends, 30 s to go
        await waiting
        return t.now

    started = t.now
    assert run(go()) - started >= 30.0
