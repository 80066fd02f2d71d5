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

# -- politeness (see limits: a token bucket at a rate found with CUBIC, as botocore's adaptive mode)
# Requests in flight at most (also the connection pool size). The rate limiter keeps us polite;
# this only has to allow the rate at the server's latency (200 req/s x 0.2 s = 40 in flight).
MAX_CONCURRENCY = 128
INITIAL_CONCURRENCY = 8  # the adaptive limit starts here and grows while the server keeps up
CONCURRENCY_DECREASE = 0.75  # multiplicative decrease of the concurrency limit on a cut
# Once paced, the limit keeps room for rate x latency (Little's law) times this: the pace, not
# the number in flight, is what keeps us polite, and a starved pace is a longer night.
CONCURRENCY_HEADROOM = 1.5
LATENCY_SMOOTHING = 0.05  # weight of each new latency in its moving average
# A 429 episode cuts the pace to what the server accepted over the last ACCEPT_WINDOW seconds
# (at least ACCEPT_MIN_COUNT answers; fewer are a floor it doubles from every window, a slow
# start), less RATE_MARGIN; CUBIC brings it back to that level in
# REGROW_SECONDS, then beyond, ever steeper, until the next 429.
RATE_MARGIN = 0.03
# A night that knows no rate starts paced here and doubles every ACCEPT_WINDOW (a slow start in
# time) until a 429 measures the limit: doubling every round trip, an unpaced start met a bucket
# of 200 tokens ~128 requests in flight when it emptied, and all of them were refused.
INITIAL_RATE = 100.0
REGROW_SECONDS = 3.0
ACCEPT_WINDOW = 1.0
ACCEPT_MIN_COUNT = 10
ANNOUNCED_MARGIN = 0.01  # pace this far below a limit the server announces
SHARED_PAUSE_FULL = 2.0  # seconds: a longer Retry-After pauses every request for all of it
MIN_PAUSE = 0.05  # seconds: the shortest shared pause (Retry-After: 0 never makes us spin)
MIN_RATE = 1.0  # req/s; never slower than this
# A fixed window: a 429 whose Retry-After (or an exhausted quota's reset) is longer than
# SHARED_PAUSE_FULL names the window's end; ends less than WINDOW_SAME_END apart are one window's
# (its volley, each Retry-After rounded up to a whole second).
WINDOW_SAME_END = 2.0
# A cap on requests in flight is learned from 429s at a number in flight the server, over its
# last CAP_EVIDENCE answers, refused at least as often as it accepted; it is probed one higher
# after CAP_PROBE_SECONDS at it (a cap mistaken from a token bucket's refusals lifts; a real one
# costs one 429 a probe).
CAP_EVIDENCE = 200
CAP_PROBE_SECONDS = 30.0

# -- paging ------------------------------------------------------------------------------
MAX_PAGES = 1_000_000  # a guard against a server whose totalCount never stops growing

# -- error text --------------------------------------------------------------------------
MAX_ERROR_MESSAGE = 300  # characters of a server's error message kept in our error's text
