"""The retry policy as pure functions (no I/O, no clock of their own: easy to test).

- :func:`should_retry` -- is this failure worth another attempt? Reads retry on transient
  statuses (429, 500, 502, 503, 504), connection errors, timeouts and malformed bodies.
  A write (POST) is repeated **only when it certainly did not reach the server**: the
  connection was refused / never made, or the server answered 429. Never after a 5xx, a
  dropped connection or a timeout once sent: the server may have acted on it, and a
  second insert would be a duplicate. 400, 401, 403, 404, 409 are never retried.
- :func:`retry_delay` -- capped exponential backoff with full jitter, or the server's
  ``Retry-After`` (capped) when it sent one.
- :func:`parse_retry_after` -- ``Retry-After`` in delta-seconds or HTTP-date form.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from email.utils import parsedate_to_datetime

from membersync.extract import constants
from membersync.extract.errors import ServiceError


def should_retry(method: str, error: ServiceError, retries_done: int, max_retries: int) -> bool:
    """Whether to send ``method`` again after ``error``, ``retries_done`` retries so far."""
    if retries_done >= max_retries or not error.retryable:
        return False
    if method == "GET":
        return True
    return not error.may_have_reached


def retry_delay(
    retries_done: int,
    retry_after: float | None = None,
    *,
    base: float = constants.BACKOFF_BASE,
    cap: float = constants.BACKOFF_MAX,
    retry_after_cap: float = constants.RETRY_AFTER_MAX,
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait before retry number ``retries_done + 1``.

    The server's ``Retry-After`` wins when given (capped at ``retry_after_cap``); otherwise
    full jitter: uniform in ``[0, min(cap, base * 2**retries_done))``, which spreads the
    retries of many concurrent requests instead of synchronising them.
    """
    if retry_after is not None:
        return min(max(retry_after, 0.0), retry_after_cap)
    ceiling = min(cap, base * (2 ** min(retries_done, 62)))
    return rand() * ceiling


def parse_retry_after(
    value: str | None, now: float, *, cap: float = constants.RETRY_AFTER_MAX
) -> float | None:
    """Seconds to wait according to a ``Retry-After`` header, or None when absent/unreadable.

    ``now`` is the current time in seconds since the epoch (for the HTTP-date form). A date
    in the past means 0; anything longer than ``cap`` is cut to ``cap``.
    """
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # RFC 9110 dates are GMT; a naive result means it said so
            from datetime import UTC

            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - now
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), cap)
