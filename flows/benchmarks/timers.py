"""How late an event loop's short timer fires: asyncio's own loop against the night's.

A paced request leaves when its timer fires, so a timer's lateness is the spread of the send
times that a one-token bucket judges (extract/eventloop.py). Each loop sleeps to ``count`` due
times ``interval`` apart on its schedule (as the rate limiter does), and reports how late each
wake-up was (p50, p99, max, in ms) and the loop's CPU per wake-up::

    python -m membersync.flows.benchmarks.timers [--intervals 0.02,0.005,0.002] [--seconds 4]

The limiter's other way, sleeping the last 2 ms of a wait blocking (``time.sleep``), on asyncio's
own loop below 100 req/s, is the third row of each interval.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Callable

from membersync.extract import constants, eventloop


async def _lateness(count: int, interval: float, settle: bool) -> list[float]:
    loop = asyncio.get_running_loop()
    late: list[float] = []
    due = loop.time()
    for _ in range(count):
        due += interval
        wait = due - loop.time()
        if settle and wait > constants.SETTLE_WAIT:
            await asyncio.sleep(wait - constants.SETTLE_WAIT)
            wait = due - loop.time()
        if settle and wait > 0:
            time.sleep(wait)
        elif wait > 0:
            await asyncio.sleep(wait)
        late.append(loop.time() - due)
    return late


def measure(
    make_loop: Callable[[], asyncio.AbstractEventLoop], interval: float, seconds: float, settle: bool
) -> str:
    count = max(50, int(seconds / interval))
    # (The night's loop runs with a fine timer slack: eventloop.run.)
    slack = (
        eventloop.fine_timer_slack() if make_loop is eventloop.new_event_loop else contextlib.nullcontext()
    )
    with slack, asyncio.Runner(loop_factory=make_loop) as runner:
        cpu = time.process_time()
        late = sorted(runner.run(_lateness(count, interval, settle)))
        cpu = time.process_time() - cpu
    p50, p99 = late[len(late) // 2], late[int(len(late) * 0.99)]
    return f"{p50 * 1e3:.3f} ms | {p99 * 1e3:.3f} ms | {late[-1] * 1e3:.3f} ms | {cpu / count * 1e6:.0f} us"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m membersync.flows.benchmarks.timers")
    parser.add_argument("--intervals", default="0.02,0.005,0.002", help="seconds between due times")
    parser.add_argument("--seconds", type=float, default=4.0, help="of each measurement")
    args = parser.parse_args(argv)
    loops: list[tuple[str, Callable[[], asyncio.AbstractEventLoop], bool]] = [
        ("asyncio's own", asyncio.new_event_loop, False),
        ("the night's (extract/eventloop.py)", eventloop.new_event_loop, False),
        ("asyncio's own, last 2 ms slept blocking", asyncio.new_event_loop, True),
    ]
    print("| interval | loop | late p50 | late p99 | late max | CPU per wake-up |")  # noqa: T201
    print("|---:|---|---:|---:|---:|---:|")  # noqa: T201
    for interval in (float(x) for x in args.intervals.split(",")):
        for name, make_loop, settle in loops:
            row = measure(make_loop, interval, args.seconds, settle)
            print(f"| {interval * 1e3:g} ms | {name} | {row} |")  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
