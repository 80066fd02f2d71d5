"""Progress of a night: a protocol the sync reports to, a silent default, and a terminal bar.

The sync calls :meth:`Progress.advance` once per client fetched (cheap: a counter). The rich
bar reads the client's :class:`~membersync.extract.client.ClientStats` only when it redraws
(a few times a second, on rich's own thread), so requests/s and retries cost the sync nothing.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    ProgressColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.progress import Progress as RichBar
from rich.text import Text


class Progress(Protocol):
    def attach(self, stats: Callable[[], Any]) -> None:
        """Where to read the client's stats (``.requests``, ``.retries``, ``.status_429``)."""

    def phase(self, name: str) -> None: ...

    def start_clients(self, total: int, done: int) -> None:
        """The night's client count, and how many an interrupted run already wrote."""

    def advance(self, clients: int) -> None: ...

    def close(self) -> None: ...


class NullProgress:
    """Reports nowhere."""

    def attach(self, stats: Callable[[], Any]) -> None:
        pass

    def phase(self, name: str) -> None:
        pass

    def start_clients(self, total: int, done: int) -> None:
        pass

    def advance(self, clients: int) -> None:
        pass

    def close(self) -> None:
        pass


class _RequestsColumn(ProgressColumn):
    """requests/s over the last ~5 seconds ("now": the summary gives the night's average), retries
    and 429s, read from the client's stats."""

    def __init__(self, owner: RichProgress) -> None:
        super().__init__()
        self.owner = owner
        self.samples: deque[tuple[float, int]] = deque(maxlen=20)

    def render(self, task: Any) -> Text:
        stats = self.owner.stats()
        if stats is None:
            return Text("")
        now = time.monotonic()
        self.samples.append((now, int(stats.requests)))
        first_t, first_n = self.samples[0]
        rate = (self.samples[-1][1] - first_n) / (now - first_t) if now > first_t else 0.0
        return Text(
            f"{rate:,.0f} req/s now  {int(stats.requests):,} requests  "
            f"{int(stats.retries):,} retries  {int(stats.status_429):,} x 429",
            style="cyan",
        )


class RichProgress:
    """A terminal bar: phase, clients done/total, requests/s, retries (on stderr)."""

    def __init__(self, console: Console | None = None) -> None:
        self._stats: Callable[[], Any] | None = None
        self._bar = RichBar(
            TextColumn("[bold]{task.description:<16}"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            _RequestsColumn(self),
            console=console or Console(stderr=True),
            transient=False,
            refresh_per_second=4,
        )
        self._task = self._bar.add_task("starting", total=None)
        self._bar.start()

    def stats(self) -> Any:
        if self._stats is None:
            return None
        try:
            return self._stats()
        except Exception:  # the client is gone (closing): show nothing rather than crash a redraw
            return None

    def attach(self, stats: Callable[[], Any]) -> None:
        self._stats = stats

    def phase(self, name: str) -> None:
        self._bar.update(self._task, description=name)

    def start_clients(self, total: int, done: int) -> None:
        self._bar.update(self._task, total=total, completed=done)

    def advance(self, clients: int) -> None:
        self._bar.advance(self._task, clients)

    def close(self) -> None:
        last = self.stats()
        if last is not None:  # keep the final figures on screen: snapshot them before the client closes
            snapshot = _Snapshot(int(last.requests), int(last.retries), int(last.status_429))
            self._stats = lambda: snapshot
        self._bar.refresh()
        self._bar.stop()


class _Snapshot:
    def __init__(self, requests: int, retries: int, status_429: int) -> None:
        self.requests = requests
        self.retries = retries
        self.status_429 = status_429
