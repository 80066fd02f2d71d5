"""The sandbox's limits per credential, as vendors set them: a **token bucket** (``rate``
tokens a second, ``burst`` at most), a **fixed window** (``rate x window`` requests a window,
counted from its first request) and a **cap on requests open at once** (the server counts those;
see ``SandboxServer.handle``). A request a limit refuses is answered 429 with ``Retry-After``.
"""

from __future__ import annotations

import math
import time

from membersync.extract.settings import SettingsError


class TokenBucket:
    """``rate`` tokens per second, at most ``capacity``; a request takes one."""

    def __init__(self, rate: float, capacity: float) -> None:
        self.rate, self.capacity = rate, capacity
        self.tokens, self.stamp = capacity, time.monotonic()

    def take(self) -> float:
        """0 when the request may pass, else the seconds until a token is there."""
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate

    def announce(self) -> dict[str, str]:
        """The bucket as ``RateLimit-*`` headers (IETF draft): ``rate`` per 1 s window."""
        return {
            "RateLimit-Limit": f"{self.rate:g}",
            "RateLimit-Remaining": str(int(self.tokens)),
            "RateLimit-Reset": str(math.ceil((1 - self.tokens) / self.rate)) if self.tokens < 1 else "0",
            "RateLimit-Policy": f"{self.rate:g};w=1",
        }


class FixedWindow:
    """``quota`` requests a window of ``seconds``, counted from the window's first request (its
    start); beyond them every request is refused until the window ends, as "1,200 a minute"."""

    def __init__(self, quota: int, seconds: float) -> None:
        self.quota, self.seconds = quota, seconds
        self.start, self.used = float("-inf"), 0

    def take(self) -> float:
        """0 when the request may pass, else the seconds until the window ends."""
        now = time.monotonic()
        if now >= self.start + self.seconds:
            self.start, self.used = now, 0
        if self.used < self.quota:
            self.used += 1
            return 0.0
        return self.start + self.seconds - now

    def announce(self) -> dict[str, str]:
        """The window as ``RateLimit-*`` headers: its quota, what is left, seconds to its end."""
        left = max(0.0, self.start + self.seconds - time.monotonic())
        return {
            "RateLimit-Limit": str(self.quota),
            "RateLimit-Remaining": str(self.quota - self.used),
            "RateLimit-Reset": str(math.ceil(left)),
            "RateLimit-Policy": f"{self.quota};w={self.seconds:g}",
        }


Limiter = TokenBucket | FixedWindow


def limiter_for(rate: float, burst: float, window: float) -> Limiter:
    """A credential's rate limit: a fixed window of ``rate x window`` requests, or a bucket."""
    if window:
        return FixedWindow(max(1, round(rate * window)), window)
    return TokenBucket(rate, burst)


def check_limits(rate: float, burst: float | None, window: float, max_in_flight: int) -> None:
    """The two limit kinds beside the token bucket: a window needs a rate and has no burst."""
    if not (math.isfinite(window) and window >= 0):
        raise SettingsError("sandbox window must be >= 0 seconds (0 = a token bucket)")
    if window and not rate:
        raise SettingsError("sandbox window needs a rate: its quota is rate x window requests")
    if window and burst is not None:
        raise SettingsError("sandbox burst is a token bucket's: a fixed window has none")
    if not isinstance(max_in_flight, int) or max_in_flight < 0:
        raise SettingsError("sandbox max in flight must be a whole number >= 0 (0 = no cap)")
