"""The night's event loop (extract/eventloop.py): asyncio's, with a short timer timed by select().

Its precision is a benchmark's matter (``membersync bench --rate-matrix``, the one-token rows);
here: that it is a working event loop, never fires a timer early and falls back to epoll when
select() cannot take its descriptor. How the rate limiter paces on it: tests/test_client_retry.py.
"""

from __future__ import annotations

import asyncio
import os
import resource
import selectors
import socket
import time
from collections.abc import Iterator

import pytest
from membersync.extract import eventloop

linux_only = pytest.mark.skipif(not hasattr(selectors, "EpollSelector"), reason="epoll is Linux's")


@linux_only
def test_the_nights_loop_is_precise_and_asyncios_own_is_not() -> None:
    loop = eventloop.new_event_loop()
    plain = asyncio.new_event_loop()
    try:
        assert eventloop.precise_timers(loop) is True
        assert eventloop.precise_timers(plain) is False
    finally:
        loop.close()
        plain.close()


@linux_only
def test_the_nights_loop_serves_sockets_and_fires_short_timers_never_early() -> None:
    """A short timer (a pacing slot) fires at or after its time, in order, while the loop also
    answers a socket: the select() wait returns at the first event, epoll then reports it."""

    async def main() -> tuple[list[tuple[int, float, float]], bytes]:
        loop = asyncio.get_running_loop()
        fired: list[tuple[int, float, float]] = []
        for i, delay in enumerate((0.0031, 0.0007, 0.0122, 0.0049)):
            due = loop.time() + delay
            loop.call_at(due, lambda i=i, due=due: fired.append((i, due, loop.time())))
        left, right = socket.socketpair()
        with left, right:
            reader, writer = await asyncio.open_connection(sock=left)
            loop.call_later(0.002, right.sendall, b"answer")
            got = await reader.readexactly(6)
            await asyncio.sleep(0.02)
            writer.close()
        return fired, got

    fired, got = eventloop.run(main())
    assert got == b"answer"
    assert [i for i, _, _ in fired] == [1, 0, 3, 2]  # in the order they were due
    assert all(at >= due for _, due, at in fired)  # none early


@linux_only
def test_a_short_select_with_nothing_ready_waits_its_timeout_and_reports_nothing() -> None:
    with eventloop.PreciseEpollSelector() as selector:
        started = time.monotonic()
        assert selector.select(0.004) == []
        assert time.monotonic() - started >= 0.004


@pytest.fixture
def descriptors_past_fd_setsize() -> Iterator[None]:
    """This process holds descriptors past select()'s FD_SETSIZE (1,024) while the test runs."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit of open files here is {hard}: it cannot pass FD_SETSIZE")
    if soft != resource.RLIM_INFINITY and soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1200, hard))
    opened = [os.dup(0) for _ in range(1100)]
    try:
        yield
    finally:
        for fd in opened:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@linux_only
def test_a_loop_made_past_fd_setsize_falls_back_to_epoll(descriptors_past_fd_setsize: None) -> None:
    """select() cannot take a descriptor numbered past FD_SETSIZE: a loop made in a process
    holding that many files waits with epoll alone, and still works."""
    with eventloop.PreciseEpollSelector() as selector:
        assert selector.fileno() >= 1024
        left, right = socket.socketpair()
        with left, right:
            selector.register(left, selectors.EVENT_READ)
            assert selector.select(0.003) == []  # ValueError from select(): epoll's wait instead
            right.sendall(b"x")
            assert [key.fileobj for key, _ in selector.select(0.05)] == [left]


def test_the_timers_benchmark_measures_each_loop_and_no_timer_fires_early(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``benchmarks.timers``: one row per loop and interval, lateness never negative."""
    from membersync.flows.benchmarks import timers

    assert timers.main(["--intervals", "0.005", "--seconds", "0.3"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 5 ms")]
    assert len(rows) == 3
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        late = [float(c.removesuffix(" ms")) for c in cells[2:5]]
        assert 0.0 <= late[0] <= late[1] <= late[2]


SLACK = "/proc/self/timerslack_ns"  # (the main thread's: pytest runs each test on it)


@pytest.mark.skipif(not os.path.exists(SLACK), reason="the timer slack is Linux's")
def test_a_night_runs_with_a_fine_timer_slack_and_gives_the_default_back() -> None:
    """Linux lets a sleeping thread wake up to its timer slack late (50 us by default): every
    paced wake-up of a night came at least 0.051 ms late (traced). The night's loop runs with
    1 us and the thread has its own back afterwards, as the kernel's table says."""

    def slack() -> int:
        with open(SLACK) as f:
            return int(f.read())

    before = slack()

    async def during() -> int:
        await asyncio.sleep(0.001)
        return slack()

    assert eventloop.run(during()) == 1_000
    assert slack() == before
