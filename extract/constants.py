"""Every number of the client's retry, limit and timeout policy, in one place.

The client (:mod:`membersync.extract.client`), the retry policy
(:mod:`membersync.extract.retry`) and the politeness limits
(:mod:`membersync.extract.limits`) read their defaults from here; a caller overrides
them per client with :class:`membersync.extract.client.ClientOptions`.
"""

from __future__ import annotations

# -- timeouts (seconds) ------------------------------------------------------------------
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 30.0
WRITE_TIMEOUT = 30.0
# Waiting for a free pooled connection. Our own concurrency limit keeps requests in flight
# below the pool size, so this only fires when something is badly wrong.
POOL_TIMEOUT = 60.0
# One attempt as a whole (connect, send, every read of the body). The read timeout restarts
# with every chunk, so a server that trickles a byte now and then would hold a request (and
# the night) for ever without this deadline.
REQUEST_TIMEOUT = 90.0
# The read timeout (on the direct aiohttp path: counted from the attempt's start plus the
# connect timeout until the answer's headers, then from the body's last growth) and the whole
# attempt's deadline are checked by one timer for every attempt in flight (extract/deadlines.py),
# every this many seconds at most (a quarter of the shorter timeout): a deadline fires up to one
# tick late.
DEADLINE_TICK = 0.5

# -- retries -----------------------------------------------------------------------------
MAX_RETRIES = 5  # retries after the first attempt (6 attempts in all)
BACKOFF_BASE = 0.5  # seconds; attempt n waits uniform(0, min(BACKOFF_MAX, BACKOFF_BASE * 2**n))
BACKOFF_MAX = 30.0
RETRY_AFTER_MAX = 120.0  # a server's Retry-After is honoured up to this many seconds

# Statuses worth another try (transient); every other status is final.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# Statuses that are never retried, whatever the method (documented for readers and tests).
NEVER_RETRY_STATUSES = frozenset({400, 401, 403, 404, 409})

# -- politeness: concurrency ---------------------------------------------------------------
# Requests in flight at most (also the connection pool size). The rate limiter keeps us polite;
# this only has to allow the rate at the server's latency (200 req/s x 0.2 s = 40 in flight).
MAX_CONCURRENCY = 128
INITIAL_CONCURRENCY = 8  # adaptive limit starts here and grows while the server keeps up
MIN_CONCURRENCY = 1
CONCURRENCY_DECREASE = 0.75  # multiplicative decrease of the concurrency limit on a 429
# Once paced, the limit keeps room for rate x latency (Little's law) times this: the pace, not
# the number in flight, is what keeps us polite, and a starved pace is a longer night.
CONCURRENCY_HEADROOM = 1.5
LATENCY_SMOOTHING = 0.05  # weight of each new latency in its moving average

# -- politeness: request rate (see limits.RateLimiter) ------------------------------------
# Until the first 429 the rate is unlimited (or the explicit cap, or the rate the previous night
# found). On a 429 the server's rate is estimated from what it accepted over the last
# ACCEPT_WINDOW seconds of sending; the pace goes RATE_MARGIN below it and probes upward slowly.
RATE_MARGIN = 0.02  # pace this far below the estimated limit
RATE_DECREASE = 0.8  # the cut when a 429 comes before any estimate is possible
RATE_START = 10.0  # req/s: the first cut when a 429 comes before anything could be measured
RATE_PROBE_START = 1.0  # growth per second before any estimate (a slow start: x2.7 a second)
RATE_PROBE_FAR = 0.2  # growth per second while well below the estimated limit (20 %/s)
RATE_PROBE_NEAR = 0.002  # growth per second near it: ~10 s from the margin to the limit (not at
# a bucket known to hold one token: there only the per-answer climb below, at any rate)
RATE_PROBE_NEAR_PER_ANSWER = 0.00005  # and at most 1 % per 200 answers (slower under 40 req/s)
# Near it, once no 429 came for PROBE_QUIET_SECONDS (the estimate may be low: taken over a
# second that held a slow start's ramp), the growth doubles every RATE_PROBE_DOUBLING seconds:
# at the limit that draws a 429 about every 10 s, a step back each time.
PROBE_QUIET_SECONDS = 4.0
# ... and at least this many answers' time: at a low rate a probe cycle of a few seconds, each
# ending in a 429, refused ~1 % of the answers (20 req/s); 200 answers is 10 s there.
PROBE_QUIET_ANSWERS = 200
RATE_PROBE_DOUBLING = 2.0
ANNOUNCED_MARGIN = 0.01  # pace this far below a limit the server announces
ACCEPT_WINDOW = 1.0  # seconds of accepted answers behind an estimate
ACCEPT_MIN_SPAN = 0.5  # an estimate needs this many seconds of sending ...
ACCEPT_MIN_COUNT = 10  # ... and this many accepted answers
# At a pace of at least this, too few answers to measure means a lull in demand (a batch's end):
# a lone 429 then, under the level settled, is no cut. Slower, a window never holds answers enough.
LULL_MIN_RATE = 1.5 * ACCEPT_MIN_COUNT / ACCEPT_WINDOW
# Before that, a young streak's share refused estimates the limit from at least this many
# answers, and only while it holds at most this many 429s after its first: more are the requests
# in flight when a slow start overshot (28 of 34 answers at 20 req/s, burst 20: a cut to 8 req/s).
STREAK_MIN_ANSWERS = 5
STREAK_MAX_REFUSED = 3
# Isolated 429s (jitter at a small bucket) cost nothing but a pause while they stay under this
# share of the answers of the last TALLY_SECONDS; above it, each steps the pace back a little.
REFUSALS_TOLERATED = 0.005
# Above the limit, a steady share of requests is refused ((pace - limit) / pace); below this share
# of the last ACCEPT_WINDOW s (or, under an announced limit, of the last TALLY_SECONDS), a 429 is
# taken for an isolated one (a burst, jitter).
SUSTAINED_REFUSALS = 0.03
# At a bucket known to hold one token, a pace above its limit has about every other request
# refused (each 429's pause of two intervals lets one through, the next comes too soon); 429s
# under this share of the last ACCEPT_WINDOW s are arrivals bunched on the way (a stall at either
# end), however many: three in 0.93 s at 50 req/s, 5 % under the limit, cut it 7.5 % (traced).
ONE_TOKEN_SUSTAINED_REFUSALS = 0.15
# Under an announced limit, a steady share also needs at least this many 429s, in this many
# seconds of the tally: a few at once are a stall's bunch (3 429s among a short night's 99 answers
# are 3 %, and cut an announced 40 req/s to 37.7, CI).
STEADY_MIN_REFUSED = 5
STEADY_MIN_SECONDS = 3
# A 429's spacing from the last one measures how far above the limit we send (limits._overshoot)
# when the pause after the last one was at most this many intervals (a token bucket's next token).
SPACING_PAUSE_INTERVALS = 2.0
TALLY_SECONDS = 10
TALLY_MIN_ANSWERS = 200  # at a one-token bucket, the tally's share of 429s is over at least this many answers
SHARED_PAUSE_FULL = 2.0  # seconds: a longer Retry-After pauses every request for all of it
MIN_PAUSE = 0.05  # seconds: the shortest shared pause (Retry-After: 0 never makes us spin)
MIN_RATE = 1.0  # req/s; never slower than this
# Client-side pacing lets a request leave this many intervals early until the first 429 (timer
# jitter); after it, none.
RATE_BURST = 1.0
# After an isolated 429 a late request no longer takes its missed slot (a one-token bucket
# refuses the pair), except above this rate on asyncio's default event loop, whose ~1 ms late
# wake-ups are a large share of an interval there (the night's own loop: extract/eventloop.py).
CATCH_UP_KEPT_ABOVE = 100.0  # req/s
# The same on the night's own loop, whose wake-up, aimed early by a low quantile of its lateness
# (LEAD_*), is ~0.03 ms late (mean): 1.5 % of the interval at 500 req/s. (Before that lead, 0.15
# ms late, 300: stopping at 500 req/s cost a night of burst 5, 200 ms 96 -> 93 % of the limit; with
# it, 500/5 read 99 % at 0 and 200 ms, and 500/1/0 ms 85-89 -> 93 %, measured.)
CATCH_UP_KEPT_ABOVE_PRECISE = 1000.0  # req/s
# Without catching up on asyncio's default loop, the last this-many seconds of a wait for a slot
# are slept blocking, not on its timer (rounded up to the next ms): at most this per request.
SETTLE_WAIT = 0.002
# On the night's own event loop (extract/eventloop.py) a timer due sooner than this is waited for
# with select()'s microseconds, not epoll's milliseconds (a pacing slot: 2-50 ms; a deadline: s).
PRECISE_TIMEOUT_BELOW = 0.1  # seconds
# A slot's wake-up is aimed early by this quantile of how late the loop's wake-ups come (learnt
# per wake-up, by steps of LEAD_STEP seconds), at most LEAD_MAX_SHARE of the interval: about one
# wake-up in ten then comes a little early, the rest late by less (extract/limits._learn_lateness).
LEAD_QUANTILE = 0.1
LEAD_STEP = 10e-6  # seconds
LEAD_MAX_SHARE = 0.1
GRANTS_KEPT = 512  # the send times kept to tell a 429 on a close pair (500 req/s x 200 ms in flight, x5)
THROUGHPUT_WINDOW = 0.5  # seconds over which the observed throughput is measured

# -- paging ------------------------------------------------------------------------------
MAX_PAGES = 1_000_000  # a guard against a server whose totalCount never stops growing

# -- error text --------------------------------------------------------------------------
MAX_ERROR_MESSAGE = 300  # characters of a server's error message kept in our error's text
