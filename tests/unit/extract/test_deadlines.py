"""extract/deadlines.py: one timer keeps the deadlines of every attempt in flight.

Real event loops and real (short) timeouts. Timing bounds are loose on purpose (shared, noisy
machines): a deadline must not fire early, and must fire (the test does not hang); how late it
fires is asserted only as "within seconds". The client's own stall and trickle cases are in
``test_client_transports.py`` (a server that never answers) and ``test_reliability.py`` (a night
against a server that stalls or trickles).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
from membersync.extract import constants
from membersync.extract.deadlines import Deadlines


class GrowingBody:
    """A body whose bytes arrive every ``every`` s for ``for_s`` s (aiohttp's ``total_bytes``)."""

    def __init__(self) -> None:
        self.total_bytes = 0

    async def grow(self, every: float, for_s: float) -> None:
        end = time.monotonic() + for_s
        while time.monotonic() < end:
            await asyncio.sleep(every)
            self.total_bytes += 1


def test_case_attempt_past_its_deadline_ends_in_timeout_error_not_before() -> None:
    async def scenario() -> float:
        deadlines = Deadlines(read_timeout=None, request_timeout=0.2)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            async with deadlines.attempt():
                await asyncio.sleep(30)
        assert len(deadlines) == 0
        return time.monotonic() - started

    elapsed = asyncio.run(scenario())
    assert 0.2 <= elapsed < 5, elapsed


def test_case_answer_without_headers_is_a_read_timeout() -> None:
    async def scenario() -> float:
        deadlines = Deadlines(read_timeout=0.2, request_timeout=30)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            async with deadlines.attempt():
                await asyncio.sleep(30)  # no headers: reading() never called
        return time.monotonic() - started

    elapsed = asyncio.run(scenario())
    assert 0.2 <= elapsed < 5, elapsed


def test_case_before_the_headers_a_connect_may_take_its_own_timeout_on_top() -> None:
    """aiohttp does not say when a request left; a connect is bounded on its own (sock_connect)."""

    async def scenario() -> float:
        deadlines = Deadlines(read_timeout=0.2, request_timeout=30, connect_timeout=0.3)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            async with deadlines.attempt():
                await asyncio.sleep(30)
        return time.monotonic() - started

    elapsed = asyncio.run(scenario())
    assert 0.5 <= elapsed < 5, elapsed
    with pytest.raises(ValueError, match="timeouts must be > 0"):
        Deadlines(read_timeout=1, request_timeout=1, connect_timeout=-1)


def test_case_body_that_keeps_growing_outlives_the_read_timeout_but_not_the_deadline() -> None:
    async def scenario(request_timeout: float) -> float:
        deadlines = Deadlines(read_timeout=0.2, request_timeout=request_timeout)
        body = GrowingBody()
        started = time.monotonic()
        async with deadlines.attempt() as watch:
            watch.reading(body)
            await body.grow(every=0.02, for_s=0.8)  # 4 read timeouts long, a byte every 20 ms
        return time.monotonic() - started

    assert asyncio.run(scenario(request_timeout=30)) >= 0.8  # ended by itself, not cancelled
    with pytest.raises(TimeoutError):
        asyncio.run(scenario(request_timeout=0.4))  # a trickle is still bounded by the deadline


def test_case_body_that_stops_growing_is_a_read_timeout() -> None:
    async def scenario() -> float:
        deadlines = Deadlines(read_timeout=0.2, request_timeout=30)
        body = GrowingBody()
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            async with deadlines.attempt() as watch:
                watch.reading(body)
                await body.grow(every=0.02, for_s=0.3)
                await asyncio.sleep(30)  # stalled
        return time.monotonic() - started

    elapsed = asyncio.run(scenario())
    assert 0.5 <= elapsed < 5, elapsed  # 0.3 s of growth, then 0.2 s of silence at least


def test_case_attempt_done_in_time_is_never_cancelled_and_the_timer_stops() -> None:
    async def scenario() -> tuple[int, Any]:
        deadlines = Deadlines(read_timeout=0.1, request_timeout=0.1)
        for _ in range(5):
            async with deadlines.attempt():
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # ticks past every deadline the attempts had: nothing left to cancel
        return len(deadlines), deadlines._tick

    assert asyncio.run(scenario()) == (0, None)


def test_case_outside_cancellation_stays_a_cancellation() -> None:
    async def scenario() -> None:
        deadlines = Deadlines(read_timeout=5, request_timeout=5)

        async def attempt() -> None:
            async with deadlines.attempt():
                await asyncio.sleep(30)

        task = asyncio.create_task(attempt())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(deadlines) == 0

    asyncio.run(scenario())


def test_case_a_deadline_and_an_outside_cancellation_together_stay_a_cancellation() -> None:
    """Cancelled from outside in the same moment the deadline expired the attempt: a caller that
    cancels (Ctrl-C, a failing night) must see its cancellation, not a retryable timeout."""

    async def scenario() -> None:
        deadlines = Deadlines(read_timeout=5, request_timeout=5)
        entered = asyncio.Event()

        async def attempt() -> None:
            async with deadlines.attempt() as watch:
                watches.append(watch)
                entered.set()
                await asyncio.sleep(30)

        watches: list[Any] = []
        task = asyncio.create_task(attempt())
        await entered.wait()
        watches[0].expire()  # the deadline's cancellation...
        task.cancel()  # ...and the caller's
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())


def test_case_attempts_after_a_timeout_in_the_same_task_time_out_again_and_finish() -> None:
    """A retry runs in the task whose attempt timed out: the timeout's cancellation is withdrawn
    (the task's count balances), so the next timeout is a timeout again, and an attempt in time
    is not cancelled."""

    async def scenario() -> list[str]:
        deadlines = Deadlines(read_timeout=0.3, request_timeout=0.6)
        outcomes = []
        for sleep_s in (5.0, 5.0, 0.001):
            try:
                async with deadlines.attempt():
                    await asyncio.sleep(sleep_s)
                outcomes.append("done")
            except TimeoutError:
                outcomes.append("timeout")
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        return outcomes

    assert asyncio.run(scenario()) == ["timeout", "timeout", "done"]


async def _expired_attempt(deadlines: Deadlines, body: Any) -> None:
    """An attempt whose deadline expires while it waits, then ``body(cancelled_error)``."""
    async with deadlines.attempt() as watch:
        asyncio.get_running_loop().call_soon(watch.expire)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError as cancelled:
            body(cancelled)


def test_case_an_expired_attempt_that_swallows_its_cancellation_ends_normally_and_balanced() -> None:
    """An attempt's own code caught the deadline's cancellation and returned: no TimeoutError out
    of thin air, and the task is no longer marked as being cancelled (asyncio.Timeout's way)."""

    async def scenario() -> int:
        await _expired_attempt(Deadlines(read_timeout=5, request_timeout=5), lambda _: None)
        task = asyncio.current_task()
        assert task is not None
        return task.cancelling()

    assert asyncio.run(scenario()) == 0


def test_case_an_expired_attempt_that_fails_otherwise_keeps_its_own_error() -> None:
    """The deadline fired, but the attempt ended in an error of its own: that error comes out,
    not a TimeoutError, and the task's cancellation count balances."""

    def fail(_: BaseException) -> None:
        raise ValueError("the attempt's own error")

    async def scenario() -> int:
        with pytest.raises(ValueError, match="own error"):
            await _expired_attempt(Deadlines(read_timeout=5, request_timeout=5), fail)
        task = asyncio.current_task()
        assert task is not None
        return task.cancelling()

    assert asyncio.run(scenario()) == 0


def test_case_a_cancellation_asked_before_the_attempt_is_not_the_deadlines() -> None:
    """A task already asked to cancel (caught, not withdrawn: cancelling() is 1) starts an
    attempt that times out: that is a TimeoutError, and the earlier request stays pending."""

    async def scenario() -> int:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):  # caught, not uncancelled
            await asyncio.sleep(0)
        assert task.cancelling() == 1
        with pytest.raises(TimeoutError):
            async with Deadlines(read_timeout=0.2, request_timeout=5).attempt():
                await asyncio.sleep(30)
        return task.cancelling()

    assert asyncio.run(scenario()) == 1


def test_case_a_watch_is_entered_once_and_expiring_it_after_its_exit_does_nothing() -> None:
    async def scenario() -> int:
        watch = Deadlines(read_timeout=5, request_timeout=5).attempt()
        async with watch:
            pass
        watch.expire()  # late: the attempt is over, nothing to cancel
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="entered once"):
            async with watch:
                pass
        task = asyncio.current_task()
        assert task is not None
        return task.cancelling()

    assert asyncio.run(scenario()) == 0


def test_case_many_attempts_arm_one_timer_not_one_each() -> None:
    """The point of the module: 500 attempts (100 at a time) schedule a few ticks, not 500 timers."""
    loop = asyncio.new_event_loop()
    armed = []
    call_at = loop.call_at

    def counting_call_at(when: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        armed.append(callback)
        return call_at(when, callback, *args, **kwargs)

    loop.call_at = counting_call_at  # type: ignore[method-assign]  # call_later goes through it

    async def scenario(deadlines: Deadlines) -> None:
        async def one() -> None:
            async with deadlines.attempt():
                await asyncio.sleep(0)

        for _ in range(5):
            await asyncio.gather(*(one() for _ in range(100)))

    deadlines = Deadlines(read_timeout=30, request_timeout=90)
    try:
        loop.run_until_complete(scenario(deadlines))
    finally:
        loop.close()
    assert deadlines.tick == constants.DEADLINE_TICK
    assert 1 <= len(armed) <= 3, armed  # the tick (armed once: the run is shorter than a tick)


def test_case_a_new_event_loop_gets_its_own_tick() -> None:
    """A client used from a second ``asyncio.run`` (a test's, a CLI's) still keeps deadlines."""
    deadlines = Deadlines(read_timeout=None, request_timeout=0.2)

    async def quick() -> None:
        async with deadlines.attempt():
            pass  # the tick armed on this loop outlives it

    async def stalled() -> None:
        async with deadlines.attempt():
            await asyncio.sleep(30)

    asyncio.run(quick())
    with pytest.raises(TimeoutError):
        asyncio.run(asyncio.wait_for(stalled(), 10))  # wait_for: a hang fails, not blocks


class BrokenBody:
    """A body whose progress can be read once (by ``reading``); every later read raises."""

    def __init__(self) -> None:
        self.reads = 0

    @property
    def total_bytes(self) -> int:
        self.reads += 1
        if self.reads > 1:
            raise RuntimeError("broken body")
        return 0


def test_case_an_error_in_a_tick_does_not_stop_later_deadlines() -> None:
    async def scenario() -> list[str]:
        errors: list[str] = []
        asyncio.get_running_loop().set_exception_handler(
            lambda _loop, ctx: errors.append(str(ctx["exception"]))
        )
        deadlines = Deadlines(read_timeout=0.2, request_timeout=30)
        async with deadlines.attempt() as watch:
            watch.reading(BrokenBody())  # type: ignore[arg-type]
            await asyncio.sleep(0.2)  # a tick reads its progress, and raises
        with pytest.raises(TimeoutError):
            async with deadlines.attempt():
                await asyncio.sleep(30)  # still a read timeout: the ticks went on
        return errors

    errors = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert errors and set(errors) == {"broken body"}  # each tick while it was in flight raised


@pytest.mark.parametrize("read, whole", [(0, 1), (1, 0), (-1, 1)])
def test_case_timeouts_must_be_positive(read: float, whole: float) -> None:
    with pytest.raises(ValueError, match="timeouts must be > 0"):
        Deadlines(read_timeout=read, request_timeout=whole)
