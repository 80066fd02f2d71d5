"""A fake clock for logic in time (the limiter, the client's retries): time moves only when
someone sleeps, so the tests are exact and never depend on this machine's speed."""

from __future__ import annotations

WALL = 1_700_000_000.0  # the wall clock (epoch seconds) when the fake monotonic clock reads START
START = 1000.0


class FakeTime:
    """A monotonic clock that only moves when someone sleeps; records every sleep."""

    def __init__(self) -> None:
        self.now = START
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def wall(self) -> float:
        return WALL + self.now - START

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += max(seconds, 0.0)
