"""extract/concurrency.py: the adaptive limit of requests in flight, on a fake clock where time
matters: its slow start, its room for the pace (Little's law), its waiters served by rank."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest
from membersync.extract import constants as K
from membersync.extract.concurrency import AdaptiveConcurrency, InFlightCap, work_started
from membersync.extract.limits import RateLimiter


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def test_case_a_paced_client_keeps_room_for_rate_times_latency() -> None:
    """Once paced, the number in flight never starves the pace (500 req/s at 200 ms needs 100
    in flight): room for rate x latency x CONCURRENCY_HEADROOM (Little's law), up to the maximum."""
    far = AdaptiveConcurrency(128, initial=8)
    far.on_rate_limited()
    far.keep_up(500.0, 0.2)
    assert far.limit == 128  # 152 wanted, the maximum holds
    near = AdaptiveConcurrency(128, initial=8)
    near.keep_up(500.0, 0.02)
    assert near.limit == pytest.approx(500 * 0.02 * K.CONCURRENCY_HEADROOM + 2)
    near.keep_up(500.0, 0.01)
    assert near.limit == pytest.approx(17.0)  # room is kept, never taken back (a cut does that)
    unpaced = AdaptiveConcurrency(128, initial=8)
    unpaced.keep_up(None, 0.2)
    assert unpaced.limit == 8  # unpaced, the concurrency is what limits us: it grows by its own rule
    limiter = RateLimiter(initial=100.0)
    for _ in range(200):
        limiter.on_success(1.0, latency=0.2)
    assert limiter.latency == pytest.approx(0.2, rel=0.01)  # the latency it keeps room for


def test_case_the_concurrency_starts_slow_then_grows_by_windows() -> None:
    """Before the first cut, +1 per success while saturated (doubling every round trip); after
    it, +1 per window."""

    async def go() -> None:
        sem = AdaptiveConcurrency(128, initial=8)
        for _ in range(8):
            await sem.acquire()
        waiting = [asyncio.ensure_future(sem.acquire()) for _ in range(40)]
        await asyncio.sleep(0)
        for _ in range(8):  # every slot taken, requests waiting: each success adds one
            sem.release(success=True)
            await asyncio.sleep(0)
        assert sem.limit == 16 and sem.in_flight == 16
        sem.on_rate_limited()
        assert sem.limit == 12
        for _ in range(8):
            sem.release(success=True)
            await asyncio.sleep(0)
        assert 12 < sem.limit < 13  # +1/limit each
        for waiter in waiting:
            waiter.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)

    run(go())


def test_case_waiters_of_an_earlier_start_go_first_then_in_arrival_order() -> None:
    """A batch's last requests are not queued behind the next batch's first thousands: a free
    slot goes to the earliest-started work's first waiter; cancelled waiters are skipped, and
    with the last live waiter gone the semaphore takes the fast path again."""

    async def go() -> None:
        sem = AdaptiveConcurrency(1, adaptive=False)
        await sem.acquire()  # the one slot is taken: everyone below waits
        served: list[str] = []

        async def request(label: str) -> None:
            await sem.acquire()
            served.append(label)
            sem.release()

        async def work(labels: list[str], yields: int = 0) -> None:
            for _ in range(yields):
                await asyncio.sleep(0)
            await asyncio.gather(*(request(label) for label in labels))

        with work_started():  # the first batch to start asks last ...
            first = asyncio.create_task(work(["a1", "a2"], yields=3))
        with work_started():  # ... after the second
            second = asyncio.create_task(work(["b1", "b2", "b3"]))
        unranked = asyncio.create_task(work(["u"], yields=5))  # outside any start: ahead of all
        with work_started():
            late = asyncio.create_task(work(["c1"]))  # started last
        for _ in range(8):
            await asyncio.sleep(0)
        assert sem.waiting == 7 and served == []
        gone = asyncio.create_task(request("gone"))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        assert sem.waiting == 7  # the cancelled one no longer counts
        sem.release()
        await asyncio.gather(first, second, unranked, late)
        assert served == ["u", "a1", "a2", "b1", "b2", "b3", "c1"]
        assert sem.waiting == 0 and sem.in_flight == 0
        await asyncio.wait_for(sem.acquire(), 1.0)  # the fast path: no dead entry blocks it
        assert sem.in_flight == 1

    run(go())


# --- a server's cap on requests in flight ----------------------------------------------------------


def answered_at(cap: InFlightCap, levels: range, times: int, now: float = 0.0) -> None:
    for _ in range(times):
        for level in levels:
            cap.accepted(level, now)


def test_case_a_cap_is_learned_where_the_server_refuses_what_it_took_one_lower() -> None:
    """Case: a server that takes 4 at once. Answers came at 1..4 on the wire; a 429 at 5 is a
    cap's: the cap is 4, the pace is left alone (True), and a fifth request waits on the wire
    until one of the four is answered."""

    async def go() -> None:
        cap = InFlightCap(128)
        answered_at(cap, range(1, 5), 20)
        assert cap.refused(5, now=1.0) and cap.cap == 4
        levels = [await cap.sent() for _ in range(4)]
        assert levels == [1, 2, 3, 4]
        fifth = asyncio.ensure_future(cap.sent())
        await asyncio.sleep(0)
        assert not fifth.done()
        cap.done()
        assert await fifth == 4 and cap.on_wire == 4

    run(go())


def test_case_a_token_bucket_s_429s_stay_the_pace_s() -> None:
    """Case: a bucket refuses at any level about as often as it takes there: no cap. Neither is
    a 429 at 1 on the wire (a night's first), nor one at a level with none taken below it, nor
    one above refusals at lower levels (a bucket's volley: a 200/s night held at 3 once)."""
    bucket = InFlightCap(128)
    answered_at(bucket, range(1, 8), 20)
    assert not any(bucket.refused(level, now=1.0) for level in (3, 5, 6, 7, 3, 5))
    assert bucket.cap is None
    # An emptied bucket's volley: refusals crowd the evidence at every level, 1 to 12 on the wire;
    # at 5 it refused more than it took and took 4, but it refused below 5 too: the pace's.
    volley = InFlightCap(128)
    answered_at(volley, range(1, 9), 10)
    for _ in range(3):
        for level in range(1, 13):
            assert not volley.refused(level, now=1.0), level
    assert volley.cap is None
    first = InFlightCap(128)
    assert not first.refused(1, now=0.0) and first.cap is None
    assert not first.refused(3, now=0.0) and first.cap is None  # nothing taken at 2


def test_case_a_cap_is_probed_one_higher_now_and_then_and_learned_again() -> None:
    """Case: after CAP_PROBE_SECONDS at a cap of 4 one more goes on the wire; a real cap refuses
    it (the cap is 4 again: one 429 a probe); a mistaken one takes it, and the cap stays lifted."""
    cap = InFlightCap(128)
    answered_at(cap, range(1, 5), 20)
    assert cap.refused(5, now=0.0) and cap.cap == 4
    cap.accepted(4, now=K.CAP_PROBE_SECONDS - 0.1)
    assert cap.cap == 4
    cap.accepted(4, now=K.CAP_PROBE_SECONDS)
    assert cap.cap == 5
    assert cap.refused(5, now=K.CAP_PROBE_SECONDS + 0.1) and cap.cap == 4
    lifted = InFlightCap(128)
    answered_at(lifted, range(1, 5), 20)
    assert lifted.refused(5, now=0.0)
    lifted.accepted(4, now=K.CAP_PROBE_SECONDS)
    answered_at(lifted, range(5, 6), 5, now=K.CAP_PROBE_SECONDS + 0.1)
    assert lifted.cap == 5 and not lifted.refused(5, now=K.CAP_PROBE_SECONDS + 0.2)


def test_the_evidence_is_the_last_answers_only() -> None:
    """What the server did long ago (a night's first seconds, another server's cap) is
    forgotten after CAP_EVIDENCE answers: refusals at 5 then, takes at 5 now."""
    cap = InFlightCap(128)
    answered_at(cap, range(1, 5), 5)
    for _ in range(10):
        cap.refused(5, now=0.0)
    answered_at(cap, range(1, 6), K.CAP_EVIDENCE // 5)
    assert not cap.refused(5, now=1.0)


def test_not_adaptive_learns_no_cap() -> None:
    cap = InFlightCap(128, adaptive=False)
    answered_at(cap, range(1, 5), 20)
    assert not cap.refused(5, now=0.0) and cap.cap is None
