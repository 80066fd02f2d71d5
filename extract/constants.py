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
MAX_CONCURRENCY = 32  # requests in flight at most (also the connection pool size)
INITIAL_CONCURRENCY = 8  # adaptive limit starts here and grows while the server keeps up
MIN_CONCURRENCY = 1
CONCURRENCY_DECREASE = 0.75  # multiplicative decrease of the concurrency limit on a 429

# -- politeness: request rate (AIMD) ------------------------------------------------------
# Until the first 429 the rate is unlimited (or the explicit cap). On a 429 the rate drops
# to RATE_DECREASE x the throughput seen just before (once per episode); every success then
# adds RATE_INCREASE req/s, i.e. the rate grows by ~2 % per second whatever its size.
RATE_DECREASE = 0.8
RATE_INCREASE = 0.02  # req/s added per successful request
RATE_ACCELERATION_SECONDS = 10.0  # without a 429 for this long, the increase doubles (x3 at 2x...)
MIN_RATE = 1.0  # req/s; never slower than this
# Client-side pacing lets a request leave this many intervals early (a burst of 2): enough to
# absorb timer jitter, small enough for a server whose own bucket holds only a few tokens.
RATE_BURST = 1.0
THROUGHPUT_WINDOW = 0.5  # seconds over which the observed throughput is measured

# -- paging ------------------------------------------------------------------------------
MAX_PAGES = 1_000_000  # a guard against a server whose totalCount never stops growing

# -- error text --------------------------------------------------------------------------
MAX_ERROR_MESSAGE = 300  # characters of a server's error message kept in our error's text
